"""Run one member as a process that works on what it owns and logs every step as JSON lines.

::

    python -m rebalancer_spark.testing.member_process --group g --backend sqlite:///tmp/g.db \
        --member-id m1 --log /tmp/m1.jsonl [--resources a,b,c] [--option session_timeout=2]

While it runs, it commits a counter per owned resource every ``--work-interval`` seconds
(starting from the progress handed over by the previous owner), and appends to the log one
line per ownership event (``acquired``, ``released``, ``lost``, ``fenced``) and per commit
(``commit`` with ``ok`` true or false, ``started_at`` when the request began and ``at`` when
its answer came: the store accepted it somewhere in between). Each line is flushed at once, so
a process killed with -9 leaves everything it did up to that instant. SIGTERM makes it leave
gracefully (drain). A member whose thread failed (``MemberFailed``) ends the process with
``MEMBER_FAILED_EXIT`` after a ``failed`` line. The multi-process tests and the benchmarks
read these logs as independent witnesses.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from json.encoder import encode_basestring_ascii
from typing import IO, Any

from rebalancer_spark.core.config import MemberConfig
from rebalancer_spark.core.errors import (
    BackendUnavailable,
    FencedError,
    MemberFailed,
    RebalancerError,
)
from rebalancer_spark.core.events import EventSink, OwnershipEvent
from rebalancer_spark.core.model import JsonValue
from rebalancer_spark.member import Member, OwnedResource, default_backend_url
from rebalancer_spark.shutdown import MEMBER_FAILED_EXIT, exit_process, stop_on_signals

__all__ = ["command", "main"]

START_RETRY_PAUSE = 0.5
"""Seconds between two attempts to join a store that was unavailable."""


def command(
    group: str,
    backend: str,
    member_id: str,
    log: str | os.PathLike[str],
    *,
    resources: Sequence[str] | None = None,
    work_interval: float | None = None,
    audit: str | os.PathLike[str] | None = None,
    options: Mapping[str, object] | None = None,
) -> list[str]:
    """The command line that runs this module as a member process with this interpreter.

    ``options`` are :class:`MemberConfig` options (``{"session_timeout": 2}``), each passed as
    ``--option key=value``; ``None`` leaves a flag out, so the process uses its default.
    """
    cmd = [
        sys.executable,
        "-m",
        "rebalancer_spark.testing.member_process",
        "--group",
        group,
        "--backend",
        backend,
        "--member-id",
        member_id,
        "--log",
        os.fspath(log),
    ]
    if audit is not None:
        cmd += ["--audit", os.fspath(audit)]
    if work_interval is not None:
        cmd += ["--work-interval", str(work_interval)]
    for key, value in (options or {}).items():
        cmd += ["--option", f"{key}={value}"]
    if resources is not None:
        cmd += ["--resources", ",".join(resources)]
    return cmd


_encode = json.JSONEncoder(sort_keys=True).encode
"""``json.dumps(..., sort_keys=True)`` without building an encoder per line (a newcomer writes
thousands of lines in one step)."""

_string = encode_basestring_ascii
"""A JSON string, as :data:`_encode` writes it (``ensure_ascii``)."""


def _text(value: str | None) -> str:
    return "null" if value is None else _string(value)


def _number(value: float | None) -> str:
    return "null" if value is None else repr(value)


_EVENT = (
    '{"at": %s, "epoch": %d, "freed": %s, "freed_at": %s, "generation": %s, "group": %s, '
    '"kind": %s, "member_id": %s, "observed_at": %s, "prev_epoch": %s, "prev_member_id": %s, '
    '"prev_session_id": %s, "reason": %s, "resource": %s, "session_id": %s}\n'
)
_HANDED = '{"at": %s, "epoch": %d, "kind": "handed", "progress": %s, "resource": %s}\n'


class Trail:
    """Appends JSON lines to a file, flushing each write, from any thread; as an event sink,
    one line per event (the events of one change in one write)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        self._append(_encode(record) + "\n")

    def write_lines(self, lines: Iterable[str]) -> None:
        """Several lines, each ending in a newline, in one write (a newcomer is handed
        thousands of resources at once: a flush per line kept its member thread waiting on
        its ``on_assigned``)."""
        self._append("".join(lines))

    def _append(self, text: str) -> None:
        with self._lock:
            self._stream.write(text)
            self._stream.flush()

    def __call__(self, event: OwnershipEvent) -> None:
        """The event sink: one line per event."""
        self.emit_many((event,))

    def emit_many(self, events: Sequence[OwnershipEvent]) -> None:
        """The events of one change, written and flushed together (before the member goes
        on: a release's lines are in the file before its claims are freed)."""
        self._append("".join(map(event_line, events)))


def event_line(event: OwnershipEvent) -> str:
    """The trail's line of ``event``: the JSON object of its fields below with sorted keys, as
    :data:`_encode` would write it, and a newline. Formatted directly: a newcomer of a
    100,000-resource group writes 6,000 of these in the step that holds what it was granted,
    and :data:`_encode` of a dict took twice as long. ``generation`` and the ``prev_*`` and
    ``freed*`` fields are the grant's link of the epoch chain: the trail's intervals end a
    killed owner's ownership where the store says, as the audit table's do."""
    return _EVENT % (
        _number(event.at),
        event.epoch,
        _text(event.freed),
        _number(event.freed_at),
        _number(event.generation),
        _string(event.group),
        _string(event.kind.value),
        _string(event.member_id),
        _number(event.observed_at),
        _number(event.prev_epoch),
        _text(event.prev_member_id),
        _text(event.prev_session_id),
        _string(event.reason),
        _string(event.resource),
        _string(event.session_id),
    )


