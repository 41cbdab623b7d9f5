"""``file:///mount/dir/``: each sub-directory of a directory (a local disk, an NFS or SMB mount)
is a resource.

Use it for landing zones where each producer, tenant or day writes into its own directory and
a handful of Spark jobs share the work. Every member must see the share at the same path.

Rules, so that a half-written file is never read:

* names starting with ``.`` or ``_`` are ignored, for directories and files alike (Spark and
  Hadoop use ``_temporary``, ``_SUCCESS``, and writers publish atomically by writing
  ``.name.tmp`` and renaming it);
* a resource's files are listed recursively, by their path relative to the resource;
* a resource's weight is its number of bytes when ``weigh="bytes"``, else 1.

:meth:`FileShareSource.location` is a ``file:`` URL holding the directory's path as it is (not
percent-encoded): Hadoop's ``Path`` takes a string's characters literally, so names with
spaces, ``%`` or non-ASCII letters are read as they are written.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from rebalancer_spark.core.errors import ConfigurationError, SourceError
from rebalancer_spark.core.model import Resource
from rebalancer_spark.sources.base import FileEntry, FileSource

__all__ = ["FileShareSource"]


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


class FileShareSource(FileSource):
    """Sub-directories of ``file:///dir/`` as resources; see the module docstring."""

    def __init__(self, url: str, *, weigh: str = "count") -> None:
        parts = urlsplit(url)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path:
            raise ConfigurationError(
                f"source {url!r} is not a file-share URL: write file:///absolute/dir/ (three "
                "slashes, no host)"
            )
        if weigh not in ("count", "bytes"):
            raise ConfigurationError(f"weigh={weigh!r} is unknown: use 'count' or 'bytes'")
        self.url = url
        self.root = Path(unquote(parts.path))
        self.weigh = weigh

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
            entries = sorted(
                e.name for e in os.scandir(self.root) if e.is_dir() and not _hidden(e.name)
            )
        except OSError as exc:
            raise SourceError(
                f"cannot list source {self.url!r} ({exc.strerror or exc}): check that the "
                "share is mounted at the same path on this host and readable"
            ) from None
        if self.weigh == "count":
            return [Resource(name) for name in entries]
        return [
            Resource(name, float(max(sum(f.size for f in self.files(name)), 1))) for name in entries
        ]

    def files(self, resource: str) -> list[FileEntry]:
        base = self._resource_dir(resource)
        found: list[FileEntry] = []
        try:
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames[:] = sorted(d for d in dirnames if not _hidden(d))
                for name in filenames:
                    if _hidden(name):
                        continue
                    full = Path(dirpath) / name
                    try:
                        stat = full.stat()
                    except FileNotFoundError:
                        continue  # removed while listing
                    found.append(
                        FileEntry(str(full.relative_to(base)), stat.st_size, stat.st_mtime)
                    )
        except OSError as exc:
            raise SourceError(
                f"cannot list files of resource {resource!r} in {self.url!r}: {exc}"
            ) from None
        return sorted(found)

    def location(self, resource: str) -> str:
        # Not Path.as_uri(): Hadoop does not decode %-escapes in a path string, it takes every
        # character literally, so "x y" must stay "x y" (and "%41" stay "%41").
        return f"file://{self._resource_dir(resource)}/"
