"""The library's exceptions: a small tree, translated at the plug-in boundary.

::

    RebalancerError
    ├── ConfigurationError        bad option, URL, group/member/resource name (also a ValueError)
    ├── BackendError
    │   ├── BackendUnavailable    the store cannot be reached or written
    │   └── CorruptStateError     the store holds data this library did not write
    ├── MemberIdInUse             a live member already uses this static member id
    ├── SessionExpired            this member's session/lease is gone; it must rejoin
    ├── FencedError               a write carried an epoch that is no longer current
    ├── ControlConflict           the control record changed since it was read (retry)
    └── SourceError               a resource source failed to list or read

Every message names the object, the value seen, what was expected and what to do next.
:class:`MemberIdInUse`, :class:`SessionExpired` and :class:`FencedError` (a store's refusals) are
built from facts that they keep as attributes (group, member, session, resource, epoch seen and
current, holder, why); their constructors word the message, the same for every backend.
Secrets never appear in messages: URLs are shown through :func:`redact_url`.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BackendUnavailable",
    "ConfigurationError",
    "ControlConflict",
    "CorruptStateError",
    "FencedError",
    "MemberFailed",
    "MemberIdInUse",
    "RebalancerError",
    "SessionExpired",
    "SourceError",
]


class RebalancerError(Exception):
    """Base of every error raised by rebalancer-spark."""


class ConfigurationError(RebalancerError, ValueError):
    """An option, URL or name is invalid; the message says which and how to fix it."""


class BackendError(RebalancerError):
    """The coordination store failed."""


class BackendUnavailable(BackendError):
    """The store cannot be reached, opened or written right now."""


class CorruptStateError(BackendError):
    """The store holds data that this library did not write or cannot read."""


class MemberIdInUse(RebalancerError):
    """A live member of the group already uses this static member id.

    Built from facts, kept as attributes: ``group``, ``member``, and what the store knows of
    the live holder (``host``, ``pid``, and ``lease_left``, the seconds its lease still runs,
    None where the store does not say)."""

    def __init__(
        self,
        group: str,
        member: str,
        *,
        host: str = "?",
        pid: str = "?",
        lease_left: float | None = None,
    ) -> None:
        self.group = group
        self.member = member
        self.host = host
        self.pid = pid
        self.lease_left = lease_left
        lease = "" if lease_left is None else f", lease ends in {max(lease_left, 0.0):.1f} s"
        super().__init__(
            f"member id {member!r} is in use in group {group!r} by a live session "
            f"(host {host}, pid {pid}{lease}): give each job its own --member-id, or stop the "
            "other one first"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), str(self), dict(vars(self))))


class SessionExpired(RebalancerError):
    """This member's session (lease) has expired; it has stopped all work and must rejoin.

    Built from facts, kept as attributes: ``group``, ``member``, ``session`` (its id), ``why``
    the store says it is over, and ``doing``, the request it refused ("" if none)."""

    def __init__(
        self,
        group: str,
        member: str,
        session: str,
        *,
        why: str = "its lease lapsed or it left the group",
        doing: str = "",
    ) -> None:
        self.group = group
        self.member = member
        self.session = session
        self.why = why
        self.doing = doing
        refused = f"{doing} refused: " if doing else ""
        super().__init__(
            f"{refused}session {session[:40]!r} of member {member!r} in group {group!r} is over "
            f"({why}): the member has stopped all work and must rejoin with a new session"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), str(self), dict(vars(self))))


class MemberFailed(RebalancerError):
    """The member's own thread failed on an error this library did not foresee (a bug, or a
    store's error that no backend translated): it reported everything lost, left its group and
    does nothing more, so it must not look like a member that merely owns nothing. Raised by
    :meth:`~rebalancer_spark.Member.assigned`, the call a job's loop makes on every pass; the
    member logged the error with its traceback.

    Built from facts, kept as attributes: ``group``, ``member``, and ``cause``, the error's
    text (``repr`` of the exception, cut to 300 characters)."""

    def __init__(self, group: str, member: str, cause: str) -> None:
        self.group = group
        self.member = member
        self.cause = cause
        super().__init__(
            f"member {member!r} of group {group!r} stopped on its own: its member thread "
            f"failed with {cause} and the member left the group for good; stop it and start a "
            "new one (the jobs in jobs/ exit with code 4 for their supervisor to do so), and "
            "report the traceback it logged"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), str(self), dict(vars(self))))


class FencedError(RebalancerError):
    """A write was refused because its epoch is stale: ownership or leadership moved on.

    A refusal by the store is built from facts, kept as attributes: ``write`` (``"commit"``
    of progress, or a ``"coordinator"`` write), ``group``, ``member`` (the writer),
    ``resource`` (commits), ``epoch`` (the one the write carried), ``holder`` and
    ``current_epoch`` (who holds the resource or the coordinator role now, and at which epoch,
    where known) and ``why`` (the reason, when it is not simply that holder). Fences outside
    the store (an output table, the member's own lease) pass their own ``message``; their
    facts are then None."""

    def __init__(
        self,
        message: str | None = None,
        *,
        write: str = "",
        group: str | None = None,
        member: str | None = None,
        resource: str | None = None,
        epoch: int | None = None,
        holder: str | None = None,
        current_epoch: int | None = None,
        why: str = "",
    ) -> None:
        self.write = write
        self.group = group
        self.member = member
        self.resource = resource
        self.epoch = epoch
        self.holder = holder
        self.current_epoch = current_epoch
        self.why = why
        super().__init__(message if message is not None else self._word())

    def _word(self) -> str:
        holder = "nobody" if self.holder is None else repr(self.holder)
        if self.write == "commit":
            why = self.why or f"the resource is held by {holder} at epoch {self.current_epoch}"
            return (
                f"commit for resource {self.resource!r} by member {self.member!r} of group "
                f"{self.group!r} at epoch {self.epoch} refused: {why}; stop working on it, the "
                "new owner resumes from the last accepted commit"
            )
        why = self.why or f"the current coordinator is {holder} at epoch {self.current_epoch}"
        return (
            f"coordinator write for group {self.group!r} refused: it carried epoch {self.epoch} "
            f"from member {self.member!r}, but {why}; this member stepped down and changed "
            "nothing"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), str(self), dict(vars(self))))


def _rebuild(cls: type[Exception], message: str, facts: dict[str, object]) -> Exception:
    """Unpickle an error built from facts (by default an exception is rebuilt by calling its
    class with its message alone, which these classes do not accept)."""
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(facts)
    return error


class ControlConflict(RebalancerError):
    """A control record write was refused: its version moved on since it was read."""


class SourceError(RebalancerError):
    """A resource source could not list or read its resources."""
