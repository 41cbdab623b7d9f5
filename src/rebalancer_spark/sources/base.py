"""The source contract: what a kind of input must do to be split between the members.

A source names a *set of resources* (the sub-directories of a share, the sub-prefixes of an S3
prefix, the queues of a broker) and lists them on demand with :meth:`ResourceSource.discover`.
The coordinator runs discovery at an interval and replaces the group's resource set with the
result, so a new directory is picked up and a vanished one released. A failed listing raises
:class:`SourceError` and changes nothing: resources still listed are never revoked because
the listing failed.

File-like sources also implement :class:`FileSource`: the files of one resource, so that a
job reads only what the previous owner did not commit.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from rebalancer_spark.core.model import Resource

__all__ = ["FileEntry", "FileSource", "ResourceSource"]


class ResourceSource(abc.ABC):
    """Lists the resources of one source URL."""

    url: str

    @abc.abstractmethod
    def discover(self) -> list[Resource]:
        """The resources now, sorted by id; :class:`SourceError` if the source cannot be read."""


@dataclass(frozen=True, slots=True, order=True)
class FileEntry:
    """One input file of a resource: its name relative to the resource, size and mtime."""

    name: str
    size: int
    modified: float


class FileSource(ResourceSource):
    """A source whose resources hold files."""

    @abc.abstractmethod
    def files(self, resource: str) -> list[FileEntry]:
        """The visible files of ``resource``, sorted by name."""

    @abc.abstractmethod
    def location(self, resource: str) -> str:
        """Where Spark reads the resource's files from (a path or URL ending in '/')."""
