"""``rebalancer-spark``: the operator's view of a group and of its audit trail.

    rebalancer-spark status      --group G [--backend URL] [--json]
    rebalancer-spark members     --group G [--backend URL] [--json]
    rebalancer-spark assignments --group G [--backend URL] [--json]
    rebalancer-spark audit verify  PATH [--output TABLE] [--group G] [--tolerance S] [--json]
    rebalancer-spark audit history PATH [--group G] [--resource R] [--since T] [--json]
    rebalancer-spark history --audit PATH [--group G] [--resource R] [--since T] [--json]
    rebalancer-spark audit timeline PATH --out FILE.png [--lanes L] [--group G] [--since T] [--json]
    rebalancer-spark audit rebalances PATH [--group G] [--window S] [--since T] [--json]
    rebalancer-spark audit owners PATH [--group G] [--json]
    rebalancer-spark pause|resume|rebalance|reset --group G [--backend URL] [--json]
    rebalancer-spark drain MEMBER [--timeout S] | undrain MEMBER   --group G [--backend URL]
    rebalancer-spark pin RESOURCE MEMBER | unpin RESOURCE           --group G [--backend URL]
    rebalancer-spark threshold VALUE                                --group G [--backend URL]

``--backend`` defaults to the SQLite file in ``$REBALANCER_HOME`` that jobs use by default.
The reading commands only read: a SQLite file that does not exist yet is reported as an empty
group, not created. The control commands change the group's control record (see
``docs/control.md``). Exit status:

* 0: done (``status`` is informative and never fails a check; a control change that is
  already in effect is done too);
* 1: a check failed: ``audit verify`` found a resource owned by two members at once, or (with
  ``--output``) an output commit that broke a rule of the output check;
* 2: bad input (usage, URL, group, member or resource name, audit path, nothing to draw) or a
  store that cannot be reached;
* 3: refused by the group's state (``rebalance`` or ``drain`` while paused);
* 4: timed out: ``drain`` saw the member still owning resources after ``--timeout``;
* 130: interrupted (Ctrl-C).

An error is one line on standard error saying what happened and what to do; passwords in
URLs are shown as ``***``. Only the standard library and the core are imported at start-up;
the audit commands import ``deltalake`` when they run, ``audit timeline`` also matplotlib.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, NoReturn

from rebalancer_spark import __version__
from rebalancer_spark.backends import check_backend_url, open_backend
from rebalancer_spark.core.control import Control, imbalance
from rebalancer_spark.core.errors import RebalancerError
from rebalancer_spark.core.model import (
    GroupState,
    Progress,
    validate_group,
    validate_member_id,
    validate_resource_id,
)
from rebalancer_spark.core.urls import redact_url
from rebalancer_spark.member import default_backend_url
from rebalancer_spark.member.control import ControlRefused, GroupControl
from rebalancer_spark.shutdown import exit_process

__all__ = ["main"]

PROG = "rebalancer-spark"
EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_REFUSED, EXIT_TIMEOUT = 0, 1, 2, 3, 4
_EPILOG = (
    "exit status: 0 ok; 1 a check failed (audit verify found two owners at once or, with "
    "--output, an output commit breaking a rule; status "
    "never fails); 2 bad input or unreachable store; 3 refused by the group's state "
    "(rebalance or drain while paused); 4 timed out (drain still owning after --timeout). "
    "--backend defaults to groups.db in $REBALANCER_HOME (default "
    "~/.local/state/rebalancer-spark)."
)


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (``error: ...; see --help``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        _fail(f"{message}; see '{self.prog} --help'")


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    print(f"{PROG}: error: {redact_url(' '.join(message.split()))}", file=sys.stderr)
    raise SystemExit(code)


# -- reading the store ---------------------------------------------------------------------


def _snapshot(args: argparse.Namespace) -> tuple[str, GroupState, dict[str, Progress]]:
    """(redacted backend URL, group state, resource -> last progress) without writing."""
    group = validate_group(args.group)
    url = args.backend or default_backend_url()
    parsed = check_backend_url(url)
    if parsed.scheme == "sqlite" and not os.path.exists(parsed.path):
        return parsed.redacted(), GroupState(group, {}, None, {}, 0, None, {}), {}
    with open_backend(url) as backend:
        state = backend.state(group)
        names = set(state.resources) | set(state.claims)
        done = backend.progress(group, sorted(names)) if args.command == "assignments" else {}
    return parsed.redacted(), state, done


def _members(state: GroupState) -> list[dict[str, Any]]:
    owned = {m: 0 for m in state.members}
    for claim in state.claims.values():
        owned[claim.member_id] = owned.get(claim.member_id, 0) + 1
    return [
        {
            "member_id": m.member_id,
            "host": m.info.get("host"),
            "pid": m.info.get("pid"),
            "spark_app_id": m.info.get("spark_app_id"),
            "leaving": m.leaving,
            "static": m.static,
            "acked_generation": m.acked_generation,
            "coordinator": state.coordinator is not None
            and state.coordinator.session_id == m.session_id,
            "owned": owned[m.member_id],
        }
        for m in sorted(state.members.values(), key=lambda rec: rec.member_id)
    ]


def _assignments(state: GroupState, progress: Mapping[str, Progress]) -> list[dict[str, Any]]:
    targets = state.target.owner_of() if state.target else {}
    names = sorted(set(state.resources) | set(state.claims) | set(targets))
    claims, done = state.claims, progress
    return [
        {
            "resource": r,
            "owner": claims[r].member_id if r in claims else None,
            "epoch": claims[r].epoch if r in claims else None,
            "target_owner": targets.get(r),
            "progress_epoch": done[r].epoch if r in done else None,
            "progress_member": done[r].member_id if r in done else None,
        }
        for r in names
    ]


def _number(value: float) -> int | float:
    """``value`` as an int when it is whole (counts), else rounded for display."""
    return int(value) if float(value).is_integer() else round(value, 3)


def _status(backend: str, state: GroupState) -> dict[str, Any]:
    members = _members(state)
    # As the imbalance threshold measures it (docs/control.md): weighted load of the unpinned
    # resources over the members that may own (not leaving, not drained).
    control = state.control
    eligible = [
        m["member_id"] for m in members if not m["leaving"] and m["member_id"] not in control.drain
    ]
    held: dict[str, set[str]] = {}
    for name, claim in state.claims.items():
        if name not in control.pins:
            held.setdefault(claim.member_id, set()).add(name)
    weights = {name: res.weight for name, res in state.resources.items()}
    owners: dict[str, list[dict[str, Any]]] = {m["member_id"]: [] for m in members}
    for name, claim in sorted(state.claims.items()):
        owners.setdefault(claim.member_id, []).append({"resource": name, "epoch": claim.epoch})
    coord, target = state.coordinator, state.target
    return {
        "group": state.group,
        "backend": backend,
        "members": members,
        "coordinator": {"member_id": coord.member_id, "epoch": coord.epoch} if coord else None,
        "target": None
        if target is None
        else {
            "generation": target.generation,
            "phase": str(target.phase),
            "coordinator_epoch": target.coordinator_epoch,
            "resources_version": target.resources_version,
        },
        "resources": {"count": len(state.resources), "version": state.resources_version},
        "owners": owners,
        "unowned": sorted(set(state.resources) - set(state.claims)),
        "imbalance": _number(imbalance(held, weights, eligible)),
        "stable": state.is_stable(),
        "control": _control_status(state),
    }


def _control_status(state: GroupState) -> dict[str, Any]:
    c = state.control
    owned = {m: 0 for m in c.drain}
    for claim in state.claims.values():
        if claim.member_id in owned:
            owned[claim.member_id] += 1
    return {
        "mode": str(c.mode),
        "version": c.version,
        "rebalance_requests": c.rebalance_requests,
        "imbalance_threshold": c.imbalance_threshold,
        "drain": [
            {"member_id": m, "present": m in state.members, "owned": owned[m]}
            for m in sorted(c.drain)
        ],
        "pins": [
            {
                "resource": r,
                "member_id": m,
                "owner": state.claims[r].member_id if r in state.claims else None,
            }
            for r, m in sorted(c.pins.items())
        ],
        "history": [
            {"version": v, "at": _control_time(at), "what": what} for v, at, what in c.history
        ],
    }


def _control_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


# -- printing -------------------------------------------------------------------------------


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [list(headers), *([_cell(v) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _members_table(members: Sequence[Mapping[str, Any]]) -> str:
    keys = ("member_id", "host", "pid", "spark_app_id", "coordinator", "leaving", "static")
    heads = ("MEMBER", "HOST", "PID", "SPARK APP", "COORDINATOR", "LEAVING", "STATIC", "ACKED")
    rows = [[m[k] for k in (*keys, "acked_generation", "owned")] for m in members]
    return _table((*heads, "OWNED"), rows)


def _print_status(status: Mapping[str, Any]) -> None:
    coord, target, res = status["coordinator"], status["target"], status["resources"]
    print(f"group {status['group']} on {status['backend']}")
    leader = f"{coord['member_id']} (epoch {coord['epoch']})" if coord else "none"
    print(f"coordinator: {leader}")
    if target:
        print(
            f"target: generation {target['generation']}, phase {target['phase']}, "
            f"coordinator epoch {target['coordinator_epoch']}"
        )
    else:
        print("target: none published")
    print(f"resources: {res['count']} (version {res['version']})")
    print(f"imbalance: {status['imbalance']}, stable: {_cell(status['stable'])}")
    last = status.get("last_rebalance")
    if last:
        if last["by_generation"]:
            what = f"generation {last['generation']} ({last['reason'] or last['trigger']})"
            basis = ""
        else:
            what = f"#{last['number']}"
            basis = " (guessed by clustering: the audit table has no rebalance rows)"
        print(
            f"last rebalance: {what} at {last['start']} UTC, took "
            f"{last['duration']:.3f} s, {last['moved']} moved, {last['assigned']} assigned{basis}"
        )
    elif status.get("audit_given"):
        print("last rebalance: none in the audit table")
    else:
        print("last rebalance: give --audit PATH to see it")
    _print_control(status["control"])
    if not status["members"]:
        print(f"no members: no live member in group {status['group']}")
    else:
        print(f"\nmembers: {len(status['members'])}\n{_members_table(status['members'])}")
    if status["owners"]:
        print("\nowners:")
        for member, claims in status["owners"].items():
            held = ", ".join(f"{c['resource']} (epoch {c['epoch']})" for c in claims)
            print(f"  {member}: {held or 'nothing'}")
    print(f"unowned: {', '.join(status['unowned']) or 'none'}")


def _print_control(control: Mapping[str, Any]) -> None:
    drains = ", ".join(
        f"{d['member_id']} (owns {d['owned']}{'' if d['present'] else ', gone'})"
        for d in control["drain"]
    )
    pins = ", ".join(
        f"{p['resource']} -> {p['member_id']} (owner {p['owner'] or 'none'})"
        for p in control["pins"]
    )
    print(
        f"control: {control['mode']} (version {control['version']}), imbalance threshold "
        f"{control['imbalance_threshold']:g}, rebalance requests {control['rebalance_requests']}"
    )
    print(f"draining: {drains or 'none'}")
    print(f"pinned: {pins or 'none'}")
    if control["history"]:
        print("control history:")
        for h in control["history"]:
            print(f"  v{h['version']}  {h['at']}  {h['what']}")


def _emit(as_json: bool, data: object, human: Callable[[], None]) -> None:
    if as_json:
        print(json.dumps(_finite(data), sort_keys=True, allow_nan=False))
    else:
        human()


def _finite(value: Any) -> Any:
    """``value`` with open-ended times (infinite floats) as None, for strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


