"""How the library's entry points end their process.

Arrow's and delta-rs's native thread pools can abort the interpreter's own teardown after all
the work succeeded (``terminate called without an active exception``, exit -6: a worker still
running when C++ destructors run; apache/arrow#34314, delta-rs#2184). Intermittent, and it
turns a good run into a failed exit code. So once an entry point (the CLI, the jobs, member
processes, the demo) has finished its work and closed everything it opened, it flushes its
output and ends the process at once with its exit code, skipping that teardown.

Signals that ask an entry point to stop set an event (:func:`stop_on_signals`), from a thread
of their own: a handler runs on the main thread between two bytecodes, possibly inside that
thread's own ``Event.wait``, while it holds the event's internal lock, and ``Event.set`` there
waits for that lock for ever (a member process sent SIGTERM hung so in a CI run).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import NoReturn

__all__ = ["MEMBER_FAILED_EXIT", "exit_process", "stop_on_signals"]

MEMBER_FAILED_EXIT = 4
"""The exit code of a job (``jobs/``) or member process whose member thread failed
(:class:`~rebalancer_spark.core.errors.MemberFailed`): the member left its group for good, so
the process ends for its supervisor to start it again."""


def exit_process(code: int) -> NoReturn:
    """Flush stdout, stderr and logging, then end the process with ``code``."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe
            stream.flush()
    os._exit(code)


def stop_on_signals(stop: threading.Event, *signals: signal.Signals) -> None:
    """Set ``stop`` when one of ``signals`` arrives, from a new thread (see the module
    docstring); call from the main thread."""

    def handler(signum: int, frame: object) -> None:
        threading.Thread(target=stop.set, name="stop-on-signal", daemon=True).start()

    for sig in signals:
        signal.signal(sig, handler)
