"""Whether this job still owns what it writes, asked by the writers of the output.

A writer gets a :class:`WriteGuard` for the resource and epoch it writes:

* :meth:`WriteGuard.check` raises :class:`~rebalancer_spark.FencedError` unless the job owns
  them now (from memory; False once the local lease deadline passed). Writers call it before
  each long step (Spark writing a batch's files), so a job that lost the resource stops early;
* :meth:`WriteGuard.holding` keeps them owned through the write that must land inside the
  ownership: the fenced Delta commit, the replacement of a Parquet batch directory. It is
  ``Member.hold``: a revocation of the resource waits for the block to end before the member
  emits ``released`` and gives the claim back, so no commit of an epoch lands after the job
  said it released it (rule 2 of the audit's output check, ``docs/audit.md``). A lapsed lease
  does not wait: the output's fence refuses a late commit once the new owner fenced, and the
  output check names a commit that slipped in between.

:class:`OwnerGuard` is the guard over a :class:`~rebalancer_spark.member.Member` (or anything
with its ``owns`` and ``hold``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from rebalancer_spark.core.errors import FencedError
from rebalancer_spark.member import OwnedResource

__all__ = ["Owner", "OwnerGuard", "WriteGuard"]


class WriteGuard(Protocol):
    """How a writer makes sure the job owns what it writes; see the module docstring."""

    def check(self) -> None:
        """Raise :class:`FencedError` unless the job owns the resource at the epoch now."""

    def holding(self) -> AbstractContextManager[object]:
        """Own the resource throughout the block (a revocation waits for its end); raise
        :class:`FencedError` on entry unless it is owned now and no revocation has begun."""


class Owner(Protocol):
    """What owns resources: a :class:`~rebalancer_spark.member.Member`."""

    def owns(self, resource: str) -> OwnedResource | None: ...

    def hold(self, resource: str, epoch: int) -> AbstractContextManager[OwnedResource]: ...


@dataclass(frozen=True, slots=True)
class OwnerGuard:
    """The :class:`WriteGuard` of ``resource`` at ``epoch`` over ``owner``; ``what`` names
    the resource in errors (``resource``, ``queue``)."""

    owner: Owner
    resource: str
    epoch: int
    what: str = "resource"

    def owned(self) -> bool:
        """Whether the job owns the resource at the epoch now, from memory."""
        owned = self.owner.owns(self.resource)
        return owned is not None and owned.epoch == self.epoch

    def check(self) -> None:
        if not self.owned():
            raise FencedError(
                f"{self.what} {self.resource!r} is no longer owned by this job at epoch "
                f"{self.epoch} (it moved, or this job's lease lapsed): stop working on it"
            )

    def holding(self) -> AbstractContextManager[object]:
        return self.owner.hold(self.resource, self.epoch)