# -- commands ---------------------------------------------------------------------------------


def _cmd_status(args: argparse.Namespace) -> int:
    backend, state, _ = _snapshot(args)
    status = _status(backend, state)
    status["last_rebalance"] = _last_rebalance(args.audit, state.group) if args.audit else None
    _emit(args.json, status, lambda: _print_status({**status, "audit_given": bool(args.audit)}))
    return EXIT_OK


def _last_rebalance(path: str, group: str) -> dict[str, Any] | None:
    """The group's last rebalance as the audit table at ``path`` tells it (see
    ``audit rebalances`` for the definition), or None if the table has none."""
    from rebalancer_spark.audit.rows import load_rows

    found = _audit().rebalances(load_rows(path, group=group).rows)
    if not found:
        return None
    last = found[-1]
    return {
        "number": last.number,
        "generation": last.generation,
        "trigger": last.trigger,
        "reason": last.reason,
        "start": _utc(last.start),
        "duration": round(last.duration, 3),
        "moved": last.moved,
        "assigned": last.assigned,
        "members": list(last.members),
        "by_generation": last.by_generation,
    }


def _cmd_members(args: argparse.Namespace) -> int:
    backend, state, _ = _snapshot(args)
    members = _members(state)
    empty = f"no members: no live member in group {state.group} on {backend}"
    data = {"group": state.group, "backend": backend, "members": members}
    _emit(args.json, data, lambda: print(_members_table(members) if members else empty))
    return EXIT_OK


