"""The progress record of a file resource: constant in size, whatever the resource's history.

What the store holds for a file resource (names are relative to the resource)::

    {"format": 2, "watermark": "2026/11/25/f-0042.csv", "floor": "2026/11/25/f-0001.csv",
     "marks": [[1732550000.0, "2026/11/25/f-0040.csv"], ...],
     "batch": {"id": 43, "files": ["..."]} | null, "next": 44, "files": 42000,
     "changed_files": 0}

* ``watermark``: the greatest name any committed batch processed;
* ``floor``: where the next listing starts (names above it are listed; S3 ``StartAfter``, a
  sorted directory walk). With the source option ``order=none`` it stays null (every listing
  is a full one); with ``order=name`` it follows the watermark ``lookback`` seconds behind,
  through ``marks``: at most a handful of (time, watermark then) pairs, one per quarter of the
  look-back window, so a file that arrives late, under a name below the watermark, is still
  picked up if it arrives within the window;
* ``batch``: the open batch, planned and not yet committed: its files, and their fingerprints
  when the source re-reads rewritten files (``on_change=reread``). A batch whose list would
  take more than :data:`INLINE_BYTES` of JSON is kept in the plans table instead
  (:meth:`.file_history.FileHistory.save_plan`, written before this record names it), and the
  record holds only ``{"id": 43, "plan": "<digest of the list>", "count": 5000}``: the open
  batch takes at most 2 KiB of the record whatever the batch size. The owner reads such a plan
  back, and checks its digest and count, when it takes over an open batch;
* ``next``: the next batch id; ``files``: how many files the committed batches processed;
  ``changed_files``: processed files found rewritten under the same name;
* ``pending`` (the lag: files and bytes listed and not processed yet, as the owner last
  listed them) and ``stuck`` (why the owner cannot make progress: its listing or a read
  fails), both optional; ``rebalancer-spark status`` and ``assignments`` show them;
* ``reset``: the last ``rebalancer-spark progress reset`` (:mod:`.progress_requests`);
  ``request``: the id of the last operator request applied, written with (a reset) or right
  after (a skip) what it changed, so that a request is never applied twice (an owner that
  read the control record before its predecessor removed the request takes it as done).

The names of the files processed are not here: they are rows of the file history
(:mod:`.file_history`). A record of the earlier format (``{"done": [every name], "batch": …,
"next": N, "versions": {…}}``) is still read: :func:`parse` gives its names in
:attr:`FileProgress.legacy_done`, and the owner moves them to the history on its next commit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rebalancer_spark.core.errors import CorruptStateError
from rebalancer_spark.core.model import JsonValue, UnreadableProgress

__all__ = ["FORMAT", "INLINE_BYTES", "FileBatch", "FileProgress", "parse"]

FORMAT = 2
INLINE_BYTES = 2048
"""The most JSON a batch's file list may take in the record; a longer one goes to the plans
table (module docstring)."""
_MARK_SLOTS = 4
"""A new mark every ``lookback / _MARK_SLOTS`` seconds at most: at most about that many marks."""


@dataclass(frozen=True, slots=True)
class FileBatch:
    """The files of one batch of one resource, under a batch id that never changes, and the
    fingerprints they had when the batch was planned (kept only with ``on_change=reread``)."""

    id: int
    files: tuple[str, ...]
    versions: Mapping[str, str] = field(default_factory=dict, compare=False)
    plan: str | None = None
    """The digest of the list when the plans table keeps it (None: the record lists it)."""
    count: int = 0
    """With ``plan``: how many files the plan holds (``files`` is empty until it is read)."""

    @property
    def unread(self) -> bool:
        """Whether this is a record's reference to a plan whose files are not read yet."""
        return self.plan is not None and len(self.files) != self.count

    def listing(self) -> dict[str, Any]:
        """The files (and fingerprints) as the record lists them inline."""
        out: dict[str, Any] = {"files": list(self.files)}
        versions = {k: v for k, v in sorted(self.versions.items()) if v}
        if versions:
            out["versions"] = versions
        return out

    def digest(self) -> str:
        """What names this list in the plans table: the first 20 hex digits of its SHA-256."""
        text = json.dumps(self.listing(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def too_long(self) -> bool:
        """Whether the list takes more than :data:`INLINE_BYTES` as JSON."""
        return len(json.dumps(self.listing(), separators=(",", ":")).encode()) > INLINE_BYTES

    def as_json(self) -> dict[str, Any]:
        if self.plan is not None:
            return {"id": self.id, "plan": self.plan, "count": self.count}
        return {"id": self.id, **self.listing()}


@dataclass(frozen=True, slots=True)
class FileProgress:
    """A parsed progress record; see the module docstring."""

    batch: FileBatch | None = None
    next: int = 1
    watermark: str | None = None
    floor: str | None = None
    marks: tuple[tuple[float, str], ...] = ()
    files: int = 0
    changed_files: int = 0
    extra: JsonValue = None
    pending: tuple[int, int, bool] | None = None
    """Files and bytes listed and not processed yet, as the owner last listed them, and
    whether there are more (an ``order=name`` listing stops at what the next batch needs)."""
    stuck: str | None = None
    """Why the owner cannot make progress (a listing or a read that fails), or None."""
    reset: tuple[str | None, int] | None = None
    """The last ``progress reset``: history rows of batches before the second item, of names
    above the first (None: every name), are disregarded."""
    request: str | None = None
    """The id of the last operator request applied to this resource."""
    legacy_done: frozenset[str] = frozenset()
    """Names listed by a record of the earlier format, not yet moved to the history."""
    legacy_versions: Mapping[str, str] = field(default_factory=dict)

    @property
    def legacy(self) -> bool:
        return bool(self.legacy_done or self.legacy_versions)

    def as_json(self) -> JsonValue:
        out: dict[str, Any] = {
            "format": FORMAT,
            "watermark": self.watermark,
            "floor": self.floor,
            "batch": None if self.batch is None else self.batch.as_json(),
            "next": self.next,
            "files": self.files,
        }
        if self.marks:
            out["marks"] = [[t, name] for t, name in self.marks]
        if self.changed_files:
            out["changed_files"] = self.changed_files
        if self.extra is not None:
            out["extra"] = self.extra
        if self.pending is not None:
            files, size, more = self.pending
            out["pending"] = {"files": files, "bytes": size, **({"more": True} if more else {})}
        if self.stuck is not None:
            out["stuck"] = self.stuck
        if self.reset is not None:
            out["reset"] = {"after": self.reset[0], "batch": self.reset[1]}
        if self.request is not None:
            out["request"] = self.request
        return out

    def disregards(self, name: str, batch: int) -> bool:
        """Whether a history row of ``name`` from ``batch`` is void after the last reset."""
        if self.reset is None:
            return False
        after, first = self.reset
        return batch < first and (after is None or name > after)

    def done(self, batch: FileBatch, now: float, lookback: float | None) -> FileProgress:
        """This record once ``batch`` is committed at ``now``: the watermark and the floor
        moved on (``lookback``: None for ``order=none``, else seconds)."""
        assert not batch.unread, "a planned batch is read from the plans table before it is done"
        top = max(batch.files, default=None)
        watermark = self.watermark if top is None or (self.watermark or "") >= top else top
        floor, marks = self.floor, list(self.marks)
        if lookback is not None and watermark is not None:
            if lookback <= 0:
                floor, marks = watermark, []
            else:
                if not marks or now - marks[-1][0] >= lookback / _MARK_SLOTS:
                    marks.append((now, watermark))
                while marks and marks[0][0] <= now - lookback:
                    floor = marks.pop(0)[1]
        return replace(
            self,
            batch=None,
            watermark=watermark,
            floor=floor,
            marks=tuple(marks),
            files=self.files + len(batch.files),
        )


def _corrupt(resource: str, value: JsonValue) -> CorruptStateError:
    return CorruptStateError(
        f"progress of resource {resource!r} is {str(value)[:120]!r}, not the file progress "
        '{"format": 2, "watermark": ..., "batch": ..., "next": N} this job writes: was the '
        "group used by another kind of job? Inspect it with `rebalancer-spark progress show`, "
        "then `rebalancer-spark progress reset` it"
    )


def _batch(value: JsonValue) -> FileBatch | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError("batch is not a mapping")
    if value.get("plan") is not None:
        count = int(value["count"])
        if count <= 0:
            raise ValueError("a plan of no files")
        return FileBatch(int(value["id"]), (), {}, plan=str(value["plan"]), count=count)
    return FileBatch(
        int(value["id"]), tuple(str(f) for f in value["files"]), _versions(value.get("versions"))
    )


def _versions(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError("versions is not a mapping")
    return {str(k): str(v) for k, v in value.items()}


def _marks(value: object) -> tuple[tuple[float, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Sequence):
        raise TypeError("marks is not a list")
    return tuple((float(t), str(name)) for t, name in value)


def _pending(value: object) -> tuple[int, int, bool] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError("pending is not a mapping")
    return int(value["files"]), int(value["bytes"]), bool(value.get("more", False))


def _reset(value: object) -> tuple[str | None, int] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError("reset is not a mapping")
    return _name(value.get("after")), int(value["batch"])


def _name(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError("not a name")
    return value


def parse(resource: str, value: JsonValue) -> FileProgress:
    """The record ``value`` (None: nothing committed yet), of either format; raises
    :class:`CorruptStateError` for anything else."""
    if value is None:
        return FileProgress()
    if isinstance(value, UnreadableProgress):
        raise value.error()
    try:
        if not isinstance(value, Mapping):
            raise TypeError("not a mapping")
        if value.get("format") == FORMAT:
            return FileProgress(
                batch=_batch(value.get("batch")),
                next=int(value["next"]),
                watermark=_name(value.get("watermark")),
                floor=_name(value.get("floor")),
                marks=_marks(value.get("marks")),
                files=int(value.get("files", 0)),
                changed_files=int(value.get("changed_files", 0)),
                extra=value.get("extra"),
                pending=_pending(value.get("pending")),
                stuck=None if value.get("stuck") is None else str(value["stuck"]),
                reset=_reset(value.get("reset")),
                request=_name(value.get("request")),
            )
        if "format" in value:
            raise ValueError("unknown format")
        done = frozenset(str(f) for f in value["done"])
        return FileProgress(
            batch=_batch(value.get("batch")),
            next=int(value["next"]),
            watermark=max(done, default=None),
            files=len(done),
            changed_files=int(value.get("changed_files", 0)),
            extra=value.get("extra"),
            legacy_done=done,
            legacy_versions=_versions(value.get("versions")),
        )
    except (AttributeError, KeyError, TypeError, ValueError):
        raise _corrupt(resource, value) from None
