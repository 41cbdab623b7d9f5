"""``file:///mount/dir/``: each sub-directory of a directory (a local disk, an NFS or SMB mount)
is a resource.

Use it for landing zones where each producer, tenant or day writes into its own directory and
a handful of Spark jobs share the work. Every member must see the share at the same path.

Rules, so that a half-written file is never read:

* names starting with ``.`` or ``_`` are ignored, for directories and files alike (Spark and
  Hadoop use ``_temporary``, ``_SUCCESS``, and writers publish atomically by writing
  ``.name.tmp`` and renaming it);
* a resource's files are listed recursively, by their path relative to the resource;
* a sub-directory whose name cannot be a resource id (a control character such as a newline,
  over the id size limit) is **skipped with a warning** naming it, so that one badly named
  directory does not stop the discovery of every other resource; rename it to have it picked up;
* a resource's weight is 1, or its number of bytes with the URL option ``weight=bytes``
  (``file:///dir/?weight=bytes``; ``weight=none`` is the default);
* a file processed already and then replaced under the same name (another size or
  modification time) is not read again with ``on_change=ignore`` (the default) and is read
  again, in a new batch, with ``on_change=reread`` (``file:///dir/?on_change=reread``); either
  way a warning is logged and the file counted (docs/sources.md).

* ``order=name`` (files arrive in name order: dates, hours, timestamps first) makes a listing
  start after the last name processed, walking the directories in name order, skipping those
  below it and ``stat``-ing only the files above it, and stop at what the next batch needs;
  ``lookback=DURATION`` keeps the start that far behind, for late files; ``order=none`` (the
  default) lists everything every time (docs/sources.md).

* ``depth=N`` (1 to 8, default 1): the resources are the directories N levels below the root,
  named by their path (``depth=2`` over ``date=*/hour=*``: ``date=2026-11-25/hour=10``), each
  still one owner's; files of shallower directories belong to no resource.

Any other option is refused.

:meth:`FileShareSource.location` is a ``file:`` URL holding the directory's path as it is (not
percent-encoded): Hadoop's ``Path`` takes a string's characters literally, so names with
spaces, ``%`` or non-ASCII letters are read as they are written.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from rebalancer_spark.core.errors import ConfigurationError, SourceError
from rebalancer_spark.core.model import Resource, validate_resource_id
from rebalancer_spark.sources.base import (
    FileEntry,
    FileSource,
    check_depth,
    check_listing,
    check_on_change,
)

__all__ = ["FileShareSource"]

log = logging.getLogger("rebalancer_spark.sources.files")

OPTIONS = ("depth", "lookback", "on_change", "order", "weight")
WEIGHTS = ("none", "bytes")


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def _walk(folder: Path, prefix: str, after: str | None) -> Iterator[tuple[str, Path]]:
    """(relative name, path) of the visible files under ``folder`` sorting above ``after``,
    in name order: a directory ``d`` is keyed ``d/``, so its files come as one block exactly
    where their names sort."""
    with os.scandir(folder) as listing:
        entries = [
            (e.name + "/" if e.is_dir() else e.name, e.is_dir())
            for e in listing
            if not _hidden(e.name)
        ]
    for key, is_dir in sorted(entries):
        name = prefix + key
        if is_dir:
            if _may_hold(name[:-1], after):
                yield from _walk(folder / key[:-1], name, after)
        elif after is None or name > after:
            yield name, folder / key


def _may_hold(directory: str, after: str | None) -> bool:
    """Whether the directory ``directory`` (relative) may hold a name sorting above
    ``after``: every name under it starts with ``directory + "/"``."""
    if after is None:
        return True
    head = directory + "/"
    return after < head or after.startswith(head)


class FileShareSource(FileSource):
    """Sub-directories of ``file:///dir/`` as resources; see the module docstring."""

    def __init__(self, url: str, *, weigh: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path:
            raise ConfigurationError(
                f"source {url!r} is not a file-share URL: write file:///absolute/dir/ (three "
                "slashes, no host)"
            )
        if parts.fragment:
            raise ConfigurationError(
                f"source {url!r} holds a '#': write a '#' in the directory's path as %23"
            )
        options: dict[str, str] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name not in OPTIONS:
                close = difflib.get_close_matches(name, OPTIONS, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigurationError(
                    f"source {url!r} has the unknown option {name!r}{hint}: the options of a "
                    "file share are weight=none|bytes, on_change=ignore|reread, order=none|name, "
                    "lookback=DURATION and depth=N"
                )
            if name in options:
                raise ConfigurationError(f"source {url!r} gives the option {name!r} twice")
            options[name] = value
        weight = options.get("weight", "none")
        if weight not in WEIGHTS:
            raise ConfigurationError(
                f"option weight={weight!r} of source {url!r} is unknown: use one of "
                f"{', '.join(WEIGHTS)}"
            )
        if weigh is not None:  # the keyword of earlier versions: "count" (weight 1) or "bytes"
            if weigh not in ("count", "bytes"):
                raise ConfigurationError(f"weigh={weigh!r} is unknown: use 'count' or 'bytes'")
            if "weight" in options and (weigh == "bytes") != (weight == "bytes"):
                raise ConfigurationError(
                    f"weigh={weigh!r} contradicts the option weight={weight!r} of source "
                    f"{url!r}: give one of them"
                )
            weight = "bytes" if weigh == "bytes" else "none"
        self.url = url
        self.root = Path(unquote(parts.path))
        self.weight = weight
        self.depth = check_depth(options, url)
        self.on_change = check_on_change(options.get("on_change", "ignore"), url)
        self.order, self.lookback = check_listing(options, url)

    def _resource_dir(self, resource: str) -> Path:
        path = (self.root / resource).resolve()
        if self.root.resolve() not in path.parents:
            raise SourceError(
                f"resource {resource!r} of source {self.url!r} would leave the directory "
                f"{str(self.root)!r}: resource ids of a file share are sub-directory names"
            )
        return path

    def discover(self) -> list[Resource]:
        try:
            listed = [""]
            for _ in range(self.depth):  # the directories `depth` levels down, by path
                listed = sorted(
                    f"{parent}{e.name}"
                    for parent in (f"{p}/" if p else "" for p in listed)
                    for e in os.scandir(self.root / parent)
                    if e.is_dir() and not _hidden(e.name)
                )
        except OSError as exc:
            raise SourceError(
                f"cannot list source {self.url!r} ({exc.strerror or exc}): check that the "
                "share is mounted at the same path on this host and readable"
            ) from None
        entries = []
        for name in listed:
            try:
                entries.append(validate_resource_id(name))
            except ConfigurationError as exc:
                log.warning(
                    "source %r: directory %r skipped, it cannot be a resource (rename it): %s",
                    self.url,
                    name,
                    exc,
                )
        if self.weight == "none":
            return [Resource(name) for name in entries]
        return [
            Resource(name, float(max(sum(f.size for f in self.files(name)), 1))) for name in entries
        ]

    def files(
        self, resource: str, after: str | None = None, limit: int | None = None
    ) -> list[FileEntry]:
        """A walk in name order: a sub-directory whose every name sorts at or below ``after``
        is not entered, only the files above ``after`` are looked at (``stat``), and the walk
        ends after ``limit`` files; so its cost follows the files returned plus the names of
        the directories on the way (docs/sources.md)."""
        base = self._resource_dir(resource)
        found: list[FileEntry] = []
        if not base.is_dir():
            return found  # gone: the next discovery drops the resource
        try:
            for name, full in _walk(base, "", after):
                try:
                    stat = full.stat()
                except FileNotFoundError:
                    continue  # removed while listing
                found.append(FileEntry(name, stat.st_size, stat.st_mtime, str(stat.st_mtime_ns)))
                if limit is not None and len(found) >= limit:
                    break
        except OSError as exc:
            raise SourceError(
                f"cannot list files of resource {resource!r} in {self.url!r}: {exc}"
            ) from None
        return found

    def location(self, resource: str) -> str:
        # Not Path.as_uri(): Hadoop does not decode %-escapes in a path string, it takes every
        # character literally, so "x y" must stay "x y" (and "%41" stay "%41").
        return f"file://{self._resource_dir(resource)}/"
