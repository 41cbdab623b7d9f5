"""Filling the staging keys that PUBLISH and UPDATE_RESOURCES consume, in chunks.

A target of 100,000 resources or a resource set of that size never travels as one script
argument: the client queues ``SADD``/``HSET`` commands of at most :data:`CHUNK` items into the
same MULTI/EXEC as the script, which renames the staged keys into place (see
:mod:`.prelude`). Each staged key also gets a ``PEXPIRE`` as a safety net.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import TypeVar

from redis.client import Pipeline

from rebalancer_spark.backends.redis.store.keys import stage_key

__all__ = ["CHUNK", "chunks", "stage_change", "stage_resources", "stage_target"]

CHUNK = 1000
"""Most ids (or id/weight pairs) per command."""
STAGE_TTL_MS = 600_000

_T = TypeVar("_T")


def chunks(items: Sequence[_T], size: int = CHUNK) -> Iterator[Sequence[_T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def stage_target(
    group: str, nonce: str, wanted: Mapping[str, Sequence[str]]
) -> Callable[[Pipeline], None]:
    """Member ``i`` (1-based, in the mapping's order) gets ``stage:<nonce>:<i>``, a set."""

    def fill(pipe: Pipeline) -> None:
        for i, ids in enumerate(wanted.values(), 1):
            key = stage_key(group, nonce, str(i))
            for chunk in chunks(ids):
                pipe.sadd(key, *chunk)
            if ids:
                pipe.pexpire(key, STAGE_TTL_MS)

    return fill


def stage_change(
    group: str,
    nonce: str,
    members: Sequence[str],
    added: Mapping[str, Collection[str]],
    removed: Mapping[str, Collection[str]],
) -> Callable[[Pipeline], None]:
    """Member ``i`` (1-based, in ``members``' order) gets ``stage:<nonce>:a<i>`` (ids to add)
    and ``stage:<nonce>:d<i>`` (ids to remove), sets, only where it has any."""

    def fill(pipe: Pipeline) -> None:
        for i, m in enumerate(members, 1):
            for part, ids in (("a", added.get(m, ())), ("d", removed.get(m, ()))):
                key = stage_key(group, nonce, f"{part}{i}")
                for chunk in chunks(list(ids)):
                    pipe.sadd(key, *chunk)
                if ids:
                    pipe.pexpire(key, STAGE_TTL_MS)

    return fill


def stage_resources(
    group: str, nonce: str, weights: Mapping[str, str]
) -> Callable[[Pipeline], None]:
    """``stage:<nonce>:res``, a hash of resource id -> weight."""
    key = stage_key(group, nonce, "res")
    items = list(weights.items())

    def fill(pipe: Pipeline) -> None:
        for chunk in chunks(items, CHUNK // 2):
            pipe.hset(key, mapping=dict(chunk))
        if items:
            pipe.pexpire(key, STAGE_TTL_MS)

    return fill
