"""The output table checked against the audit table: was every batch written by its owner?

Use case: ``verify_output(audit_path, output_path).report()`` after a run or an incident, or
``rebalancer-spark audit verify AUDIT --output TABLE``. The output table's commits are read
from its Delta log through ``DeltaTable.history()`` (the ``commitInfo`` of every commit, no
data file is opened: thousands of commits read in well under a second on a local disk), on a
local path or ``s3://`` with deltalake storage options. Each commit of the fenced writer says
group, resource, member session, epoch and batch (``rebalancer.*`` keys); the rules are in
:mod:`rebalancer_spark.core.output_rules`. Commits without ``rebalancer.kind`` (the table's
creation, another writer) are *foreign*: listed, not judged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from rebalancer_spark.audit.rows import load_rows
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.output_rules import (
    RULES,
    OutputCommit,
    OutputViolation,
    check_commits,
    grants,
    utc,
)
from rebalancer_spark.core.urls import redact_url

__all__ = ["ForeignCommit", "OutputLog", "OutputVerdict", "read_output_log", "verify_output"]

_PREFIX = "rebalancer."
_KINDS = frozenset({"data", "fence"})
_SHOWN_VIOLATIONS = 20
_SHOWN_FOREIGN = 10
_OUTPUT_COLUMNS = ("_resource", "_batch")


@dataclass(frozen=True, slots=True)
class ForeignCommit:
    """A commit of the output table that the fenced writer did not make."""

    version: int
    at: float
    operation: str


@dataclass(frozen=True)
class OutputLog:
    """The commits of an output table, in version order."""

    commits: tuple[OutputCommit, ...]
    foreign: tuple[ForeignCommit, ...]
    first_version: int
    """The oldest version whose commit is still in the log (0 unless old log entries were
    cleaned up)."""
    last_version: int


@dataclass(frozen=True)
class OutputVerdict:
    """What the output table proves against the audit table."""

    ok: bool
    output: str
    data_commits: int
    fence_commits: int
    resources: int
    foreign: tuple[ForeignCommit, ...]
    violations: tuple[OutputViolation, ...]
    first_version: int
    last_version: int
    tolerance: float
    notes: tuple[str, ...]

    @property
    def first_violation(self) -> OutputViolation | None:
        return self.violations[0] if self.violations else None

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["first_violation"] = asdict(self.violations[0]) if self.violations else None
        return data

    def report(self) -> str:
        """The verdict in one line, the first offending commit in full, the other violations
        (up to 20), the foreign commits and the notes."""
        counts = (
            f"{_count(self.data_commits, 'data commit')} and "
            f"{_count(self.fence_commits, 'fence')} of {_count(self.resources, 'resource')}, "
            f"versions {self.first_version}-{self.last_version} of {self.output}, "
            f"tolerance {self.tolerance:g} s"
        )
        first = self.first_violation
        if first is None:
            lines = [
                "output OK: every data commit was made by its resource's owner at that epoch, "
                f"inside its ownership, and no batch twice ({counts})"
            ]
        else:
            lines = [
                f"output FAILED: {_count(len(self.violations), 'violation')} ({counts})",
                f"first offending commit: {_describe(first)}",
                f"  broke rule {RULES[first.rule]}: {first.detail}",
            ]
            rest = self.violations[1:]
            if rest:
                lines.append(f"other violations ({min(len(rest), _SHOWN_VIOLATIONS)} shown):")
                for v in rest[:_SHOWN_VIOLATIONS]:
                    lines.append(f"  {_describe(v)}: rule {v.rule}: {v.detail}")
                if len(rest) > _SHOWN_VIOLATIONS:
                    lines.append(f"  ... and {len(rest) - _SHOWN_VIOLATIONS} more")
        if self.foreign:
            shown = ", ".join(f"v{f.version} {f.operation}" for f in self.foreign[:_SHOWN_FOREIGN])
            more = "" if len(self.foreign) <= _SHOWN_FOREIGN else ", ..."
            lines.append(
                f"foreign commits (not by the fenced writer, not judged): {len(self.foreign)}: "
                f"{shown}{more}"
            )
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)


def read_output_log(path: str, storage_options: Mapping[str, str] | None = None) -> OutputLog:
    """The commits of the output Delta table at ``path`` (its ``commitInfo`` entries)."""
    options = dict(storage_options or {})
    try:
        table = DeltaTable(path, storage_options=options or None)
        entries = table.history()
    except TableNotFoundError as exc:
        raise ConfigurationError(
            f"no Delta output table at {redact_url(path)}: pass the path the jobs write their "
            "output to (--output)"
        ) from exc
    except Exception as exc:
        raise ConfigurationError(
            f"cannot read the Delta log of the output table at {redact_url(path)} "
            f"({type(exc).__name__}: {_first_line(exc, options)}); check the path and the "
            "storage options (credentials, endpoint)"
        ) from exc
    columns = {field.name for field in table.schema().fields}
    missing = [name for name in _OUTPUT_COLUMNS if name not in columns]
    if missing:
        raise ConfigurationError(
            f"the Delta table at {redact_url(path)} has no {' or '.join(missing)} column: it "
            "is not an output table of the fenced writer (is it the audit table?); pass the "
            "jobs' --output table"
        )
    return parse_history(entries)


def parse_history(entries: Iterable[Mapping[str, object]]) -> OutputLog:
    """An :class:`OutputLog` from ``DeltaTable.history()`` entries (any order)."""
    commits: list[OutputCommit] = []
    foreign: list[ForeignCommit] = []
    versions: list[int] = []
    for entry in entries:
        version = _integer(entry.get("version"))
        if version is None:
            continue
        versions.append(version)
        at = (_integer(entry.get("timestamp")) or 0) / 1000.0
        if _PREFIX + "kind" not in entry:
            foreign.append(ForeignCommit(version, at, str(entry.get("operation") or "?")))
            continue
        commits.append(_commit(version, at, entry))
    commits.sort(key=lambda c: c.version)
    foreign.sort(key=lambda f: f.version)
    return OutputLog(
        tuple(commits), tuple(foreign), min(versions, default=0), max(versions, default=-1)
    )


def verify_output(
    audit_path: str,
    output_path: str,
    *,
    group: str | None = None,
    tolerance: float = 0.0,
    storage_options: Mapping[str, str] | None = None,
    output_storage_options: Mapping[str, str] | None = None,
) -> OutputVerdict:
    """Judge the output table at ``output_path`` against the audit table at ``audit_path``
    (``group``'s commits only, if given). ``output_storage_options`` defaults to
    ``storage_options``."""
    log = read_output_log(
        output_path, storage_options if output_storage_options is None else output_storage_options
    )
    audit = load_rows(audit_path, group=group, storage_options=storage_options)
    notes = []
    if not audit.has_chain:
        notes.append(
            "the audit table predates the chain columns: a killed owner's ownership is taken "
            "to end when the next epoch was granted (no lease expiry recorded)"
        )
    return judge(
        log,
        audit.rows,
        output=redact_url(output_path),
        group=group,
        tolerance=tolerance,
        notes=notes,
    )


def judge(
    log: OutputLog,
    events: Sequence[Mapping[str, object]],
    *,
    output: str,
    group: str | None = None,
    tolerance: float = 0.0,
    notes: Sequence[str] = (),
) -> OutputVerdict:
    """The verdict on ``log`` against audit rows ``events`` (no I/O)."""
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ConfigurationError(
            f"tolerance {tolerance!r} is not a number of seconds >= 0; use 0, or the clock "
            "skew between the jobs' hosts"
        )
    commits = [c for c in log.commits if group is None or c.group == group]
    found = check_commits(commits, grants(events), tolerance=tolerance)
    extra = list(notes)
    if log.first_version > 0:
        extra.append(
            f"the log starts at version {log.first_version}: older commits were cleaned up "
            "(delta.logRetentionDuration) and are not checked"
        )
    if group is not None and len(commits) < len(log.commits):
        extra.append(f"{len(log.commits) - len(commits)} commits of other groups not checked")
    if not commits:
        extra.append("no commit of the fenced writer in the output table: nothing to check")
    return OutputVerdict(
        ok=not found,
        output=output,
        data_commits=sum(1 for c in commits if c.kind == "data"),
        fence_commits=sum(1 for c in commits if c.kind == "fence"),
        resources=len({(c.group, c.resource) for c in commits}),
        foreign=log.foreign,
        violations=tuple(found),
        first_version=log.first_version,
        last_version=log.last_version,
        tolerance=tolerance,
        notes=tuple(extra),
    )


def _commit(version: int, at: float, entry: Mapping[str, object]) -> OutputCommit:
    def text(name: str) -> str:
        value = entry.get(_PREFIX + name)
        return "" if value is None else str(value)

    problems = [f"rebalancer.{name} missing" for name in _REQUIRED if not text(name)]
    kind = text("kind")
    if kind not in _KINDS:
        problems.append(f"rebalancer.kind {kind!r} is neither 'data' nor 'fence'")
    numbers: dict[str, int] = {}
    for name in ("epoch", "batch", "rows"):
        raw = text(name)
        value = _integer(raw) if raw else None
        if raw and value is None:
            problems.append(f"rebalancer.{name} {raw!r} is not a whole number")
        numbers[name] = value if value is not None else -1
    return OutputCommit(
        version=version,
        at=at,
        kind=kind,
        group=text("group"),
        resource=text("resource"),
        member_id=text("member_id"),
        session_id=text("session_id"),
        epoch=numbers["epoch"],
        batch=numbers["batch"],
        rows=numbers["rows"] if numbers["rows"] >= 0 else None,
        problem="; ".join(problems) or None,
    )


_REQUIRED = ("group", "resource", "member_id", "session_id", "epoch", "batch")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _describe(v: OutputViolation) -> str:
    c = v.commit
    return (
        f"version {c.version} ({c.kind}) at {utc(c.at)}: resource {c.resource} epoch {c.epoch} "
        f"batch {c.batch} by member {c.member_id} (session {c.session_id}, group {c.group})"
    )


def _integer(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return int(text)
    return None


def _first_line(exc: BaseException, options: Mapping[str, str]) -> str:
    text = " ".join(str(exc).split())[:300]
    for value in options.values():
        if len(value) >= 4:
            text = text.replace(value, "***")
    return redact_url(text)
