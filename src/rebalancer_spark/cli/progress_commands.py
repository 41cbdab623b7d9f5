"""``progress show|reset|skip``: a file resource's progress, and the operator's way out.

``show`` prints the resource's progress record as the store holds it (the raw text when it is
unreadable), its owner, and whether it is stuck. ``reset`` (read again every file above a name,
or all) and ``skip`` (a named file, or the open batch) leave a request in the group's control
record, in the store (:mod:`rebalancer_spark.spark.progress_requests`), that the resource's
owner applies, fenced by its epoch, at its next pass, recording a ``progress`` event in the
audit table; with no owner, the next owner applies it when it takes the resource over. This
works wherever the jobs' output and file history live (a local path, a shared mount, S3).
While a member owns the resource the request is refused without ``--force``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rebalancer_spark.cli.exits import EXIT_OK, EXIT_REFUSED, fail
from rebalancer_spark.cli.render import emit
from rebalancer_spark.cli.store import backend_url, read_group, shown
from rebalancer_spark.core.model import UnreadableProgress, validate_group
from rebalancer_spark.core.status import progress_view

__all__ = ["add_progress_commands", "cmd_progress"]


def add_progress_commands(commands: Any, epilog: str) -> None:
    """The ``progress`` command and its actions."""
    text = "a file resource's progress: show it, reset it, skip a file or batch"
    progress = commands.add_parser("progress", help=text, description=__doc__, epilog=epilog)
    actions = progress.add_subparsers(dest="progress_command", metavar="ACTION", required=True)
    for name, help_text in (
        ("show", "the progress record, its owner, stuck or not, the lag"),
        ("reset", "read again every file above --after NAME (or --all)"),
        ("skip", "record --file NAME or the open --batch N as processed, unread"),
    ):
        sub = actions.add_parser(name, help=help_text, description=help_text, epilog=epilog)
        sub.add_argument("--group", required=True, help="the group name")
        sub.add_argument("--resource", required=True, help="the resource id")
        sub.add_argument("--backend", metavar="URL", help="the store (default: $REBALANCER_HOME)")
        sub.add_argument("--json", action="store_true", help="print one JSON object")
        if name != "show":
            # Before requests lived in the store they were files beside the history: scripts
            # that still name it get a warning, not an error.
            sub.add_argument("--output", "--files-history", dest="old_location",
                             metavar="PATH", help=argparse.SUPPRESS)  # fmt: skip
            sub.add_argument(
                "--force", action="store_true", help="also while a member owns the resource"
            )
        if name == "reset":
            what = sub.add_mutually_exclusive_group(required=True)
            what.add_argument("--after", metavar="NAME", help="read again the files above NAME")
            what.add_argument("--all", action="store_true", help="read every file again")
        if name == "skip":
            what = sub.add_mutually_exclusive_group(required=True)
            what.add_argument("--file", metavar="NAME", help="a file name, relative")
            what.add_argument("--batch", type=int, metavar="N", help="the open batch's id")
        sub.set_defaults(func=cmd_progress)


def cmd_progress(args: argparse.Namespace) -> int:
    from rebalancer_spark.backends import open_backend
    from rebalancer_spark.member.control import GroupControl
    from rebalancer_spark.spark.progress_requests import ProgressRequest

    group = validate_group(args.group)
    url = backend_url(args.backend)
    state, progress = read_group(url, group, progress=True)
    resource = args.resource
    claim = state.claims.get(resource)
    owner = None if claim is None or claim.member_id not in state.members else claim.member_id
    record = progress.get(resource)
    if args.progress_command == "show":
        value = None if record is None else record.value
        view = progress_view(resource, value)
        waiting = state.control.requests.get(resource)
        data = {
            "group": group,
            "backend": shown(url),
            "resource": resource,
            "owner": owner,
            "epoch": None if claim is None else claim.epoch,
            "committed_epoch": None if record is None else record.epoch,
            "committed_by": None if record is None else record.member_id,
            "progress": value.text if isinstance(value, UnreadableProgress) else value,
            "readable": not isinstance(value, UnreadableProgress),
            "stuck": view.stuck,
            "pending_files": view.pending_files,
            "pending_bytes": view.pending_bytes,
            "request": _waiting(waiting),
        }
        emit(args.json, data, lambda: _print_show(data))
        return EXIT_OK
    if args.old_location is not None:
        print("rebalancer-spark: warning: --output/--files-history are ignored: progress "
              "requests now wait in the group's control record, in the store",
              file=sys.stderr)  # fmt: skip
    if resource not in state.resources and claim is None:
        fail(f"resource {resource!r} is not in group {group} on {shown(url)}: see "
             "'rebalancer-spark assignments'")  # fmt: skip
    if owner is not None and not args.force:
        epoch = claim.epoch if claim else "?"
        fail(
            f"resource {resource!r} is owned by member {owner} (epoch {epoch}): give --force "
            "to have that member apply the request at its next pass, fenced by its epoch",
            EXIT_REFUSED,
        )
    if args.progress_command == "reset":
        request = ProgressRequest.make("reset", after=None if args.all else args.after)
    elif args.file is not None:
        request = ProgressRequest.make("skip", file=args.file)
    else:
        request = ProgressRequest.make("skip", batch=args.batch)
    with open_backend(url) as backend:
        GroupControl(backend, group, actor=request.by).request_progress(resource, request.encode())
    who = f"member {owner} applies it at its next pass" if owner else (
        "the next owner applies it when it takes the resource over"
    )  # fmt: skip
    data = {"group": group, "resource": resource, "request": request.id,
            "what": request.describe(), "owner": owner}  # fmt: skip
    emit(args.json, data, lambda: print(f"{request.describe()}: request {request.id} left in "
                                        f"the control record of group {group}; {who}"))  # fmt: skip
    return EXIT_OK


def _waiting(text: str | None) -> dict[str, Any] | None:
    """The request waiting for the owner in the control record, as ``show`` prints it."""
    from rebalancer_spark.core.errors import ConfigurationError
    from rebalancer_spark.spark.progress_requests import ProgressRequest

    if text is None:
        return None
    try:
        request = ProgressRequest.decode(text, "the waiting request")
    except ConfigurationError as exc:
        return {"what": f"not a request: {exc}", "id": None, "by": None}
    return {"what": request.describe(), "id": request.id, "by": request.by}


def _print_show(data: dict[str, Any]) -> None:
    print(f"resource {data['resource']} of group {data['group']} on {data['backend']}")
    print(f"owner: {data['owner'] or 'none'} (epoch {data['epoch']})")
    print(f"committed by: {data['committed_by'] or '-'} at epoch {data['committed_epoch']}")
    if data["pending_files"] is not None:
        print(f"pending: {data['pending_files']} files, {data['pending_bytes']} bytes")
    print(f"stuck: {data['stuck'] or 'no'}")
    request = data["request"]
    if request is not None:
        print(f"waiting for the owner: {request['what']} (request {request['id']}, by "
              f"{request['by']})")  # fmt: skip
    if data["readable"]:
        print(json.dumps(data["progress"], indent=2, sort_keys=True))
    else:
        print(f"unreadable record: {data['progress']!r}")
