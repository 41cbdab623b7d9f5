"""The three rebalance protocols, as pure decisions a member takes from what the store says.

A member sees its :class:`MemberView` (the target generation and phase, the resources the
target gives it, the claims the store says it holds) and the claims it believes it holds.
:func:`plan` says what to do next, in this order: report ``lost`` resources (the store no longer
has our claim: stop at once), stop work on and release ``revoke``, acknowledge ``ack``, then
try to ``claim``. The store grants a claim only when the resource is free (released, or its
holder's session expired) and the current target gives it to us, so a resource is never owned
twice whatever the protocol; protocols differ only in what they stop.

================  ===========================================================================
cooperative       (default, after Kafka's KIP-848) release only what the target moved away;
                  everything else keeps running through a rebalance.
resource_barrier  (the original Rebalanser ZooKeeper algorithm) on every new generation release
                  everything, then claim the new target resource by resource as each is freed.
global_barrier    (the original Rebalanser RDBMS algorithm) the coordinator publishes a
                  ``stopping`` phase; every member releases everything and acknowledges; once
                  all acknowledged (or a deadline passed) the coordinator publishes the new
                  target in the ``running`` phase and members claim it.
================  ===========================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rebalancer_spark.core.config import ProtocolName
from rebalancer_spark.core.model import Phase

__all__ = ["MemberHead", "MemberView", "Plan", "head_of", "idle", "plan"]


@dataclass(frozen=True, slots=True)
class MemberView:
    """One member's part of the group, read from the store in one consistent read."""

    generation: int
    phase: Phase
    target: frozenset[str]
    owned: Mapping[str, int] | None
    """Resource id → epoch of every claim the store holds for this member's session; None when
    the view was read without them (``Backend.member_view(session, claims=False)``): the member
    knows them, and :func:`plan` takes what it holds as what the store holds."""
    coordinator_epoch: int = 0
    """The coordinator epoch the target at ``generation`` was published under (0: none)."""


@dataclass(frozen=True, slots=True)
class MemberHead:
    """What says whether a member's view may have changed, read in O(1): the target's
    generation, phase and coordinator epoch. While a member's session lives, only its own calls
    change its claims, so a member with nothing left to do whose head is unchanged has nothing
    to read (:func:`idle`)."""

    generation: int
    phase: Phase
    coordinator_epoch: int = 0


def head_of(view: MemberView) -> MemberHead:
    return MemberHead(view.generation, view.phase, view.coordinator_epoch)


def idle(
    protocol: ProtocolName, view: MemberView, held: Mapping[str, int], handled_generation: int
) -> bool:
    """True when :func:`plan` on ``view`` asks nothing of a member holding ``held`` and the
    store held exactly that: re-reading the same view could only say the same
    (:attr:`Plan.settled`)."""
    return plan(protocol, view, held, handled_generation).settled


@dataclass(frozen=True, slots=True)
class Plan:
    """What a member must do now; empty sets mean nothing to do."""

    lost: frozenset[str]
    revoke: frozenset[str]
    claim: frozenset[str]
    ack: int | None
    generation: int
    settled: bool = False
    """Nothing to do, and the store holds exactly what the member believes it holds: the same
    view read again could only say the same (:func:`idle`)."""


def plan(
    protocol: ProtocolName,
    view: MemberView,
    held: Mapping[str, int],
    handled_generation: int,
) -> Plan:
    """Decide the next step of a member that holds ``held`` (resource → epoch) and has fully
    handled target generation ``handled_generation`` (its eager release done)."""
    # Set operations throughout, run in C: a member's part runs to thousands of resources and
    # a member plans on every change it sees.
    believed = held if isinstance(held, dict) else dict(held)
    if view.owned is None:
        owned = believed  # read without the claims: the member knows them
    else:
        owned = view.owned if isinstance(view.owned, dict) else dict(view.owned)
    agree = believed == owned
    # Claims we believe we hold but the store does not (or holds at another epoch) are lost.
    still = frozenset(believed) if agree else frozenset(dict(believed.items() & owned.items()))
    lost = frozenset(believed) - still
    # Claims the store holds for our session that we do not know of (a reply lost on the way,
    # or a re-grant at another epoch): adopt them if the target agrees (claiming a resource we
    # already hold returns it with its epoch), release them otherwise.
    unknown = frozenset(owned) - still
    new_generation = view.generation > handled_generation
    ack: int | None
    if view.phase is Phase.STOPPING:
        revoke = still | unknown
        claim: frozenset[str] = frozenset()
        ack = view.generation
    elif protocol is ProtocolName.RESOURCE_BARRIER and new_generation:
        revoke = still | unknown
        claim = view.target
        ack = view.generation
    else:
        revoke = (still | unknown) - view.target
        claim = view.target - still
        ack = view.generation if new_generation else None
    settled = agree and not (revoke or claim) and ack is None
    return Plan(lost, revoke, claim, ack, view.generation, settled)
