"""Prometheus metrics of an application's own peers: dafka.metrics reads
their counters at each scrape (nothing is counted per record for it).

    python examples/metrics.py [--port 9464] [--seconds 0]

serves http://127.0.0.1:PORT/metrics while a producer and a consumer work;
``prometheus.yml`` beside this file scrapes it, and ``grafana-dashboard.json``
charts it.  With --seconds 0 it scrapes itself once, prints a few lines and
exits (what the tests run).
"""

from __future__ import annotations

import argparse
import time
import urllib.request

from local_cluster import local_cluster

from dafka import Consumer, Producer, metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="HTTP port (default: one the kernel picks)")
    parser.add_argument("--seconds", type=float, default=0, help="keep serving this long (0: scrape once, exit)")
    args = parser.parse_args()
    with local_cluster() as config:
        with Producer("metered", config) as producer, \
                Consumer("metered", config=dict(config, **{"consumer/offset/reset": "earliest"})) as consumer:
            metrics.register(producer, consumer)
            server = metrics.serve(args.port, "127.0.0.1")
            port = server.server_port
            print(f"metrics on http://127.0.0.1:{port}/metrics")
            deadline = time.monotonic() + args.seconds
            delivered = 0
            while True:
                producer.send(b"x" * 100)
                delivered += len(consumer.consume(500, timeout=0.01))
                if delivered >= 100 and time.monotonic() >= deadline:
                    break
            producer.flush(timeout=10)
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            shown = [line for line in text.splitlines() if line.startswith(("dafka_records_published_total",
                                                                            "dafka_records_delivered_total"))]
            print("\n".join(shown))
            assert shown, "no dafka metrics scraped"


if __name__ == "__main__":
    main()