def handed_line(resource: str, epoch: int, progress: JsonValue, at: float) -> str:
    """The trail's ``handed`` line: the progress a grant handed over, formatted as
    :data:`_encode` would (this module's counters directly, anything else through it)."""
    value = _number(progress) if progress is None or type(progress) is int else _encode(progress)
    return _HANDED % (_number(at), epoch, value, _string(resource))


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="member_process", description=__doc__.split("\n")[0])
    parser.add_argument("--group", required=True)
    parser.add_argument("--backend", default=None)
    parser.add_argument("--member-id", default=None)
    parser.add_argument("--log", required=True, help="JSON-lines file to append to")
    parser.add_argument("--resources", default=None, help="comma-separated resource ids")
    parser.add_argument("--work-interval", type=float, default=0.05)
    parser.add_argument("--audit", default=None, help="also append events to this Delta table")
    parser.add_argument(
        "--start-retry",
        type=float,
        default=25.0,
        metavar="SECONDS",
        help="how long to keep trying to join while the store is unavailable (default 25)",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any MemberConfig option, e.g. session_timeout=2",
    )
    return parser.parse_args(argv)


class _Counters:
    """The member's work: one counter per (resource, epoch), started from the progress handed
    over and committed, fenced, every ``work_interval``; every step written to the trail."""

    def __init__(self, trail: Trail) -> None:
        self.trail = trail
        self.counters: dict[tuple[str, int], int] = {}
        self.lock = threading.Lock()

    def assigned(self, owned: Sequence[OwnedResource]) -> None:
        with self.lock:
            for o in owned:
                start = o.progress if isinstance(o.progress, int) else 0
                self.counters.setdefault((o.resource, o.epoch), start)  # the loop may be ahead
            at = time.time()
            self.trail.write_lines(handed_line(o.resource, o.epoch, o.progress, at) for o in owned)

    def commit(self, member: Member, owned: OwnedResource) -> None:
        key = (owned.resource, owned.epoch)
        with self.lock:
            # assigned() may list a resource a moment before on_assigned for it ran: the
            # progress handed over travels with the OwnedResource itself.
            handed = owned.progress if isinstance(owned.progress, int) else 0
            value = self.counters.get(key, handed) + 1
        record: dict[str, object] = {
            "kind": "commit",
            "resource": owned.resource,
            "epoch": owned.epoch,
            "value": value,
            "started_at": time.time(),
        }
        try:
            member.commit(owned.resource, value, epoch=owned.epoch)
        except FencedError as exc:
            self.trail.write(record | {"ok": False, "at": time.time(), "error": str(exc)[:200]})
            return
        except RebalancerError as exc:
            error = {"kind": "commit_error", "resource": owned.resource, "error": str(exc)[:200]}
            self.trail.write(error | {"at": time.time()})
            return
        with self.lock:
            self.counters[key] = value
        self.trail.write(record | {"ok": True, "at": time.time()})


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    options: dict[str, object] = dict(o.split("=", 1) for o in args.option)
    options.update({"group": args.group, "member_id": args.member_id, "backend": args.backend})
    config = MemberConfig.from_mapping(options, default_backend=default_backend_url())
    stop = threading.Event()
    stop_on_signals(stop, signal.SIGTERM)
    with open(args.log, "a", encoding="utf-8") as stream:
        trail = Trail(stream)
        work = _Counters(trail)
        resources = None if args.resources is None else args.resources.split(",")
        sinks: list[EventSink] = [trail]
        audit = None
        if args.audit is not None:
            from rebalancer_spark.audit import DeltaAuditLog

            audit = DeltaAuditLog(args.audit)
            sinks.append(audit)
        deadline = time.monotonic() + args.start_retry
        while True:
            member = Member(
                config, resources=resources, on_assigned=work.assigned, event_sinks=sinks
            )
            try:
                member.start()
                break
            except BackendUnavailable as exc:
                # SQLite: another process paused inside a write transaction holds the file's
                # lock until it resumes; a Spark driver's start tries again likewise.
                if time.monotonic() + START_RETRY_PAUSE >= deadline:
                    print(f"error: {exc}", file=sys.stderr)
                    return 2
                print(f"warning: {exc}; trying again", file=sys.stderr, flush=True)
                time.sleep(START_RETRY_PAUSE)
            except RebalancerError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
        trail.write({"kind": "started", "member_id": member.member_id, "at": time.time()})
        print("ready", flush=True)
        code = 0
        while not stop.wait(args.work_interval):
            try:
                owned = member.assigned()
            except MemberFailed as exc:  # logged with its traceback by the member
                trail.write({"kind": "failed", "error": str(exc)[:300], "at": time.time()})
                print(f"error: {exc}", file=sys.stderr, flush=True)
                code = MEMBER_FAILED_EXIT
                break
            for o in owned:
                work.commit(member, o)
        member.stop()
        if audit is not None:
            audit.close()
        trail.write({"kind": "stopped", "member_id": member.member_id, "at": time.time()})
    return code


if __name__ == "__main__":
    exit_process(main())
