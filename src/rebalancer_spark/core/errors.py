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
    """A live member of the group already uses this static member id."""


class SessionExpired(RebalancerError):
    """This member's session (lease) has expired; it has stopped all work and must rejoin."""


class FencedError(RebalancerError):
    """A write was refused because its epoch is stale: ownership or leadership moved on."""


class ControlConflict(RebalancerError):
    """A control record write was refused: its version moved on since it was read."""


class SourceError(RebalancerError):
    """A resource source could not list or read its resources."""