def _cmd_assignments(args: argparse.Namespace) -> int:
    backend, state, progress = _snapshot(args)
    rows = _assignments(state, progress)
    heads = ("RESOURCE", "OWNER", "EPOCH", "TARGET OWNER", "PROGRESS EPOCH")
    keys = ("resource", "owner", "epoch", "target_owner", "progress_epoch")
    table = _table(heads, [[r[k] for k in keys] for r in rows])
    empty = f"no resources in group {state.group} on {backend}"
    data = {"group": state.group, "backend": backend, "assignments": rows}
    _emit(args.json, data, lambda: print(table if rows else empty))
    return EXIT_OK


def _audit() -> Any:
    try:
        from rebalancer_spark import audit
    except ImportError as exc:
        _fail(f"the audit commands need deltalake and pyarrow ({exc})")
    return audit


def _cmd_verify(args: argparse.Namespace) -> int:
    group = validate_group(args.group) if args.group is not None else None
    options = _storage_options(args.storage_option)
    verdict = _audit().verify_table(
        args.path, group=group, tolerance=args.tolerance, storage_options=options or None
    )
    data: dict[str, Any] = asdict(verdict)
    reports = [verdict.report()]
    ok = verdict.ok
    if args.output is not None:
        from rebalancer_spark.audit.output_check import verify_output

        checked = verify_output(
            args.path,
            args.output,
            group=group,
            tolerance=args.tolerance,
            storage_options=options or None,
        )
        data["output"] = checked.as_dict()
        reports.append(checked.report())
        ok = ok and checked.ok
    _emit(args.json, data, lambda: print("\n".join(reports)))
    return EXIT_OK if ok else EXIT_CHECK_FAILED


