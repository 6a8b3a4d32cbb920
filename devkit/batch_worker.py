"""The local stack's batch worker: `python -m devkit.batch_worker` (started by `make up`).

A loop over the open batches of the local SQLite store (GATEWAY_SQLITE_PATH), on the same
gateway function code as the local API (`gateway.functions.batch_worker`), one line at a time:
the scorer's line holds at most one of its places at once, whatever the number of batches.
It can be killed at any moment and started again: the ledger says where each batch stopped,
and a batch held by a worker that died is taken over when its lease lapses (`--lease-s`).
SIGTERM or Ctrl-C stops it after the line it is running, so that line settles as usual.
Files and uploads past their expiry are removed once a minute.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
import uuid

log = logging.getLogger("gateway.batches.local")
SWEEP_EVERY_S = 60.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.batch_worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--poll-s", type=float, default=0.5, help="how often an idle worker looks for work")
    parser.add_argument("--lease-s", type=float, default=None,
                        help="how long a batch stays with this worker after its last step, another taking it then"
                             " (default: longer than any line may take)")
    args = parser.parse_args(argv)
    from gateway.functions.batch_worker import batch_store, build_worker, work_once
    from gateway.functions.handler import build_function
    from gateway.observability import configure_logging

    configure_logging()
    function = build_function()
    store = batch_store(function)
    worker = build_worker(function, owner=f"local-{os.getpid()}-{uuid.uuid4().hex[:8]}", lease_s=args.lease_s)
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda signum, frame: worker.stopping.set())
    print("batch worker ready", flush=True)
    swept = 0.0
    while not worker.stopping.is_set():
        if time.time() - swept > SWEEP_EVERY_S:
            swept = time.time()
            store.delete_expired(swept)
        started = time.monotonic()
        work_once(worker, store)
        if time.monotonic() - started < args.poll_s / 10:
            worker.stopping.wait(args.poll_s)  # nothing ran: look again soon
    return 0


if __name__ == "__main__":
    sys.exit(main())
