"""A consumer outside Spark (tests/test_spark_exchange.py, tests/test_multihost.py): opens a
creditflow Receiver (on ``--bind``, with TLS from ``--tls CERT KEY CA``), prints its address and
secret as one JSON line, reads what the driver sends at a throttled pace, and writes a JSON
report (rows, distinct ids, sum of ids, seconds) to --out."""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import creditflow as cf
from creditflow.spark import Receiver


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--delay", type=float, default=0.01, help="seconds to sleep per batch (the throttle)")
    ap.add_argument("--bind", default="127.0.0.1", help="the host the receiver listens on")
    ap.add_argument("--tls", nargs=3, metavar=("CERT", "KEY", "CA"), help="TLS files (mutual TLS)")
    args = ap.parse_args()
    tls = cf.TLSConfig(*args.tls) if args.tls else None
    with Receiver(memory="8MiB", max_queued=2, timeout=120, bind=args.bind, tls=tls) as rx:
        print(json.dumps({"address": rx.address, "secret": rx.secret}), flush=True)
        start = time.monotonic()
        ids = []
        for batch in rx:
            ids.append(batch.column("id").to_numpy())
            time.sleep(args.delay)
        all_ids = np.concatenate(ids) if ids else np.array([], dtype=np.int64)
        report = {
            "rows": int(len(all_ids)),
            "unique_ids": int(len(np.unique(all_ids))),
            "id_sum": int(all_ids.sum()),
            "seconds": time.monotonic() - start,
        }
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    sys.exit(main())
