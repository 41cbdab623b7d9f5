"""Parse, dispatch, and turn the library's errors into one line and an exit status."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from rebalancer_spark.cli.exits import EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, fail
from rebalancer_spark.cli.parser import build_parser
from rebalancer_spark.core.errors import RebalancerError
from rebalancer_spark.member.control import ControlRefused
from rebalancer_spark.shutdown import exit_process

__all__ = ["main", "run"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: the command line); return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces the closed stdout
        return EXIT_OK
    except ControlRefused as exc:
        fail(str(exc), EXIT_REFUSED)
    except RebalancerError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return status


def run() -> NoReturn:
    """The ``rebalancer-spark`` console script: :func:`main`, then end the process without
    the native teardown that can abort it (see :mod:`rebalancer_spark.shutdown`) — also when
    it ends by ``SystemExit`` (an error, ``--help``): once deltalake has been loaded, a normal
    interpreter exit can abort with SIGABRT instead of the exit code."""
    # kazoo's connection retries are not the command's output (set here, not in main(), so
    # that main() called in a process of one's own leaves its logging alone).
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    try:
        code = main()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    exit_process(code)
