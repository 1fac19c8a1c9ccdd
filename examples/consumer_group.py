"""A consumer group: two members share the partitions of a topic, each
partition read by one of them, and commits go to the group's offsets topic.

    python examples/consumer_group.py
"""

from __future__ import annotations

import time

from local_cluster import local_cluster

from dafka import Consumer, Producer


def main() -> None:
    with local_cluster() as config:
        producers = [Producer("clicks", config) for _ in range(4)]  # four partitions
        for i, producer in enumerate(producers):
            for n in range(25):
                producer.send(f"partition {i} click {n}".encode())
        for producer in producers:
            producer.flush(timeout=10)
        member_config = dict(config, **{"consumer/offset/reset": "earliest"})
        members = [Consumer("clicks", config=member_config, group="dashboards") for _ in range(2)]
        seen: set[tuple[str, int]] = set()  # (partition, offset): a handover may deliver a record twice
        read = [0, 0]
        deadline = time.monotonic() + 60
        while len(seen) < 100 and time.monotonic() < deadline:
            for index, member in enumerate(members):
                records = member.consume(500, timeout=0.1)
                read[index] += len(records)
                seen.update((record.partition, record.offset) for record in records)
        for index, member in enumerate(members):
            partitions = sorted(partition[:8] for _, partition in member.assignment())
            print(f"member {index} reads partitions {partitions} and got {read[index]} records")
            member.commit()
            member.close()
        for producer in producers:
            producer.close()
        assert len(seen) == 100, len(seen)


if __name__ == "__main__":
    main()
