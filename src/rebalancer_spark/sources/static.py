"""``static://a,b,c``: a fixed list of resources, the same as ``--resources a,b,c``.

Use it when the set of things to split is known in advance (tenants, shards, partitions of an
external system) and the job reads each one itself, committing its own progress. Both spellings
go through :func:`parse_resource_list`, so they accept and refuse the same lists: entries are
separated by commas, surrounding spaces are dropped, each entry must be a valid resource id
(printable, at most the id size limit), none may be empty and none may repeat. ``static:a,b,c``
(without the slashes) is accepted too when the URL is given to :func:`open_source` directly.
Entries are taken literally (no percent-decoding), as ``--resources`` takes them.
"""

from __future__ import annotations

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.model import Resource, validate_resource_id
from rebalancer_spark.sources.base import ResourceSource

__all__ = ["StaticSource", "parse_resource_list"]


def parse_resource_list(text: str, *, where: str) -> tuple[str, ...]:
    """The ids of the comma-separated list ``text`` (``where`` names it in errors)."""
    items = [item.strip() for item in text.split(",")]
    if "" in items:
        raise ConfigurationError(
            f"{where} has an empty entry (or is empty): list resource ids separated by single "
            "commas, e.g. static://a,b,c or --resources a,b,c"
        )
    ids = tuple(validate_resource_id(item) for item in items)
    twice = sorted({r for r in ids if ids.count(r) > 1})
    if twice:
        raise ConfigurationError(
            f"{where} lists {', '.join(repr(t) for t in twice[:5])} more than once: list each once"
        )
    return ids


class StaticSource(ResourceSource):
    """The resources listed in the URL; discovery never fails and never changes."""

    def __init__(self, url: str) -> None:
        scheme, sep, rest = url.partition(":")
        if scheme.lower() != "static" or not sep:
            raise ConfigurationError(
                f"source {url[:80]!r} is not a static list: write static://a,b,c"
            )
        body = rest[2:] if rest.startswith("//") else rest
        self.url = url
        self.resources = parse_resource_list(body, where=f"source {url[:80]!r}")

    def __repr__(self) -> str:
        return f"StaticSource({self.url[:80]!r})"

    def discover(self) -> list[Resource]:
        return [Resource(r) for r in sorted(self.resources)]
