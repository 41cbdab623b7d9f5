"""Exit statuses, the epilog that states them, and the one-line error every failure prints."""

from __future__ import annotations

import sys
from typing import NoReturn

from rebalancer_spark.core.urls import redact_url

__all__ = [
    "EPILOG",
    "EXIT_BAD_INPUT",
    "EXIT_CHECK_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_TIMEOUT",
    "PROG",
    "fail",
]

PROG = "rebalancer-spark"
EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_REFUSED, EXIT_TIMEOUT = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130
EPILOG = (
    "exit status: 0 ok; 1 a check failed (audit verify found two owners at once or, with "
    "--output, an output commit breaking a rule); 2 bad input, a store that does not exist "
    "or is unreachable, or a group the store does not know; 3 refused by the group's state "
    "(rebalance or drain while paused); 4 timed out (drain still owning after --timeout). "
    "--backend defaults to groups.db in $REBALANCER_HOME (default "
    "~/.local/state/rebalancer-spark)."
)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print ``message`` as one line on standard error (passwords in URLs as ``***``) and
    exit with ``code``."""
    print(f"{PROG}: error: {redact_url(' '.join(message.split()))}", file=sys.stderr)
    raise SystemExit(code)
