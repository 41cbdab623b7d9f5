"""What a member falls back on when it is not told: a member id made from the host name and
process id, and one SQLite store per user and host."""

from __future__ import annotations

import os
import re
import socket
import uuid

from rebalancer_spark.backends.registry import default_store_url

__all__ = ["default_backend_url", "generated_member_id"]


def generated_member_id() -> str:
    """``HOST-PID-RANDOM``: unique per run, so a restarted member is a new (dynamic) member."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:40].strip(".-") or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def default_backend_url() -> str:
    """``sqlite:///`` in ``$REBALANCER_HOME`` (default ``~/.local/state/rebalancer-spark``):
    one file shared by every job of the user on this host."""
    home = os.environ.get("REBALANCER_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state", "rebalancer-spark"
    )
    return default_store_url(os.path.abspath(home))
