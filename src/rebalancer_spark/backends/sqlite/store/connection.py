"""Opening the database file, taking its write lock, and turning :mod:`sqlite3` errors into
the library's errors.

The parser of the URL options (``poll``, ``busy_timeout``, declared in :mod:`.url`); every
connection is in autocommit mode (``isolation_level=None``) so that transactions are begun
explicitly, and may be used from any thread (callers serialise their use).

The write lock is waited for by :func:`begin_write`, not by SQLite's own busy handler: that
handler sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50 and then 100 ms between tries, whether
or not the lock came free meanwhile, so a writer that lost one race sleeps tens of ms behind a
transaction of a few, and one that keeps losing waits for seconds while others write (measured
on this design: two processes, one writing 4 ms every 5 ms, the other's wait for the lock had a
90th percentile of 53 ms and a maximum of 1.5-2.6 s). :func:`begin_write` tries again after
0.2 ms, doubling up to :data:`WRITE_POLL_MAX`: the same measurement gave 7-10 ms and 14-66 ms.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable

from rebalancer_spark.backends.sqlite.url import OPTIONS
from rebalancer_spark.core.errors import BackendUnavailable, CorruptStateError

__all__ = [
    "OPTIONS",
    "WRITE_POLL_MAX",
    "begin_write",
    "connect",
    "open_database",
    "positive",
    "translate",
]

WRITE_POLL_MAX = 0.002
"""Longest pause, in seconds, between two tries for the write lock (:func:`begin_write`)."""


def positive(name: str) -> Callable[[str], float]:
    """A parser for the URL option ``name``: a positive, finite number of seconds."""

    def parse(text: str) -> float:
        value = float(text)
        if not value > 0 or value == float("inf"):
            raise ValueError(f"{name} must be a positive number of seconds")
        return value

    return parse


def connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    """A plain connection to ``path``, waiting up to ``busy_timeout`` s for a lock."""
    return sqlite3.connect(
        path,
        timeout=busy_timeout,
        isolation_level=None,
        check_same_thread=False,
    )


def open_database(path: str, busy_timeout: float) -> sqlite3.Connection:
    """The backend's connection: creates the directory, and sets WAL and ``synchronous=FULL``."""
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        conn = connect(path, busy_timeout)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
    except (OSError, sqlite3.Error) as exc:
        raise translate(exc, path, busy_timeout) from None
    return conn


def begin_write(
    conn: sqlite3.Connection,
    busy_timeout: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """``BEGIN IMMEDIATE`` on ``conn``: take the file's write lock, trying again after 0.2 ms,
    doubling up to :data:`WRITE_POLL_MAX` (see the module docstring), for up to
    ``busy_timeout`` seconds; past it, SQLite's ``database is locked`` error is raised
    (:func:`translate` words it). The connection's own busy timeout, which its reads keep, is
    set aside meanwhile. ``sleep`` pauses between tries."""
    deadline = time.monotonic() + busy_timeout
    pause = 0.0002
    conn.execute("PRAGMA busy_timeout=0")
    try:
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() >= deadline:
                    raise
            sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
            pause = min(pause * 2, WRITE_POLL_MAX)
    finally:
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


def translate(exc: BaseException, path: str, busy_timeout: float) -> Exception:
    """The library's error for ``exc`` raised while using the database at ``path``."""
    text = str(exc)
    where = f"SQLite database {path!r}"
    if isinstance(exc, sqlite3.DatabaseError) and ("not a database" in text or "malformed" in text):
        return CorruptStateError(
            f"{where} is damaged or is not an SQLite file ({text}): move it away or use "
            "another sqlite:/// path"
        )
    if "locked" in text or "busy" in text:
        return BackendUnavailable(
            f"{where} stayed locked by another process for over {busy_timeout:g} s "
            f"({text}): check for a stuck process, or raise ?busy_timeout= in the URL"
        )
    return BackendUnavailable(
        f"{where} cannot be opened or written ({text}): check that the directory exists "
        "and is writable by this user, or point --backend at a writable sqlite:/// path"
    )