def _storage_options(pairs: Sequence[str] | None) -> dict[str, str]:
    """``KEY=VALUE`` pairs as deltalake storage options (values never shown)."""
    options: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            _fail(
                f"--storage-option {key.strip() or '(empty)'!r} is not KEY=VALUE; give e.g. "
                "--storage-option AWS_ENDPOINT_URL=http://host:9000 (or set the AWS_* "
                "environment variables)"
            )
        options[key.strip()] = value
    return options


def _cmd_history(args: argparse.Namespace) -> int:
    audit = _audit()
    events = _audit_events(args)
    lines: list[str] = audit.history(events)
    _emit(args.json, {"events": events}, lambda: print("\n".join(lines) or "no events"))
    return EXIT_OK


# -- control commands ---------------------------------------------------------------------------

_DONE = {
    "pause": ("paused", "already paused"),
    "resume": ("resumed", "already running (not paused)"),
    "rebalance": ("rebalance requested", "rebalance requested"),
    "reset": ("control reset to the default", "control already at the default"),
    "drain": ("drain of {member} requested", "{member} already draining"),
    "undrain": ("{member} no longer drained", "{member} was not draining"),
    "pin": ("{resource} pinned to {member}", "{resource} already pinned to {member}"),
    "unpin": ("{resource} unpinned", "{resource} was not pinned"),
    "threshold": ("imbalance threshold set to {value:g}", "imbalance threshold already {value:g}"),
}


