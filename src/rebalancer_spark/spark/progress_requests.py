"""Operator requests on a file resource's progress (``rebalancer-spark progress reset|skip``),
applied by the resource's owner.

A request is a small JSON text that the command leaves in the group's control record, in the
store (``Control.requests``, one per resource: :meth:`GroupControl.request_progress`), wherever
the file history lives (a local path, a shared mount, S3). The owner of the resource takes it
between two batches, at its next pass (or the next owner, when it takes the resource over); the
owners read the control record at most once a second per job, whatever their number of
resources (a new owner's first look reads it afresh). So every write of the progress stays
the owner's, fenced by its epoch in the store,
and the owner's view of the history stays true. A newer request replaces one not yet applied.
The owner logs what it applied, records it in the audit table (a ``progress`` event) and
removes it from the control record (compare-and-set: a newer request left meanwhile stays for
the next pass). Leaving and taking a request show in the control record's history and as
``control`` rows in the audit table.

Actions:

* ``reset`` ``after`` (a name, or None for everything): the files whose name sorts above
  ``after`` are read again. History rows of earlier batches above that name are disregarded
  from then on (the record keeps ``reset``: the name and the first batch after it), the
  listing floor and the watermark go back to ``after``; a later reset replaces an earlier one;
* ``skip`` ``file``: the file is recorded as processed without being read;
* ``skip`` ``batch``: the open batch of that id is recorded as processed without being read
  (the way out of a batch whose read fails on a file that cannot be fixed).
"""

from __future__ import annotations

import getpass
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from rebalancer_spark.core.errors import ConfigurationError, RebalancerError
from rebalancer_spark.member import Member

__all__ = ["ControlRequests", "ProgressRequest"]

log = logging.getLogger("rebalancer_spark.ingest")


@dataclass(frozen=True, slots=True)
class ProgressRequest:
    """One operator request; see the module docstring."""

    action: str
    after: str | None = None
    file: str | None = None
    batch: int | None = None
    id: str = ""
    by: str = ""
    at: float = 0.0

    @classmethod
    def make(
        cls,
        action: str,
        *,
        after: str | None = None,
        file: str | None = None,
        batch: int | None = None,
    ) -> ProgressRequest:
        by = f"{getpass.getuser()}@{socket.gethostname()}"
        return cls(action, after, file, batch, uuid.uuid4().hex[:12], by, time.time())

    def describe(self) -> str:
        if self.action == "reset":
            return f"reset: read again every file above {self.after!r}" if self.after else (
                "reset: read every file again"
            )  # fmt: skip
        if self.file is not None:
            return f"skip file {self.file!r}"
        return f"skip batch {self.batch}"

    def encode(self) -> str:
        """The request as the control record keeps it."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str, where: str) -> ProgressRequest:
        """The request ``text`` (from ``where``); anything else is a configuration error."""
        try:
            data = json.loads(text)
            request = cls(
                str(data["action"]),
                _text(data.get("after")),
                _text(data.get("file")),
                None if data.get("batch") is None else int(data["batch"]),
                str(data.get("id", "")),
                str(data.get("by", "")),
                float(data.get("at", 0.0)),
            )
            targets = (request.file is not None) + (request.batch is not None)
            if request.action not in ("reset", "skip") or not request.id:
                raise ValueError("unknown action, or no id")
            if targets != (request.action == "skip") or (request.after and targets):
                raise ValueError("a skip names one file or batch, a reset neither")
            return request
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConfigurationError(
                f"{where} is not a progress request ({text[:80]!r}): run `rebalancer-spark "
                "progress reset|skip` again to replace it"
            ) from None


def _text(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError("not a name")
    return value


class ControlRequests:
    """The operators' progress requests of one member's group, for its owned resources: the
    control record read at most once per ``interval`` seconds (module docstring), and a request
    removed once applied. A store that cannot be read now leaves the last answer in place: a
    request waits, nothing else does."""

    def __init__(self, member: Member, interval: float = 1.0) -> None:
        self._member = member
        self._interval = interval
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._requests: Mapping[str, str] = {}

    def pending(self, resource: str, *, fresh: bool = False) -> str | None:
        """The request left for ``resource`` (JSON text), if any; ``fresh``: read the record
        now whatever the interval (a new owner's first look)."""
        with self._lock:
            now = time.monotonic()
            if fresh or self._read_at is None or now - self._read_at >= self._interval:
                try:
                    self._requests = self._member.group_control().control().requests
                except RebalancerError as exc:
                    log.debug("progress requests of %s not read now: %s", self._member, exc)
                self._read_at = now
            return self._requests.get(resource)

    def taken(self, resource: str, request: str) -> None:
        """``request`` of ``resource`` was applied: remove it from the control record."""
        self._member.group_control().take_request(resource, request)
        with self._lock:
            self._requests = {r: q for r, q in self._requests.items() if r != resource}
