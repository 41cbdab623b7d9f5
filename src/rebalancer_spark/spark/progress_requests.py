"""Operator requests on a file resource's progress (``rebalancer-spark progress reset|skip``),
applied by the resource's owner.

A request is a small JSON file, ``<file history>/_requests/<resource, %-escaped>.json``,
written by the command and taken by whoever owns the resource, between two batches, at its
next pass (or by the next owner, when it takes the resource over): so every write of the
progress stays the owner's, fenced by its epoch in the store, and the owner's view of the
history stays true. A newer request replaces one not yet applied. The owner logs what it
applied, records it in the audit table (a ``progress`` event) and deletes the file.

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
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from rebalancer_spark.core.errors import ConfigurationError

__all__ = ["ProgressRequest", "request_path"]


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

    def write(self, path: Path) -> None:
        """Write the request atomically (a newer one replaces one not yet applied)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{self.id}.tmp")
        tmp.write_text(json.dumps(asdict(self), sort_keys=True))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> ProgressRequest | None:
        """The request at ``path``, or None; a file that is not a request is an error."""
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)
            return cls(
                str(data["action"]),
                data.get("after"),
                data.get("file"),
                None if data.get("batch") is None else int(data["batch"]),
                str(data.get("id", "")),
                str(data.get("by", "")),
                float(data.get("at", 0.0)),
            )
        except (ValueError, KeyError, TypeError):
            raise ConfigurationError(
                f"{path} is not a progress request ({text[:80]!r}): delete it and run "
                "`rebalancer-spark progress reset|skip` again"
            ) from None


def request_path(history_uri: str, resource: str) -> Path:
    """Where a request for ``resource`` lives, next to the file history at ``history_uri``
    (a local or shared path: requests are files)."""
    parts = urlsplit(history_uri)
    if parts.scheme not in ("", "file"):
        raise ConfigurationError(
            f"the file history {history_uri!r} is not on a local or shared path: progress "
            "requests need one (give the jobs --files-history on a shared path)"
        )
    root = Path(parts.path if parts.scheme else history_uri)
    return root / "_requests" / f"{quote(resource, safe='')}.json"
