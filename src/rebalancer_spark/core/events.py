"""Ownership events: the trail every member leaves, one event per change of ownership.

The member node emits an :class:`OwnershipEvent` to each configured sink when it acquires,
releases or loses a resource, and when a commit of its is fenced. The Delta audit table and
the test suite's member logs are both sinks. ``at`` is when ownership really began or ended:
for a ``lost`` event found late (a process paused past its lease), it is the moment the lease
ran out, not the moment the member noticed; ``observed_at`` is when the member noticed.

``control`` events are not changes of ownership: the coordinator emits one when it applies a
change of the group's control record (pause, resume, rebalance request, drain, pin, imbalance
threshold; see :mod:`rebalancer_spark.core.control`), with its own member id, session and
coordinator epoch, the resource concerned (a pin) or ``""`` (the group), and the transition
in ``reason``. The audit's overlap proof ignores them. ``rebalance`` events are not changes of
ownership either: the coordinator emits one when it publishes a new target, with the new
``generation``, its ``coordinator_epoch``, what caused it (``trigger``) and how many resources
change owner (``moves``); ``reason`` carries the details ("join: job-d"). ``stuck`` and
``progress`` events are not changes of ownership either: a Spark job's owner of a file resource
emits them, under its epoch, when the resource gets stuck and when it applies an operator's
``rebalancer-spark progress reset|skip``. ``lag`` events are not changes of ownership either:
the owner of a file resource samples its lag (``pending_files``, ``pending_bytes``: listed and
not processed yet) after a planning, the owner of a queue after a fetch (``pending_messages``:
ready in the queue and not fetched yet, as the broker counts them), at most once per
``lag_interval`` seconds per resource and at once when the lag reaches zero or leaves it, so
that the audit table shows how far behind each resource was over time (the notebook's "Lag over
time").

The epoch chain rides on ownership events: ``generation`` and ``coordinator_epoch`` name the
target under which the change happened, and an ``acquired`` event carries the store's
:class:`~rebalancer_spark.core.model.Grant`: the owner it superseded (``prev_member_id``,
``prev_session_id``, ``prev_epoch``) and why and when the resource was free (``freed``,
``freed_at``, wall-clock seconds). The audit proves an unbroken chain of epochs from them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["EventKind", "EventSink", "OwnershipEvent", "Trigger"]


class EventKind(StrEnum):
    """What happened to a member's ownership of a resource."""

    ACQUIRED = "acquired"
    RELEASED = "released"
    LOST = "lost"
    FENCED = "fenced"
    CONTROL = "control"
    """Not about ownership: the coordinator applied an operator's control change."""
    REBALANCE = "rebalance"
    """Not about ownership: the coordinator published a new target."""
    STUCK = "stuck"
    """Not a change of ownership: the owner cannot make progress on the resource (its
    progress record is unreadable, its listing or a read fails); ``reason`` says why."""
    PROGRESS = "progress"
    """Not a change of ownership: the owner applied an operator's ``progress reset|skip``."""
    LAG = "lag"
    """Not a change of ownership: a sample of the owner's lag on the resource (files and
    bytes listed and not processed yet: ``pending_files``, ``pending_bytes``; for a queue,
    messages ready and not fetched yet: ``pending_messages``)."""


class Trigger(StrEnum):
    """What caused a rebalance (the ``trigger`` of a ``rebalance`` event)."""

    START = "start"
    JOIN = "join"
    LEAVE = "leave"
    CRASH = "crash"
    DISCOVERY = "discovery"
    OPERATOR = "operator"


@dataclass(frozen=True, slots=True)
class OwnershipEvent:
    """One change of ownership, as seen by the member it happened to."""

    kind: EventKind
    group: str
    resource: str
    member_id: str
    session_id: str
    epoch: int
    at: float
    observed_at: float
    reason: str
    info: Mapping[str, str] = field(default_factory=dict)
    generation: int | None = None
    coordinator_epoch: int | None = None
    prev_member_id: str | None = None
    prev_session_id: str | None = None
    prev_epoch: int | None = None
    freed: str | None = None
    freed_at: float | None = None
    trigger: str | None = None
    moves: int | None = None
    pending_files: int | None = None
    pending_bytes: int | None = None
    pending_messages: int | None = None


EventSink = Callable[[OwnershipEvent], None]
"""Receives events on the member's thread: return quickly, never raise.

A sink may also have a method ``emit_many(events)``: the member then hands it the events of one
change of ownership (a revocation, a grant, a loss: up to thousands of resources), in order, in
one call, instead of one call each. The Delta audit log, the metrics and the test suite's member
logs have one: a leave of 6,250 resources takes their lock, or writes their file, once instead
of 6,250 times before its claims are released."""