def _actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _change(ops: GroupControl, args: argparse.Namespace) -> tuple[Control, bool]:
    command = args.command
    if command == "pause":
        return ops.pause()
    if command == "resume":
        return ops.resume()
    if command == "rebalance":
        return ops.rebalance()
    if command == "reset":
        return ops.reset()
    if command == "drain":
        return ops.drain(validate_member_id(args.member))
    if command == "undrain":
        return ops.undrain(validate_member_id(args.member))
    if command == "pin":
        return ops.pin(validate_resource_id(args.resource), validate_member_id(args.member))
    if command == "unpin":
        return ops.unpin(validate_resource_id(args.resource))
    return ops.set_threshold(args.value)


def _cmd_control(args: argparse.Namespace) -> int:
    group = validate_group(args.group)
    url = args.backend or default_backend_url()
    shown = check_backend_url(url)
    if shown.scheme == "sqlite" and not os.path.exists(shown.path):
        _fail(
            f"store {shown.redacted()} does not exist: check --backend (a control command "
            "never creates a store; the jobs create it when they join)"
        )
    with open_backend(url) as backend:
        state = backend.state(group)
        if not (args.force or state.members or state.resources or state.target):
            _fail(
                f"group {group!r} on {shown.redacted()} has no members, resources or target: "
                f"check --group ('{PROG} status' lists a group's members), or give --force to "
                "set its control before its jobs start"
            )
        ops = GroupControl(backend, group, actor=_actor())
        _, changed = _change(ops, args)
        names = {k: getattr(args, k, None) for k in ("member", "resource", "value")}
        message = _DONE[args.command][0 if changed else 1].format(**names)
        data: dict[str, Any] = {
            "group": group,
            "backend": shown.redacted(),
            "command": args.command,
            "changed": changed,
        }
        code = EXIT_OK
        if args.command == "drain" and args.timeout > 0:
            progress = ops.wait_drained(args.member, args.timeout)
            data["drained"], data["owned"] = progress.done, progress.owned
            if progress.done:
                gone = "" if progress.present else " (it left the group)"
                message = f"drain of {args.member} done: it owns nothing{gone}"
            else:
                code = EXIT_TIMEOUT
        state = backend.state(group)
        data["control"] = _control_status(state)
    version = data["control"]["version"]
    _emit(args.json, data, lambda: print(f"group {group}: {message} (control version {version})"))
    if code == EXIT_TIMEOUT:
        _fail(
            f"drain of member {args.member!r} in group {group!r} timed out after "
            f"{args.timeout:g} s: it still owns or is assigned {data['owned']} resources; check "
            f"that the group has a coordinator ('{PROG} status --group {group}'), then run "
            f"drain again with a longer --timeout",
            EXIT_TIMEOUT,
        )
    return code


def _threshold_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"imbalance threshold {text!r} is not a finite number >= 0 (0 balances always)"
        )
    return value


def _timeout_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"timeout {text!r} is not a number of seconds >= 0")
    return value


_POSITIONAL_HELP = {
    "member": "a member id, as 'rebalancer-spark members' shows it",
    "resource": "a resource id, as 'rebalancer-spark assignments' shows it",
    "value": "a number >= 0 (counts, or weights for weighted resources); 0 always balances",
}


