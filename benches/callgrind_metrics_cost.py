"""Instructions an exchange costs with and without a Prometheus scrape per 128 MB written.

Wall-clock throughput on the shared 2-core machine varies by far more than the 2 % this
should show, so this counts instructions instead (valgrind's callgrind: the same count for the
same run whatever else the machine does). A serialized in-process exchange of 256 batches
(~1.76 MB each) runs three ways; the difference of the totals is the cost:

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.off python benches/callgrind_metrics_cost.py off
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.on  python benches/callgrind_metrics_cost.py on
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.0   python benches/callgrind_metrics_cost.py off 0

``on`` renders the whole Prometheus page (``generate_latest`` over ``creditflow.prometheus``)
once per 128 MB written, about every 100 ms at the remote 1->1 rate; ``off 0`` is start-up
alone. Cost of collection = (on - off) / (off - start-up).
"""

import sys
import threading

import numpy as np
import pyarrow as pa
from prometheus_client import CollectorRegistry, generate_latest

import creditflow as cf
import creditflow.prometheus as cfp

scrape = sys.argv[1] == "on"
ROWS = 65_536
batch = pa.record_batch(
    {
        "k": np.arange(ROWS, dtype=np.int64),
        "v": np.arange(ROWS, dtype=np.float64),
        "s": pa.array([f"row-{i % 1000}" for i in range(ROWS)]),
    }
)
BATCHES = int(sys.argv[2]) if len(sys.argv) > 2 else 256  # ~1.76 MB each
SCRAPE_EVERY = max(1, (128 << 20) // batch.nbytes)

with cf.NetworkEnvironment(memory="64MiB", local_handoff=False) as env:
    registry = CollectorRegistry()
    cfp.register(env, registry)
    part = env.create_partition("p", 1)
    gate = env.create_input_gate([cf.ChannelSpec(env.address, "p", 0)])

    def read() -> None:
        for _ in gate:
            pass

    t = threading.Thread(target=read)
    t.start()
    scrapes = 0
    with cf.RecordWriter(part) as w:
        for i in range(BATCHES):
            w.write(batch)
            if scrape and i % SCRAPE_EVERY == SCRAPE_EVERY - 1:
                assert b"creditflow_" in generate_latest(registry)
                scrapes += 1
    t.join()
    print(f"batches={BATCHES} bytes={BATCHES * batch.nbytes} scrapes={scrapes} every={SCRAPE_EVERY}")
