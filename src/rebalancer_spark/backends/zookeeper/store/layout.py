"""Where everything lives in ZooKeeper, how resource ids become znode names, and how big data
is cut into chunks that stay far below ZooKeeper's 1 MB limit (``jute.maxbuffer``).

One tree per chroot, one sub-tree per group::

    <chroot>/rebalancer-spark               marks the tree as ours: {"layout": 1}
    <chroot>/groups/<group>                 {"layout": 1}
        changes                             empty; its version counts the group's changes
        members/<member id>                 EPHEMERAL of the member's session: record
        sessions/<session id>               EPHEMERAL of the session: "this session lives"
        coordinator                         EPHEMERAL of the coordinator's session
        epoch                               coordinator epoch and its winner; version == epoch
        resources                           pointer to the current resource set
        resource-sets/<set>/<k>             chunks of [[id, weight], ...]
        target                              pointer to the current target generation
        targets/<dir>/<member>#<k>          chunks of [id, ...] for one member
        targets/<dir>/<member>#h            in a delta: who held what the member gains
        claims/                             empty: the claims of earlier releases' members
        epochs/<escaped id>                 resource epoch and holder; raised by every grant
        progress/<escaped id>               last accepted progress commit
        control                             the operator's control record (JSON); created
                                            on the first change, version == record version - 1

Resource ids may hold any printable text; :func:`escape` turns one into a single znode name
that can never leave its directory.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from rebalancer_spark.core.errors import CorruptStateError
from rebalancer_spark.core.model import MAX_RESOURCE_ID_BYTES, validate_resource_id

__all__ = [
    "CHUNK_BYTES",
    "GROUP_CHILDREN",
    "LOG_PREFIX",
    "PROGRESS_HINT",
    "RECORD_HINT",
    "REQUEST_BYTES",
    "TREE_MARKER",
    "GroupPaths",
    "chunk_json",
    "escape",
    "unescape",
]

TREE_MARKER = "rebalancer-spark"
"""The child of the chroot that says the tree was written by this library."""

CHUNK_BYTES = 96 * 1024
"""Largest chunk of a resource set or of one member's target: a tenth of ZooKeeper's 1 MB."""

REQUEST_BYTES = 320 * 1024
"""Largest multi-op request this backend sends, counting paths, data and ACLs."""

RECORD_HINT = 1024
"""Largest claim or ``epochs/<id>`` record when batching reads: ids of at most 128 characters
and a few numbers (about 300 bytes)."""

NOTES_BYTES = 4096
"""Largest release notes a session znode holds (:func:`.chain.notes_data`): some 200 short
ids. A release of more writes none: every member following the holder reads its znode, notes
and all, so notes pay only where few members wait for what one releases (a join's newcomer)."""

SESSION_HINT = NOTES_BYTES + 256
"""Largest ``sessions/<id>`` znode when batching reads: release notes at most."""

PROGRESS_HINT = 16 * 1024
"""Expected size of one progress record when batching reads (most are a few bytes)."""

GROUP_CHILDREN = frozenset(
    {
        "changes",
        "members",
        "sessions",
        "coordinator",
        "epoch",
        "resources",
        "resource-sets",
        "target",
        "targets",
        "claims",
        "epochs",
        "progress",
        "control",
    }
)
"""Every child a group znode may have; anything else was not written by this library."""

_DOTS = {".": "%2E", "..": "%2E%2E"}
_PLAIN = re.compile(rf"[A-Za-z0-9._~-]{{1,{MAX_RESOURCE_ID_BYTES}}}")
"""Ids that escape to themselves: ASCII letters, digits and ``-._~``, within the size limit."""


def escape(resource: str) -> str:
    """The znode name of ``resource``: its UTF-8 bytes percent-encoded except ASCII letters,
    digits and ``-._~``, so no ``/`` (nor ``%``, nor any character ZooKeeper refuses) survives;
    ``.`` and ``..`` become ``%2E`` and ``%2E%2E``. Injective: :func:`unescape` inverts it.

    Called for every path of a resource (several per resource in a claim or a release): ids of
    ASCII letters and digits alone are answered by two string methods, the rest by a cache."""
    if (
        type(resource) is str
        and resource.isalnum()
        and resource.isascii()
        and len(resource) <= MAX_RESOURCE_ID_BYTES
    ):
        return resource  # what quote() would return
    return _escape(resource)


@functools.lru_cache(maxsize=8192)  # a claim's ids, each escaped several times
def _escape(resource: str) -> str:
    if type(resource) is str and _PLAIN.fullmatch(resource) and resource not in _DOTS:
        return resource
    validate_resource_id(resource)
    return _DOTS.get(resource) or quote(resource, safe="")


def unescape(name: str, path: str) -> str:
    """The resource id a znode ``name`` (a child of ``path``) stands for; a name that
    :func:`escape` cannot have written is a :class:`CorruptStateError` naming the path."""
    try:
        resource = unquote(name, errors="strict")
        canonical = escape(resource)
    except (UnicodeDecodeError, ValueError):
        canonical = None
    if canonical != name:
        raise CorruptStateError(
            f"znode {path}/{name} has a name rebalancer-spark never writes (not an escaped "
            "resource id): it was created by something else; remove it or use another chroot"
        )
    return resource


LOG_PREFIX = "log-"
"""How the directory of a logged change of the resource set is named under ``resource-sets/``
(``log-v<version>-<tag>``): a set's own directories are ``v<version>-<tag>``."""

_CHILDREN = (
    ("changes", "changes"),
    ("members", "members"),
    ("sessions", "sessions"),
    ("coordinator", "coordinator"),
    ("epoch", "epoch"),
    ("control", "control"),
    ("resources", "resources"),
    ("resource_sets", "resource-sets"),
    ("target", "target"),
    ("targets", "targets"),
    ("claims", "claims"),
    ("epochs", "epochs"),
    ("progresses", "progress"),
)
"""The :class:`GroupPaths` attributes that name a child of the group's znode, and its name."""


@dataclass(frozen=True, slots=True)
class GroupPaths:
    """The paths of one group under a chroot (``root`` is ``""`` for the ZooKeeper root)."""

    root: str
    group: str
    # The group's znode and its children's paths, built once: a claim or a release builds
    # several paths per resource.
    base: str = field(init=False, repr=False, compare=False)
    changes: str = field(init=False, repr=False, compare=False)
    members: str = field(init=False, repr=False, compare=False)
    sessions: str = field(init=False, repr=False, compare=False)
    coordinator: str = field(init=False, repr=False, compare=False)
    epoch: str = field(init=False, repr=False, compare=False)
    control: str = field(init=False, repr=False, compare=False)
    resources: str = field(init=False, repr=False, compare=False)
    resource_sets: str = field(init=False, repr=False, compare=False)
    target: str = field(init=False, repr=False, compare=False)
    targets: str = field(init=False, repr=False, compare=False)
    claims: str = field(init=False, repr=False, compare=False)
    epochs: str = field(init=False, repr=False, compare=False)
    progresses: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        base = f"{self.root}/groups/{self.group}"
        object.__setattr__(self, "base", base)
        for attr, name in _CHILDREN:
            object.__setattr__(self, attr, f"{base}/{name}")

    def child(self, name: str) -> str:
        return f"{self.base}/{name}"

    def member(self, member_id: str) -> str:
        return f"{self.members}/{member_id}"

    def session(self, session_id: str) -> str:
        return f"{self.sessions}/{session_id}"

    def resource_epoch(self, resource: str) -> str:
        return f"{self.epochs}/{escape(resource)}"

    def progress(self, resource: str) -> str:
        return f"{self.progresses}/{escape(resource)}"

    def resource_set(self, name: str) -> str:
        return f"{self.resource_sets}/{name}"

    def resource_chunk(self, name: str, k: int) -> str:
        return f"{self.resource_sets}/{name}/{k}"

    def target_dir(self, name: str) -> str:
        return f"{self.targets}/{name}"

    def target_chunk(self, name: str, member_id: str, k: int) -> str:
        return f"{self.targets}/{name}/{member_id}#{k}"

    def target_hints(self, name: str, member_id: str) -> str:
        """A delta's hints for ``member_id``: the session of the member that had each id it
        gains (``..ownership``, "Hints")."""
        return f"{self.targets}/{name}/{member_id}#h"

    def skeleton(self) -> list[str]:
        """The persistent znodes every group has, parents first."""
        return [
            self.base,
            self.changes,
            self.members,
            self.sessions,
            self.epoch,
            self.resource_sets,
            self.targets,
            self.claims,
            self.epochs,
            self.progresses,
        ]


def chunk_json(items: Iterable[bytes], limit: int = CHUNK_BYTES) -> list[bytes]:
    """JSON arrays of the already-encoded ``items``, each at most ``limit`` bytes (an item
    larger than that alone would still get its own chunk; ids are at most a few KB)."""
    chunks: list[bytes] = []
    current: list[bytes] = []
    size = 2
    for item in items:
        if current and size + len(item) + 1 > limit:
            chunks.append(b"[" + b",".join(current) + b"]")
            current, size = [], 2
        current.append(item)
        size += len(item) + 1
    if current:
        chunks.append(b"[" + b",".join(current) + b"]")
    return chunks
