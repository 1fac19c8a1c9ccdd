"""The survey behind ``dafka status`` and the mirror's topic discovery, in process."""

from __future__ import annotations

import threading

from helpers import loopback_config, wait_for
from dafka import Producer
from dafka.store import Store
from dafka.discovery.survey import StatusPeer


def test_a_peer_that_leaves_mid_survey_is_dropped_and_the_others_are_still_read(tower, tmp_path):
    config = loopback_config(tower, **{"beacon/interval": 100, "beacon/timeout": 500})
    with Store(config, db=str(tmp_path / "db")):
        producer = Producer("survey", config)
        producer.send(b"x")
        producer.flush(timeout=10)
        peer = StatusPeer(config, None)
        try:
            peer.start()
            wait_for(lambda: (peer.run(0.05), producer.address in peer.survey.peers.values())[1], 10,
                     what="the survey meets the producer")
            # The producer leaves while the survey runs: its SUB is closed, and only its own.
            leaving = threading.Timer(0.2, producer.close)
            leaving.start()
            peer.run(2.0)
            leaving.join()
            assert producer.address not in peer.survey.peers.values()
            assert len(peer.subs) == len(peer.survey.peers) >= 2  # the store's reader and writer
            peer.get_heads()
            wait_for(lambda: (peer.run(0.05), peer.survey.store_heads)[1], 10, what="the store's heads")
            assert peer.survey.store_heads[("survey", producer.address)]
        finally:
            peer.close()
