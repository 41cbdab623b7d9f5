"""The command line: every command, its options, and the function it dispatches to
(``args.func``)."""

from __future__ import annotations

import argparse
import math
from typing import Any, NoReturn

from rebalancer_spark import __version__
from rebalancer_spark.cli.audit_commands import (
    cmd_history,
    cmd_owners,
    cmd_rebalances,
    cmd_timeline,
    cmd_verify,
)
from rebalancer_spark.cli.control_commands import CONTROL_COMMANDS, cmd_control
from rebalancer_spark.cli.exits import EPILOG, PROG, fail
from rebalancer_spark.cli.progress_commands import add_progress_commands
from rebalancer_spark.cli.read_commands import cmd_assignments, cmd_members, cmd_status
from rebalancer_spark.cli.store_commands import cmd_lift_epochs

__all__ = ["build_parser"]

_READ_COMMANDS = (
    ("status", cmd_status, "members, coordinator, epochs, who owns what, stability"),
    ("members", cmd_members, "the live members of a group"),
    ("assignments", cmd_assignments, "each resource's owner, target and progress epoch"),
)
_AUDIT_EPILOG = (
    "exit status: 0 ok; 2 bad input (no audit table at PATH, a bad --since, nothing to draw, "
    "an --out that cannot be written). --since takes a UTC time (2026-11-21T06:00:00Z) or a "
    "duration back from now (90s, 10m, 2h)."
)
_POSITIONAL_HELP = {
    "member": "a member id, as 'rebalancer-spark members' shows it",
    "resource": "a resource id, as 'rebalancer-spark assignments' shows it",
    "value": "a number >= 0 (counts, or weights for weighted resources); 0 always balances",
}


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (``error: ...; see --help``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message}; see '{self.prog} --help'")


