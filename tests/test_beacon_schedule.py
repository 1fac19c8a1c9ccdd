"""The beacon's schedule, sans I/O (dafka/discovery/schedule.py): when a peer beacons and reads the tower's
socket, driven by a made-up clock and made-up reads, with no tower."""

from __future__ import annotations

import pytest

from dafka.discovery.schedule import ADVANCE, DRIFT, POSTPONE, READ_EVERY, WELCOME_POLL, BeaconSchedule

T0 = 1000.0


def settled() -> BeaconSchedule:
    """A schedule that has beaconed once at T0 and was replayed to (settled)."""
    schedule = BeaconSchedule(T0, 1.0)
    assert schedule.beacon_due(T0, True)
    schedule.on_read(T0, 0, False, True, True)
    assert schedule.settled
    return schedule


def test_the_first_beacon_goes_at_once_then_one_an_interval():
    schedule = BeaconSchedule(T0, 1.0)
    assert schedule.beacon_due(T0, False)
    assert not schedule.beacon_due(T0 + 0.99, False)
    assert schedule.beacon_due(T0 + 1.0, False) and schedule.next_beacon == pytest.approx(T0 + 2.0)


def test_a_peer_we_did_not_know_makes_our_beacon_go_at_once():
    schedule = BeaconSchedule(T0, 1.0)
    assert schedule.beacon_due(T0, False)
    schedule.on_read(T0 + 0.3, 1, True, False, False)
    assert schedule.beacon_due(T0 + 0.3, False)
    schedule.beacon_now(T0 + 0.5)  # (a tower subscribed to our beacons)
    assert schedule.beacon_due(T0 + 0.5, False)


def test_settled_once_replayed_or_two_intervals_after_a_reference_tower_welcomed_us():
    schedule = BeaconSchedule(T0, 1.0)
    schedule.on_read(T0 + 1.0, 0, False, False, True)
    assert not schedule.settled
    schedule.on_read(T0 + 2.01, 0, False, False, True)
    assert schedule.settled and schedule.expire_ahead() == READ_EVERY
    assert BeaconSchedule(T0, 1.0).expire_ahead() == 0.0


def test_beacons_that_come_faster_than_read_every_are_read_in_batches_once_settled():
    schedule = BeaconSchedule(T0, 1.0)
    schedule.on_read(T0 + 0.10, 1, False, False, False)
    schedule.on_read(T0 + 0.11, 1, False, False, False)
    assert schedule.read_due(T0 + 0.11)  # not settled: every beacon is read as it comes
    schedule = settled()
    schedule.on_read(T0 + 0.10, 1, False, True, True)
    schedule.on_read(T0 + 0.11, 1, False, True, True)
    assert not schedule.read_due(T0 + 0.12) and schedule.read_due(T0 + 0.11 + READ_EVERY)
    wake, tower_wakes = schedule.wake(T0 + 0.12, expiry=T0 + 0.13, welcomed=True)
    assert not tower_wakes and wake == pytest.approx(T0 + 0.11 + READ_EVERY)  # (expiry waits for the read)
    schedule.on_read(T0 + 0.20, 1, False, True, True)
    schedule.on_read(T0 + 0.2 + READ_EVERY / 100, 1, False, True, True)  # (parts of one burst: no wait)
    assert schedule.read_due(T0 + 0.2 + READ_EVERY / 100)
    schedule.read_now(T0 + 0.21)  # (a new profile)
    assert schedule.read_due(T0 + 0.21)


def test_a_beacon_due_soon_goes_out_with_a_burst():
    schedule = settled()
    burst = T0 + 1.0 - ADVANCE / 2  # due within ADVANCE of an interval
    schedule.on_read(burst, 5, False, True, True)
    assert schedule.beacon_due(burst, True)
    schedule = settled()
    early = T0 + 1.0 - 2 * ADVANCE
    schedule.on_read(early, 5, False, True, True)
    assert not schedule.beacon_due(early, True)


def test_a_beacon_due_shortly_before_the_next_burst_waits_for_it():
    schedule = settled()
    schedule.on_read(T0 + 0.4, 5, False, True, True)  # a burst: the next one is expected at T0 + 1.4
    due = T0 + 1.0
    assert 1.4 - 1.0 <= POSTPONE
    assert not schedule.beacon_due(due, True) and schedule.postponed
    assert schedule.next_beacon == pytest.approx(T0 + 1.4 + READ_EVERY)  # (if no burst comes)
    schedule.on_read(T0 + 1.4, 5, False, True, True)  # it came: out with it
    assert schedule.beacon_due(T0 + 1.4, True) and not schedule.postponed


def test_a_beacon_out_of_step_drifts_slower_until_in_step():
    schedule = settled()
    schedule.on_read(T0 + 0.7, 5, False, True, True)  # next burst at T0 + 1.7: 0.7 ahead of us, past POSTPONE
    assert schedule.beacon_due(T0 + 1.0, True)
    assert schedule.next_beacon == pytest.approx(T0 + 1.0 + DRIFT)
    reference = BeaconSchedule(T0, 1.0)  # behind reference towers (no replay): neither postponed nor drifting
    assert reference.beacon_due(T0, False)
    reference.on_read(T0 + 2.01, 0, False, False, True)  # (settled two intervals after the welcome)
    assert reference.beacon_due(T0 + 2.01, False)
    reference.on_read(T0 + 2.7, 5, False, False, True)
    assert reference.beacon_due(T0 + 3.01, False) and reference.next_beacon == pytest.approx(T0 + 4.01)


def test_no_tower_answers_is_said_after_2_s_then_every_10_s_and_never_once_welcomed():
    schedule = BeaconSchedule(T0, 1.0)
    assert not schedule.warning_due(T0 + 1.9, False)
    assert schedule.warning_due(T0 + 2.0, False)
    assert not schedule.warning_due(T0 + 11.9, False) and schedule.warning_due(T0 + 12.0, False)
    assert not schedule.warning_due(T0 + 30.0, True)


def test_it_sleeps_until_the_next_beacon_or_expiry_and_polls_for_the_welcome():
    schedule = settled()
    wake, tower_wakes = schedule.wake(T0 + 0.2, expiry=T0 + 0.5, welcomed=True)
    assert tower_wakes and wake == pytest.approx(T0 + 0.5)
    wake, _ = schedule.wake(T0 + 0.2, expiry=None, welcomed=True)
    assert wake == pytest.approx(T0 + 1.0)
    wake, _ = schedule.wake(T0 + 0.2, expiry=None, welcomed=False)
    assert wake == pytest.approx(T0 + 0.2 + WELCOME_POLL)