def _add_control_commands(commands: Any) -> None:
    specs: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
        ("pause", "freeze ownership: nothing owned moves; orphans still get an owner", ()),
        ("resume", "end a pause: rebalance what changed meanwhile", ()),
        (
            "rebalance",
            "list the source and force one full rebalance now (ignores debounce and threshold)",
            (),
        ),
        ("reset", "back to the default control: active, no drains, no pins, threshold 0", ()),
        (
            "drain",
            "move everything away from a live member and wait until it owns nothing",
            (("member", "MEMBER"),),
        ),
        ("undrain", "let a drained member own resources again", (("member", "MEMBER"),)),
        (
            "pin",
            "keep a resource on a member while that member is in the group",
            (("resource", "RESOURCE"), ("member", "MEMBER")),
        ),
        ("unpin", "let a pinned resource be balanced again", (("resource", "RESOURCE"),)),
        (
            "threshold",
            "no moves while max - min owned (weighted) stays at or under VALUE",
            (("value", "VALUE"),),
        ),
    )
    for name, text, positionals in specs:
        sub = commands.add_parser(name, help=text, description=text, epilog=_EPILOG)
        for dest, metavar in positionals:
            kind = _threshold_value if dest == "value" else str
            sub.add_argument(dest, metavar=metavar, type=kind, help=_POSITIONAL_HELP[dest])
        if name == "drain":
            sub.add_argument(
                "--timeout",
                type=_timeout_seconds,
                default=60.0,
                metavar="SECONDS",
                help="how long to wait for the member to own nothing (default 60; 0: no wait)",
            )
        sub.add_argument("--group", required=True, help="the group name")
        sub.add_argument(
            "--backend", metavar="URL", help="the store (default: groups.db in $REBALANCER_HOME)"
        )
        sub.add_argument("--json", action="store_true", help="print one JSON object")
        sub.add_argument(
            "--force",
            action="store_true",
            help="also for a group with no members, resources or target yet",
        )
        sub.set_defaults(func=_cmd_control)


# -- the audit table over time: timeline, rebalances, owners ----------------------------------

_AUDIT_EPILOG = (
    "exit status: 0 ok; 2 bad input (no audit table at PATH, a bad --since, nothing to draw, "
    "an --out that cannot be written). --since takes a UTC time (2026-11-21T06:00:00Z) or a "
    "duration back from now (90s, 10m, 2h)."
)