def build_parser() -> argparse.ArgumentParser:
    """The ``rebalancer-spark`` parser; ``parse_args`` gives ``func``, the command to run."""
    parser = _Parser(
        prog=PROG,
        description="the operator's view and control of a group, and of its audit trail",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_read_commands(commands)
    _add_control_commands(commands)
    add_progress_commands(commands, EPILOG)
    _add_lift_epochs(commands)
    audit = commands.add_parser(
        "audit", help="the Delta audit table: verify, history, owners, rebalances, timeline"
    )
    audits = audit.add_subparsers(dest="audit_command", metavar="ACTION", required=True)
    _add_verify_and_history(audits)
    _add_top_history(commands)
    _add_audit_views(audits)
    return parser


def _add_store_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--group", required=True, help="the group name")
    sub.add_argument(
        "--backend", metavar="URL", help="the store (default: groups.db in $REBALANCER_HOME)"
    )
    sub.add_argument("--json", action="store_true", help="print one JSON object")


def _add_read_commands(commands: Any) -> None:
    for name, func, text in _READ_COMMANDS:
        sub = commands.add_parser(name, help=text, description=text, epilog=EPILOG)
        _add_store_options(sub)
        if name == "status":
            sub.add_argument(
                "--audit",
                metavar="PATH",
                help="the group's Delta audit table: adds the last rebalance (generation, "
                "trigger, duration, moves)",
            )
        sub.set_defaults(func=func)


def _add_control_commands(commands: Any) -> None:
    for command in CONTROL_COMMANDS:
        text = command.help
        sub = commands.add_parser(command.name, help=text, description=text, epilog=EPILOG)
        for dest, metavar in command.positionals:
            kind = _threshold_value if dest == "value" else str
            sub.add_argument(dest, metavar=metavar, type=kind, help=_POSITIONAL_HELP[dest])
        if command.name == "drain":
            sub.add_argument(
                "--timeout",
                type=_timeout_seconds,
                default=60.0,
                metavar="SECONDS",
                help="how long to wait for the member to own nothing (default 60; 0: no wait)",
            )
        _add_store_options(sub)
        sub.add_argument(
            "--force",
            action="store_true",
            help="also for a group with no members, resources or target yet"
            + (" and to a member that is not in the group (yet)" if command.name == "pin" else ""),
        )
        sub.set_defaults(func=cmd_control)


def _add_lift_epochs(commands: Any) -> None:
    text = "raise resource epochs above a floor after the store lost its state"
    sub = commands.add_parser("lift-epochs", help=text, description=text, epilog=EPILOG)
    _add_store_options(sub)
    floor = sub.add_mutually_exclusive_group(required=True)
    floor.add_argument("--floor", type=_epoch_floor, metavar="N", help="the floor, an epoch >= 1")
    floor.add_argument(
        "--audit", metavar="PATH", help="the group's Delta audit table: its highest epochs"
    )
    sub.add_argument(
        "--resource",
        action="append",
        default=[],
        metavar="RESOURCE",
        help="with --floor: a resource to lift (repeat; default: the group's resource set)",
    )
    sub.set_defaults(func=cmd_lift_epochs)


def _epoch_floor(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"floor {text!r} is not an epoch (a whole number >= 1)")
    return int(text)


def _threshold_value(text: str) -> float:
    value = _number_or_nan(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"imbalance threshold {text!r} is not a finite number >= 0 (0 balances always)"
        )
    return value


def _timeout_seconds(text: str) -> float:
    value = _number_or_nan(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"timeout {text!r} is not a number of seconds >= 0")
    return value


def _number_or_nan(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _add_verify_and_history(audits: Any) -> None:
    """``audit verify`` and ``audit history``."""
    verify = _add_verify(audits)
    history = audits.add_parser("history", help="one line per ownership event", epilog=EPILOG)
    history.add_argument("--resource", help="show this resource only")
    history.add_argument("--since", metavar="TIME", help="events at or after TIME only")
    for sub, func in ((verify, cmd_verify), (history, cmd_history)):
        sub.add_argument("path", metavar="PATH", help="the audit table's path or URL")
        sub.add_argument("--group", help="this group only (default: every group)")
        sub.add_argument("--json", action="store_true", help="print one JSON object")
        sub.set_defaults(func=func)


def _add_verify(audits: Any) -> argparse.ArgumentParser:
    verify: argparse.ArgumentParser = audits.add_parser(
        "verify",
        help="prove no resource had two owners at once (with --output: and that every output "
        "commit was made by its owner)",
        epilog=EPILOG,
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
    return verify


def _add_top_history(commands: Any) -> None:
    """``history --audit PATH``: the same as ``audit history PATH``."""
    history = commands.add_parser(
        "history",
        help="one line per ownership event of the audit table",
        description="one line per ownership event, the same as 'audit history'",
        epilog=_AUDIT_EPILOG,
    )
    history.add_argument("--audit", dest="path", required=True, metavar="PATH", help="the table")
    history.add_argument("--resource", help="show this resource only")
    history.set_defaults(func=cmd_history)
    _add_audit_filters(history, "events")


def _add_audit_views(audits: Any) -> None:
    """``audit timeline | rebalances | owners``."""
    for add in (_add_timeline, _add_rebalances, _add_owners):
        sub, since = add(audits)
        sub.add_argument("path", metavar="PATH", help="the audit table's path or URL")
        _add_audit_filters(sub, since)


def _add_audit_filters(sub: argparse.ArgumentParser, since: str) -> None:
    sub.add_argument("--group", help="this group only (default: every group)")
    sub.add_argument("--since", metavar="TIME", help=f"{since} at or after TIME only")
    sub.add_argument("--json", action="store_true", help="print one JSON object")


def _add_timeline(audits: Any) -> tuple[argparse.ArgumentParser, str]:
    timeline: argparse.ArgumentParser = audits.add_parser(
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
    timeline.set_defaults(func=cmd_timeline)
    return timeline, "events"


def _add_rebalances(audits: Any) -> tuple[argparse.ArgumentParser, str]:
    stats: argparse.ArgumentParser = audits.add_parser(
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
    stats.set_defaults(func=cmd_rebalances)
    return stats, "rebalances starting"


def _add_owners(audits: Any) -> tuple[argparse.ArgumentParser, str]:
    owners: argparse.ArgumentParser = audits.add_parser(
        "owners", help="each resource's owner as the audit table ends", epilog=_AUDIT_EPILOG
    )
    owners.set_defaults(func=cmd_owners)
    return owners, "events"
