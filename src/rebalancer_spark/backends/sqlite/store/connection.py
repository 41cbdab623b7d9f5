"""Opening the database file and turning :mod:`sqlite3` errors into the library's errors.

The parser of the URL options (``poll``, ``busy_timeout``, declared in :mod:`.url`); every
connection is in autocommit mode (``isolation_level=None``) so that transactions are begun
explicitly, and may be used from any thread (callers serialise their use).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable

from rebalancer_spark.backends.sqlite.url import OPTIONS
from rebalancer_spark.core.errors import BackendUnavailable, CorruptStateError

__all__ = ["OPTIONS", "connect", "open_database", "positive", "translate"]


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
