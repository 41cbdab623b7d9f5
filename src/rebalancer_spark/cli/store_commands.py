"""``lift-epochs``: raise a group's resource epochs above a floor, after the store lost its state
and before members that never saw it start (docs/operations.md, "When the store lost its
state"). The floor is a number (``--floor``) or the audit table's highest epoch per resource
(``--audit``); resources held now are left alone."""

from __future__ import annotations

import argparse

from rebalancer_spark.backends import open_backend
from rebalancer_spark.cli.audit_commands import audit_module
from rebalancer_spark.cli.exits import EXIT_OK, fail
from rebalancer_spark.cli.render import emit
from rebalancer_spark.cli.store import backend_url, shown
from rebalancer_spark.core.model import validate_group, validate_resource_id

__all__ = ["cmd_lift_epochs"]


def cmd_lift_epochs(args: argparse.Namespace) -> int:
    group = validate_group(args.group)
    url = backend_url(args.backend)
    with open_backend(url) as store:
        if args.audit is not None:
            floors = audit_module().reader.epoch_floors(args.audit, group)
            if not floors:
                fail(f"the audit table at {args.audit} records no epoch of group {group}")
        else:
            named = [validate_resource_id(r) for r in args.resource]
            resources = named or sorted(store.state(group).resources)
            if not resources:
                fail(
                    f"group {group} on {shown(url)} has no resources: name them with "
                    "--resource, or use --audit PATH"
                )
            floors = dict.fromkeys(resources, args.floor)
        lifted = store.lift_epochs(group, floors)
    data = {"group": group, "backend": shown(url), "resources": len(floors), "lifted": lifted}
    emit(
        args.json,
        data,
        lambda: print(
            f"group {group}: {lifted} of {len(floors)} resource epochs lifted (the others were "
            "already at or above their floor, or are held now)"
        ),
    )
    return EXIT_OK
