"""How the library's entry points end their process.

Arrow's and delta-rs's native thread pools can abort the interpreter's own teardown after all
the work succeeded (``terminate called without an active exception``, exit -6: a worker still
running when C++ destructors run; apache/arrow#34314, delta-rs#2184). Intermittent, and it
turns a good run into a failed exit code. So once an entry point (the CLI, the jobs, member
processes, the demo) has finished its work and closed everything it opened, it flushes its
output and ends the process at once with its exit code, skipping that teardown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn

__all__ = ["exit_process"]


def exit_process(code: int) -> NoReturn:
    """Flush stdout, stderr and logging, then end the process with ``code``."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe
            stream.flush()
    os._exit(code)