def _since(text: str) -> float:
    """Epoch seconds from ``--since``: an ISO time (UTC unless it says otherwise) or a
    duration back from now."""
    from datetime import UTC, datetime

    from rebalancer_spark.core.config import parse_duration

    try:
        stamp = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        try:
            return time.time() - parse_duration("--since", text)
        except RebalancerError:
            _fail(
                f"--since {text!r} is neither a time nor a duration; give a UTC time such as "
                "2026-11-21T06:00:00Z or a duration back from now such as 10m or 2h"
            )
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def _audit_events(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The events of the audit table at ``args.path``, filtered by the options given."""
    group = validate_group(args.group) if args.group is not None else None
    _audit()
    from rebalancer_spark.audit.rows import load_rows

    events: list[dict[str, Any]] = load_rows(args.path, group=group).rows
    resource = getattr(args, "resource", None)
    if resource is not None:
        events = [e for e in events if e["resource"] == resource]
    if getattr(args, "since", None) is not None:
        since = _since(args.since)
        events = [e for e in events if e["at"] >= since]
    return events


def _cmd_timeline(args: argparse.Namespace) -> int:
    # Control and rebalance rows are marks above the lanes, not ownerships.
    everything = _audit_events(args)
    events = [e for e in everything if e["kind"] in ("acquired", "released", "lost", "fenced")]
    try:
        from rebalancer_spark.audit.timeline import save_timeline
    except ImportError as exc:
        _fail(f"audit timeline needs matplotlib ({exc})")
    image = save_timeline(
        everything, args.out, title=args.title, lanes=args.lanes, max_lanes=args.max_lanes
    )
    owners = {str(e["member_id"]) for e in events if e["kind"] == "acquired"}
    data = {
        "out": args.out,
        "width": image.width,
        "height": image.height,
        "events": len(events),
        "resources": len({e["resource"] for e in events}),
        "members": len(owners),
        "lanes": image.lanes,
        "lane_count": image.lane_count,
        "marks": image.marks,
    }
    text = (
        f"wrote {args.out} ({image.width}x{image.height} px): {data['resources']} resources, "
        f"{data['members']} members, {len(events)} events; {image.lane_count} lanes by "
        f"{image.lanes}, {image.marks} rebalance and control marks"
    )
    _emit(args.json, data, lambda: print(text))
    return EXIT_OK


def _cmd_rebalances(args: argparse.Namespace) -> int:
    # Rebalances are computed on the whole trail (a move just after --since is still a move,
    # not a first assignment), then those starting at or after --since are kept.
    since = None if args.since is None else _since(args.since)
    everything = argparse.Namespace(**{**vars(args), "since": None})
    found = _audit().rebalances(_audit_events(everything), window=args.window)
    if since is not None:
        found = [r for r in found if r.start >= since]
    rows = [r.as_dict() for r in found]
    durations = sorted(r.duration for r in found)
    summary = {
        "rebalances": len(found),
        "window": args.window,
        "median_duration": durations[len(durations) // 2] if durations else None,
        "max_duration": durations[-1] if durations else None,
        "moved": sum(r.moved for r in found),
    }

    notes = _audit().basis_notes(found, args.window)
    summary["notes"] = notes

    def human() -> None:
        if not found:
            print("no rebalances")
            return
        heads = ("#", "GROUP", "GEN", "TRIGGER", "START (UTC)", "DURATION S", "MOVED")
        table = [
            [r.number, r.group, r.generation, r.trigger, _utc(r.start), f"{r.duration:.3f}"]
            for r in found
        ]
        for row, r in zip(table, found, strict=True):
            row += [r.moved, r.assigned, r.returned, r.released, r.lost, ",".join(r.members)]
        tail = ("ASSIGNED", "RETURNED", "RELEASED", "LOST", "MEMBERS")
        print(_table((*heads, *tail), table))
        basis = "by generation" if not notes else "by generation where recorded"
        print(
            f"{len(found)} rebalances ({basis}), median {summary['median_duration']:.3f} s, "
            f"longest {summary['max_duration']:.3f} s, {summary['moved']} resources moved"
        )
        for note in notes:
            print(f"note: {note}")

    _emit(args.json, {**summary, "items": rows}, human)
    return EXIT_OK


def _cmd_owners(args: argparse.Namespace) -> int:
    rows = _audit().current_owners(_audit_events(args))
    heads = ("GROUP", "RESOURCE", "OWNER", "EPOCH", "SINCE (UTC)", "HOST", "STATE")
    keys = ("group", "resource", "member_id", "epoch")
    table = [[*(r[k] for k in keys), _utc(r["since"]), r["host"], r["state"]] for r in rows]
    _emit(
        args.json,
        {"owners": rows},
        lambda: print(_table(heads, table) if rows else "no resources in the audit table"),
    )
    return EXIT_OK


def _utc(seconds: float) -> str:
    from datetime import UTC, datetime

    stamp = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _add_audit_commands(commands: Any, audits: Any) -> None:
    """``history`` (top level) and ``audit timeline | rebalances | owners``."""
    history = commands.add_parser(
        "history",
        help="one line per ownership event of the audit table",
        description="one line per ownership event, the same as 'audit history'",
        epilog=_AUDIT_EPILOG,
    )
    history.add_argument("--audit", dest="path", required=True, metavar="PATH", help="the table")
    history.add_argument("--resource", help="show this resource only")
    history.set_defaults(func=_cmd_history)
    timeline = audits.add_parser(
        "timeline",
        help="draw ownership over time into a PNG",
        description="one lane per resource (aggregated by prefix or member when there are "
        "many), a colour per member, epochs and gaps, rebalances and control events marked",
        epilog=_AUDIT_EPILOG,
    )
    timeline.add_argument("--out", required=True, metavar="FILE.png", help="the PNG to write")
    timeline.add_argument("--resource", help="draw this resource only")
    timeline.add_argument("--title", help="the plot's title")
    timeline.add_argument(
        "--lanes",
        choices=("auto", "resource", "prefix", "member"),
        default="auto",
        help="one lane per resource, or aggregated by resource prefix (or ranges of ids) or "
        "by member; auto: per resource up to --max-lanes resources, then aggregated",
    )
    timeline.add_argument(
        "--max-lanes",
        type=int,
        default=60,
        metavar="N",
        help="most lanes drawn before aggregating (default 60)",
    )
    timeline.set_defaults(func=_cmd_timeline)
    stats = audits.add_parser(
        "rebalances",
        help="rebalance durations and moves from the audit table",
        description="one rebalance per target generation (start: its publication, end: the "
        "last acquisition under it); tables without rebalance rows: ownership changes closer "
        "than --window seconds form one rebalance",
        epilog=_AUDIT_EPILOG,
    )
    stats.add_argument(
        "--window",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="for tables without rebalance rows: quiet time that ends a rebalance (default 2)",
    )
    stats.set_defaults(func=_cmd_rebalances)
    owners = audits.add_parser(
        "owners", help="each resource's owner as the audit table ends", epilog=_AUDIT_EPILOG
    )
    owners.set_defaults(func=_cmd_owners)
    for sub in (timeline, stats, owners):
        sub.add_argument("path", metavar="PATH", help="the audit table's path or URL")
    for sub in (history, timeline, stats, owners):
        sub.add_argument("--group", help="this group only (default: every group)")
        since = "rebalances starting" if sub is stats else "events"
        sub.add_argument("--since", metavar="TIME", help=f"{since} at or after TIME only")
        sub.add_argument("--json", action="store_true", help="print one JSON object")


# -- the parser -------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="the operator's view and control of a group, and of its audit trail",
        epilog=_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, func, text in (
        ("status", _cmd_status, "members, coordinator, epochs, who owns what, stability"),
        ("members", _cmd_members, "the live members of a group"),
        ("assignments", _cmd_assignments, "each resource's owner, target and progress epoch"),
    ):
        sub = commands.add_parser(name, help=text, description=text, epilog=_EPILOG)
        sub.add_argument("--group", required=True, help="the group name")
        sub.add_argument(
            "--backend", metavar="URL", help="the store (default: groups.db in $REBALANCER_HOME)"
        )
        sub.add_argument("--json", action="store_true", help="print one JSON object")
        if name == "status":
            sub.add_argument(
                "--audit",
                metavar="PATH",
                help="the group's Delta audit table: adds the last rebalance (generation, "
                "trigger, duration, moves)",
            )
        sub.set_defaults(func=func)
    _add_control_commands(commands)
    audit = commands.add_parser(
        "audit", help="the Delta audit table: verify, history, owners, rebalances, timeline"
    )
    audits = audit.add_subparsers(dest="audit_command", metavar="ACTION", required=True)
    verify = audits.add_parser(
        "verify",
        help="prove no resource had two owners at once (with --output: and that every output "
        "commit was made by its owner)",
        epilog=_EPILOG,
    )
    verify.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="overlap allowed for clock skew between hosts (default 0)",
    )
    verify.add_argument(
        "--output",
        metavar="TABLE",
        help="also check this output Delta table's commits against the audit table "
        "(see docs/audit.md): each data commit by its owner, inside its ownership, "
        "epochs never going down, no batch twice",
    )
    verify.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="a deltalake storage option for s3:// tables (repeatable; e.g. "
        "AWS_ENDPOINT_URL=..., AWS_REGION=...); the AWS_* environment variables work too",
    )
    history = audits.add_parser("history", help="one line per ownership event", epilog=_EPILOG)
    history.add_argument("--resource", help="show this resource only")
    history.add_argument("--since", metavar="TIME", help="events at or after TIME only")
    for sub, func in ((verify, _cmd_verify), (history, _cmd_history)):
        sub.add_argument("path", metavar="PATH", help="the audit table's path or URL")
        sub.add_argument("--group", help="this group only (default: every group)")
        sub.add_argument("--json", action="store_true", help="print one JSON object")
        sub.set_defaults(func=func)
    _add_audit_commands(commands, audits)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: the command line); return the exit status."""
    args = _parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces the closed stdout
        return EXIT_OK
    except ControlRefused as exc:
        _fail(str(exc), EXIT_REFUSED)
    except RebalancerError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        return 130
    return status


def run() -> NoReturn:
    """The ``rebalancer-spark`` console script: :func:`main`, then end the process without
    the native teardown that can abort it (see :mod:`rebalancer_spark.shutdown`) — also when
    it ends by ``SystemExit`` (an error, ``--help``): once deltalake has been loaded, a normal
    interpreter exit can abort with SIGABRT instead of the exit code."""
    # kazoo's connection retries are not the command's output (set here, not in main(), so
    # that main() called in a process of one's own leaves its logging alone).
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    try:
        code = main()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    exit_process(code)


if __name__ == "__main__":
    run()
