"""rebalancer-spark: Kafka-style consumer groups for anything a Spark job reads.

The public surface is small and pinned by a test; see the README for a tour.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if sys.version_info < (3, 11):  # noqa: UP036 - a clear error on 3.10 (tests/test_packaging.py)
    raise ImportError(
        f"rebalancer-spark needs Python 3.11 or newer (enum.StrEnum, tomllib), this is "
        f"{sys.version.split()[0]} at {sys.executable}: run it with python3.11+ (pip refuses to "
        "install it on older ones: requires-python >= 3.11)"
    )

from rebalancer_spark.core.config import MemberConfig, ProtocolName
from rebalancer_spark.core.errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    ControlConflict,
    CorruptStateError,
    FencedError,
    MemberFailed,
    MemberIdInUse,
    RebalancerError,
    SessionExpired,
    SourceError,
)
from rebalancer_spark.core.events import EventKind, OwnershipEvent
from rebalancer_spark.core.model import Resource
from rebalancer_spark.member import Member, MemberState, OwnedResource, join

if TYPE_CHECKING:
    from rebalancer_spark.spark.source import AssignedSource

__all__ = [
    "BackendError",
    "BackendUnavailable",
    "ConfigurationError",
    "ControlConflict",
    "CorruptStateError",
    "EventKind",
    "FencedError",
    "Member",
    "MemberConfig",
    "MemberFailed",
    "MemberIdInUse",
    "MemberState",
    "OwnedResource",
    "OwnershipEvent",
    "ProtocolName",
    "RebalancerError",
    "Resource",
    "SessionExpired",
    "SourceError",
    "assigned_sources",
    "join",
]

__version__ = "0.1.0"


def assigned_sources() -> list[AssignedSource]:
    """What this Spark driver's job owns now, answered from memory: one source per resource,
    each with its epoch, ``next_batch(spark)`` and a fenced ``commit()``; the usual loop is
    :func:`rebalancer_spark.spark.batches`. The node must have been started with
    :func:`rebalancer_spark.spark.start` (the jobs in ``jobs/`` do)."""
    from rebalancer_spark.spark.session import assigned_sources as current

    return current()
