"""The source contract: what a kind of input must do to be split between the members.

A source names a *set of resources* (the sub-directories of a share, the sub-prefixes of an S3
prefix, the queues of a broker) and lists them on demand with :meth:`ResourceSource.discover`.
The coordinator runs discovery at an interval and replaces the group's resource set with the
result, so a new directory is picked up and a vanished one released. A failed listing raises
:class:`SourceError` and changes nothing: resources still listed are never revoked because
the listing failed.

File-like sources also implement :class:`FileSource`: the files of one resource, so that a
job reads only what the previous owner did not commit. A file source may bring its own
Spark-side loading (:meth:`FileSource.load`, :meth:`FileSource.prepare_spark`: S3 does, for
reading with or without hadoop-aws); the Spark glue calls only these hooks, so it knows no
concrete source.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.model import Resource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "ON_CHANGE",
    "ORDERS",
    "FileEntry",
    "FileSource",
    "ResourceSource",
    "check_listing",
    "check_on_change",
]


class ResourceSource(abc.ABC):
    """Lists the resources of one source URL."""

    url: str

    @abc.abstractmethod
    def discover(self) -> list[Resource]:
        """The resources now, sorted by id; :class:`SourceError` if the source cannot be read."""


@dataclass(frozen=True, slots=True, order=True)
class FileEntry:
    """One input file of a resource: its name relative to the resource, size and mtime, and
    ``version``, what changes when the file is rewritten under the same name (the ETag on
    S3, the modification time in nanoseconds on a share; empty: ``modified`` stands in)."""

    name: str
    size: int
    modified: float
    version: str = ""

    @property
    def fingerprint(self) -> str:
        """Size and version as one string: a different fingerprint under the same name means
        the file was replaced after it was seen."""
        return f"{self.size}:{self.version or repr(self.modified)}"


ON_CHANGE = ("ignore", "reread")
"""What a file source does with a processed file found rewritten under the same name (its
``on_change`` URL option): ``ignore`` it (the default) or ``reread`` it in a new batch."""


ORDERS = ("none", "name")
"""How the files of a resource arrive (a file source's ``order`` URL option): in no order
(``none``, the default: every listing is a full one) or by name (``name``: keys that sort by
arrival, such as dates, hours or timestamps; each listing starts after the last name
processed, ``lookback`` seconds behind)."""


class FileSource(ResourceSource):
    """A source whose resources hold files.

    ``on_change`` (one of :data:`ON_CHANGE`, from the source's URL option of that name) says
    what the Spark glue does with a file already processed that is listed again with another
    :attr:`FileEntry.fingerprint`: ``ignore`` (default) or ``reread``; either way it warns
    and counts it. ``order`` (one of :data:`ORDERS`) and ``lookback`` (seconds) say where a
    listing may start (docs/sources.md)."""

    on_change: str = "ignore"
    order: str = "none"
    lookback: float = 0.0

    @abc.abstractmethod
    def files(
        self, resource: str, after: str | None = None, limit: int | None = None
    ) -> list[FileEntry]:
        """The visible files of ``resource`` sorted by name; only those whose name sorts
        above ``after`` when it is given, and only the first ``limit`` (listed in proportion
        to them where the source can: S3 ``StartAfter``, a sorted walk that skips directories
        below ``after`` and stops at ``limit``)."""

    @abc.abstractmethod
    def location(self, resource: str) -> str:
        """Where Spark reads the resource's files from (a path or URL ending in '/')."""

    def load(
        self,
        spark: SparkSession,
        resource: str,
        names: Sequence[str],
        *,
        format: str,
        schema: str | None,
        options: Mapping[str, str],
    ) -> DataFrame | None:
        """The files ``names`` of ``resource`` as one DataFrame with a ``_file`` column (the
        path or URL each row came from), loaded the source's own way; or None (the default)
        for Spark's reader on the paths under :meth:`location`."""
        return None

    def prepare_spark(self, spark: SparkSession) -> None:
        """Set what ``spark`` needs to write next to this source (S3: the bucket's endpoint
        and credentials), before an output opens; the default sets nothing."""
        return None


def check_on_change(value: str, shown_url: str) -> str:
    """``value`` of a file source's ``on_change`` option, checked."""
    if value not in ON_CHANGE:
        raise ConfigurationError(
            f"option on_change={value!r} of source {shown_url!r} is unknown: use ignore (the "
            "default: a processed file rewritten under the same name is not read again) or "
            "reread (it is read again in a new batch)"
        )
    return value


def check_depth(options: Mapping[str, str], shown_url: str) -> int:
    """The ``depth`` option of a file source, checked: how many levels below the root its
    resources are (1 to 8, default 1)."""
    depth = options.get("depth", "1")
    if not depth.isdigit() or not 1 <= int(depth) <= 8:
        raise ConfigurationError(
            f"option depth={depth!r} of source {shown_url!r} is not a number from 1 to 8: the "
            "resources are the directories (or sub-prefixes) that many levels below the root "
            "(2: date=*/hour=*)"
        )
    return int(depth)


def check_listing(options: Mapping[str, str], shown_url: str) -> tuple[str, float]:
    """The ``order`` and ``lookback`` options of a file source, checked: (order, seconds)."""
    from rebalancer_spark.core.config import parse_duration

    order = options.get("order", "none")
    if order not in ORDERS:
        raise ConfigurationError(
            f"option order={order!r} of source {shown_url!r} is unknown: use none (the "
            "default: every listing is a full one) or name (files arrive in name order, each "
            "listing starts after the last name processed)"
        )
    lookback = parse_duration(
        f"option lookback of source {shown_url!r} (how late a file may arrive under a name "
        "below the last one processed)",
        options.get("lookback", "0"),
    )
    if "lookback" in options and order != "name":
        raise ConfigurationError(
            f"option lookback of source {shown_url!r} needs order=name: with order=none every "
            "listing is a full one"
        )
    return order, lookback
