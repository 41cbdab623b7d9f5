"""Where a job reads and writes, compared: the rules that keep ``--output``, ``--audit`` and a
file ``--source`` apart. Pure functions (no I/O): the caller resolves symlinks and lists
directories and passes what it found (:mod:`rebalancer_spark.spark.path_check` does, at a
job's start-up).

Why: a job whose output lies inside its source reads its own output back as new input, one
whose output and audit share a directory writes two tables into one, and an audit table
created inside a directory of other files is a Delta table nobody asked for. Each is refused
before anything is written::

    --output /lake/a --audit /lake/a           the same directory
    --output /lake/a --audit /lake/a/audit     one inside the other (either way round)
    --source file:///landing/ --output /landing/out     output (or audit) inside the source
    --source file:///lake/raw/ --output /lake/           the source inside the output

Locations are compared after normalising: ``s3``, ``s3a`` and ``s3n`` are one scheme, a local
path and a ``file:`` URL are one, trailing slashes and ``.``/``..`` segments go, and local
paths are resolved (symlinks, relative to the working directory) by the ``realpath`` the
caller gives. Catalog table names (no path) and queue sources (no location) are not compared.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = [
    "FILE_SOURCE_SCHEMES",
    "Location",
    "Place",
    "audit_directory_problem",
    "layout_problem",
    "normalise",
    "source_location",
]

S3_SCHEMES = ("s3", "s3a", "s3n")
FILE_SOURCE_SCHEMES = ("file", *S3_SCHEMES)
"""Source schemes that have a location; every other source (queues, static lists) has none."""

Realpath = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class Location:
    """A normalised place: ``scheme`` is ``file`` (local or shared path), ``s3`` (any of
    ``s3``/``s3a``/``s3n``) or another URL scheme in lower case; ``path`` is absolute for
    ``file`` and ``bucket/key`` (no leading or trailing slash) for URL schemes."""

    scheme: str
    path: str

    def contains(self, other: Location) -> bool:
        """Whether ``other`` is this place or lies under it."""
        if self.scheme != other.scheme:
            return False
        if self.path == other.path or self.path in ("", "/"):
            return True
        return other.path.startswith(self.path.rstrip("/") + "/")

    def __str__(self) -> str:
        return self.path if self.scheme == "file" else f"{self.scheme}://{self.path}"


def normalise(text: str, *, realpath: Realpath | None = None, cwd: str = "/") -> Location:
    """``text`` (a path, a ``file:`` URL or another URL) as a :class:`Location`. Local paths
    are made absolute against ``cwd`` and passed through ``realpath`` (``os.path.realpath``
    at a job's start-up, which resolves symlinks); without it only ``.``/``..`` and slashes
    are tidied."""
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme in ("", "file"):
        path = parts.path if scheme == "file" and parts.netloc in ("", "localhost") else text
        if scheme == "file" and parts.netloc not in ("", "localhost"):
            path = f"//{parts.netloc}{parts.path}"
        path = posixpath.normpath(posixpath.join(cwd, path))
        path = realpath(path) if realpath is not None else path
        return Location("file", "/" + path.strip("/") if path.strip("/") else "/")
    key = posixpath.normpath("/" + parts.path).strip("/") if parts.path.strip("/") else ""
    where = f"{parts.netloc}/{key}" if key else parts.netloc
    return Location("s3" if scheme in S3_SCHEMES else scheme, where)


def source_location(url: str, *, realpath: Realpath | None = None) -> Location | None:
    """Where a file source's resources live (the directory or prefix holding them, options
    dropped, percent-escapes decoded as the sources decode them); None for a source without
    a location (a queue, a static list)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in FILE_SOURCE_SCHEMES:
        return None
    plain = f"{scheme}://{parts.netloc}{unquote(parts.path)}"
    return normalise(plain, realpath=realpath)


@dataclass(frozen=True, slots=True)
class Place:
    """One location a job uses: its option name (``--output``), what was given, and where
    that is (None: a catalog table name or a source without a location, not compared)."""

    option: str
    given: str
    location: Location | None


def layout_problem(
    output: Place | None, audit: Place | None, sources: Sequence[Place]
) -> str | None:
    """The first way these places overlap, as a one-line message naming both and what to do;
    None when they are apart. Checked: output and audit equal or one inside the other; output
    or audit inside a source's location, or a source's location inside either."""
    if output is not None and audit is not None:
        problem = _apart(output, audit, "the output and the audit table")
        if problem:
            return problem
    for table in (t for t in (output, audit) if t is not None):
        for source in sources:
            problem = _apart(table, source, "a table and the source")
            if problem:
                return problem
    return None


def _apart(a: Place, b: Place, what: str) -> str | None:
    if a.location is None or b.location is None:
        return None
    both = f"{a.option} {a.given} and {b.option} {b.given}"
    if a.location == b.location:
        relation = f"are the same location ({a.location})"
    elif a.location.contains(b.location):
        relation = f"overlap: {b.option} lies inside {a.option} ({b.location} in {a.location})"
    elif b.location.contains(a.location):
        relation = f"overlap: {a.option} lies inside {b.option} ({a.location} in {b.location})"
    else:
        return None
    if "--source" in (a.option, b.option):
        fix = (
            "a job would read its own writes back as input; put the output and the audit "
            "outside the source's directory, and the source outside them"
        )
    else:
        fix = f"{what} need separate directories, neither inside the other; give each its own"
    return f"{both} {relation}: {fix}"


def audit_directory_problem(audit: Place, entries: Collection[str] | None) -> str | None:
    """A message when the audit location is an existing directory that holds files but is
    not a Delta table (no ``_delta_log``); ``entries`` are the names in that directory, or
    None when it does not exist (the audit table is then created there)."""
    if entries is None or not entries or "_delta_log" in entries:
        return None
    shown = ", ".join(sorted(entries)[:3]) + (
        f" ... ({len(entries)} in all)" if len(entries) > 3 else ""
    )
    return (
        f"{audit.option} {audit.given} is an existing directory holding other files ({shown}) "
        "and no _delta_log, so it is not a Delta table: give an empty or new directory, or an "
        "existing audit table"
    )
