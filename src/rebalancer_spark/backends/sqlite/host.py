"""Which host a process runs on: the SQLite file is one host's store.

A lease deadline in the file is a reading of this host's boot clock, which means nothing on
another host, so every session records the :func:`host_id` of the process that joined, and a
member of a second host on the same file is refused (see :mod:`.sessions`).

``REBALANCER_SPARK_HOST_ID`` overrides the identity. It is meant for tests (two "hosts" on one
machine) and for containers that share one kernel (one boot clock) but have their own machine
ids: give them the same value to let them share a file. Never give two real hosts the same
value: their lease deadlines would be compared across clocks.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["HOST_ID_ENV", "host_id"]

HOST_ID_ENV = "REBALANCER_SPARK_HOST_ID"
"""The environment variable that overrides :func:`host_id` (tests, containers of one kernel)."""

_MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def host_id() -> str:
    """``hostname/machine-id`` (just the hostname where no machine id is found), or the value
    of ``REBALANCER_SPARK_HOST_ID`` when set."""
    override = os.environ.get(HOST_ID_ENV, "").strip()
    if override:
        return override
    name = socket.gethostname()
    for path in _MACHINE_ID_FILES:
        try:
            machine = Path(path).read_text().strip()
        except OSError:
            continue
        if machine:
            return f"{name}/{machine}"
    return name
