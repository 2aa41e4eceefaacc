"""A dispatching process for the concurrency tests: the dispatcher's ``tick`` over and
over (materialise, claim, send, record), configured from the environment like any portal
process, with small batches so a campaign of a few thousand recipients is materialised in
many transactions. ``python -m tests.campaigns.dispatch_loop MATERIALISE_BATCH SEND_BATCH``;
SIGTERM lets the current batch finish and stops.
"""

from __future__ import annotations

import signal
import sys
import threading


def main() -> int:
    materialise_batch, send_batch = (int(arg) for arg in sys.argv[1:3])
    from app import app
    from portal.delivery.jobs import close_dispatcher, dispatcher_for

    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    dispatcher = dispatcher_for(app)
    dispatcher.settings.materialise_batch = materialise_batch
    dispatcher.settings.batch_size = send_batch
    sys.stdout.write("dispatching\n")
    sys.stdout.flush()
    try:
        while not stopping.is_set():
            dispatcher.tick(stop=stopping)
            stopping.wait(0.01)
    finally:
        close_dispatcher(app)
    return 0


if __name__ == "__main__":
    sys.exit(main())
