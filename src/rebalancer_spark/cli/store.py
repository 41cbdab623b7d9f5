"""The store a command names: which one, whether it exists, and one read of a group in it."""

from __future__ import annotations

from rebalancer_spark.backends import check_backend_url, open_backend, store_missing
from rebalancer_spark.cli.exits import fail
from rebalancer_spark.core.model import GroupState, Progress
from rebalancer_spark.member import default_backend_url

__all__ = ["backend_url", "group_known", "missing_store", "read_group", "shown", "store_warnings"]


def backend_url(given: str | None) -> str:
    """``--backend``, or the SQLite file in ``$REBALANCER_HOME`` that jobs use by default."""
    return given or default_backend_url()


def missing_store(url: str) -> str | None:
    """``"store URL does not exist"`` (redacted) when ``url`` names a store that only members
    create and it does not exist yet, else None (it exists, or it is a server, whose absence
    shows when connecting); the backend's plug-in says which (``store_missing``). Raises a
    ``ConfigurationError`` for a bad URL."""
    parsed = check_backend_url(url)
    if store_missing(parsed):
        return f"store {parsed.redacted()} does not exist"
    return None


def shown(url: str) -> str:
    """``url`` as commands print it: checked, passwords as ``***``."""
    return check_backend_url(url).redacted()


def group_known(state: GroupState) -> bool:
    """Whether the store knows the group at all: members, resources, a target, claims or a
    control record ever written. A mistyped ``--group`` has none of them."""
    return (
        bool(state.members or state.resources or state.target or state.claims)
        or state.control.version > 0
    )


def read_group(
    url: str, group: str, *, progress: bool = False
) -> tuple[GroupState, dict[str, Progress]]:
    """(group state, resource -> last progress if ``progress``) without writing anything.
    Exits with status 2 and one line saying what to check when the store does not exist (it
    is not created) or does not know the group (see :func:`group_known`)."""
    missing = missing_store(url)
    if missing is not None:
        fail(
            f"{missing}: check --backend (the jobs create the store when they join; "
            f"without --backend it is {default_backend_url()})"
        )
    with open_backend(url) as backend:
        state = backend.state(group)
        names = sorted(set(state.resources) | set(state.claims))
        done = backend.progress(group, names) if progress else {}
    if not group_known(state):
        fail(
            f"group {group!r} is unknown on {shown(url)}: no members, resources, target or "
            "control record; check --group and --backend (the jobs' --group and --backend)"
        )
    return state, done


def store_warnings(url: str) -> list[str]:
    """What the store's set-up warrants telling the operator (``Backend.store_warnings``:
    a Redis server without persistence); nothing for a store that does not exist yet."""
    if missing_store(url) is not None:
        return []
    with open_backend(url) as backend:
        return backend.store_warnings()
