"""``pause | resume | rebalance | reset | drain | undrain | pin | unpin | threshold``: changes
of the group's control record (``docs/control.md``), one table row per command."""

from __future__ import annotations

import argparse
import getpass
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from rebalancer_spark.backends import open_backend
from rebalancer_spark.cli.exits import EXIT_OK, EXIT_TIMEOUT, PROG, fail
from rebalancer_spark.cli.render import control_json, emit
from rebalancer_spark.cli.store import backend_url, missing_store, shown
from rebalancer_spark.core.control import Control
from rebalancer_spark.core.model import (
    GroupState,
    validate_group,
    validate_member_id,
    validate_resource_id,
)
from rebalancer_spark.core.status import control_status
from rebalancer_spark.member.control import GroupControl

__all__ = ["CONTROL_COMMANDS", "ControlCommand", "cmd_control"]

Change = Callable[[GroupControl, argparse.Namespace], tuple[Control, bool]]


@dataclass(frozen=True, slots=True)
class ControlCommand:
    """One control command: its help, its positional arguments (dest, metavar), the change it
    makes, and what it prints when it changed the record (``done``) or found the change
    already in effect (``already``); both may name ``{member}``, ``{resource}``, ``{value}``."""

    name: str
    help: str
    change: Change
    done: str
    already: str
    positionals: tuple[tuple[str, str], ...] = ()


def _member(args: argparse.Namespace) -> str:
    return validate_member_id(args.member)


def _resource(args: argparse.Namespace) -> str:
    return validate_resource_id(args.resource)


MEMBER, RESOURCE = ("member", "MEMBER"), ("resource", "RESOURCE")
CONTROL_COMMANDS = (
    ControlCommand(
        "pause",
        "freeze ownership: nothing owned moves; orphans still get an owner",
        lambda ops, _: ops.pause(),
        "paused",
        "already paused",
    ),
    ControlCommand(
        "resume",
        "end a pause: rebalance what changed meanwhile",
        lambda ops, _: ops.resume(),
        "resumed",
        "already running (not paused)",
    ),
    ControlCommand(
        "rebalance",
        "list the source and force one full rebalance now (ignores debounce and threshold)",
        lambda ops, _: ops.rebalance(),
        "rebalance requested",
        "rebalance requested",
    ),
    ControlCommand(
        "reset",
        "back to the default control: active, no drains, no pins, threshold 0",
        lambda ops, _: ops.reset(),
        "control reset to the default",
        "control already at the default",
    ),
    ControlCommand(
        "drain",
        "move everything away from a live member and wait until it owns nothing",
        lambda ops, args: ops.drain(_member(args)),
        "drain of {member} requested",
        "{member} already draining",
        (MEMBER,),
    ),
    ControlCommand(
        "undrain",
        "let a drained member own resources again",
        lambda ops, args: ops.undrain(_member(args)),
        "{member} no longer drained",
        "{member} was not draining",
        (MEMBER,),
    ),
    ControlCommand(
        "pin",
        "keep a resource on a member while that member is in the group",
        lambda ops, args: ops.pin(_resource(args), _member(args), absent_member=args.force),
        "{resource} pinned to {member}",
        "{resource} already pinned to {member}",
        (RESOURCE, MEMBER),
    ),
    ControlCommand(
        "unpin",
        "let a pinned resource be balanced again",
        lambda ops, args: ops.unpin(_resource(args)),
        "{resource} unpinned",
        "{resource} was not pinned",
        (RESOURCE,),
    ),
    ControlCommand(
        "threshold",
        "no moves while max - min owned (weighted) stays at or under VALUE",
        lambda ops, args: ops.set_threshold(args.value),
        "imbalance threshold set to {value:g}",
        "imbalance threshold already {value:g}",
        (("value", "VALUE"),),
    ),
)
_BY_NAME = {command.name: command for command in CONTROL_COMMANDS}


def cmd_control(args: argparse.Namespace) -> int:
    group, url = validate_group(args.group), backend_url(args.backend)
    where = shown(url)
    missing = missing_store(url)
    if missing is not None:
        fail(
            f"{missing}: check --backend (a control command never creates a store; the jobs "
            "create it when they join)"
        )
    with open_backend(url) as backend:
        _require_group(backend.state(group), where, force=args.force)
        message, outcome, code = _apply(GroupControl(backend, group, actor=_actor()), args)
        control = control_status(backend.state(group))
    data = {"group": group, "backend": where, "command": args.command, **outcome}
    data["control"] = control_json(control)
    text = f"group {group}: {message} (control version {control.version})"
    emit(args.json, data, lambda: print(text))
    if code == EXIT_TIMEOUT:
        _drain_timed_out(args, group, outcome["owned"])
    return code


def _require_group(state: GroupState, where: str, *, force: bool) -> None:
    """Refuse a group that looks mistyped: no members, resources or target (unless forced)."""
    if not (force or state.members or state.resources or state.target):
        fail(
            f"group {state.group!r} on {where} has no members, resources or target: "
            f"check --group ('{PROG} status' lists a group's members), or give --force to "
            "set its control before its jobs start"
        )


def _apply(ops: GroupControl, args: argparse.Namespace) -> tuple[str, dict[str, Any], int]:
    """Make the change; (message, what the JSON adds, exit status), after waiting for a
    drain when ``--timeout`` is above 0."""
    command = _BY_NAME[args.command]
    _, changed = command.change(ops, args)
    names = {k: getattr(args, k, None) for k in ("member", "resource", "value")}
    message = (command.done if changed else command.already).format(**names)
    outcome: dict[str, Any] = {"changed": changed}
    if command.name != "drain" or args.timeout <= 0:
        return message, outcome, EXIT_OK
    progress = ops.wait_drained(args.member, args.timeout)
    outcome["drained"], outcome["owned"] = progress.done, progress.owned
    if not progress.done:
        return message, outcome, EXIT_TIMEOUT
    gone = "" if progress.present else " (it left the group)"
    return f"drain of {args.member} done: it owns nothing{gone}", outcome, EXIT_OK


def _drain_timed_out(args: argparse.Namespace, group: str, owned: int) -> NoReturn:
    fail(
        f"drain of member {args.member!r} in group {group!r} timed out after "
        f"{args.timeout:g} s: it still owns or is assigned {owned} resources; check "
        f"that the group has a coordinator ('{PROG} status --group {group}'), then run "
        f"drain again with a longer --timeout",
        EXIT_TIMEOUT,
    )


def _actor() -> str:
    """Who made the change, for the record's history: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
