"""The table of a Spark job's options, and what every layer shares about their names.

Each option has a name (written ``session_timeout`` or ``session-timeout``), a kind (what a
layer may give for it: text, a duration, a count or a list), a section and a help text for
``--help``. The command line parser, the Spark conf and TOML readers (:mod:`.layers`),
:class:`~rebalancer_spark.spark.job_config.JobConfig` and the merge in :mod:`.options` all work
from this one table. Also here: the names of the layers, the refusal of an unknown name (with a
"did you mean"), the rule for reader option names, and :func:`show`, which renders a value for
a message with any secret in it hidden.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection
from dataclasses import dataclass

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.urls import redact_url

__all__ = [
    "BY_NAME",
    "COMMAND_LINE",
    "CONF_PREFIX",
    "DEFAULT",
    "DEFAULT_CONFIG_FILE",
    "FORMATS",
    "LAYER_KEYS",
    "MEMBERSHIP",
    "OPTIONS",
    "OPTION_KEYS",
    "SOURCE",
    "SPARK_CONF",
    "TIMING",
    "Option",
    "check_read_key",
    "show",
    "unknown_option",
]


CONF_PREFIX = "spark.rebalancer."
"""Spark conf keys starting with this are options; ``spark.rebalancer.read.X`` reader option X."""
DEFAULT_CONFIG_FILE = "conf/rebalancer.toml"
"""Read, relative to the current directory, when no TOML file is named and this one exists."""
FORMATS = ("csv", "json", "parquet", "text", "orc")
"""The Spark reader formats a job can read its source files with."""
OUTPUT_FORMATS = ("delta", "parquet")
"""What a job's batches are written as (:mod:`rebalancer_spark.spark.outputs`)."""

COMMAND_LINE, SPARK_CONF, DEFAULT = "command line", "spark conf", "default"
"""Layer names, as origins and messages show them (a TOML file is ``TOML file PATH``)."""
MEMBERSHIP, SOURCE, TIMING = "group membership", "source and output", "timing"
"""The sections of ``--help`` and of :meth:`JobConfig.describe`."""
_USERINFO = re.compile(r"[^\s'\"@]*:[^\s'\"@]*@")


@dataclass(frozen=True, slots=True)
class Option:
    """One row of the table."""

    name: str
    kind: str  # "text", "duration", "count" or "list": what each layer may give
    section: str
    metavar: str
    help: str
    default: str = ""  # the default as --help shows it; "" = the dataclass default


OPTIONS = (
    Option("group", "text", MEMBERSHIP, "NAME", "the group to join; its jobs share its resources",
           "required"),
    Option("backend", "text", MEMBERSHIP, "URL",
           "where the group's state lives: sqlite:///abs/path/groups.db, "
           "zookeeper://zk1:2181,zk2:2181/chroot, redis://[:PASSWORD@]host:6379/0 or rediss://...",
           "an SQLite file in $REBALANCER_HOME, shared by this user's jobs on this host"),
    Option("member_id", "text", MEMBERSHIP, "ID",
           "a static member id (like Kafka's group.instance.id): a job restarted with the same "
           "id within --rejoin-grace gets its resources back", "a new id for every run"),
    Option("protocol", "text", MEMBERSHIP, "NAME",
           "how resources change hands: cooperative, global_barrier or resource_barrier"),
    Option("assignor", "text", MEMBERSHIP, "NAME",
           "sticky (balanced, moves the fewest) or round_robin"),
    Option("source", "text", SOURCE, "URL",
           "where the resources are discovered, each sub-prefix, sub-directory or queue one "
           "resource: s3://bucket/prefix/, file:///mount/dir/, rabbitmq://..., sqs://..., or "
           "static://a,b,c (the same as --resources a,b,c); not with --resources", "none"),
    Option("resources", "list", SOURCE, "A,B,...",
           "a static comma-separated list of resources, instead of --source", "none"),
    Option("output", "text", SOURCE, "PATH",
           "where the job writes its results: a Delta table (a path, s3a:// URL or catalog "
           "table name) or, with --output-format parquet, a directory", "none"),
    Option("output_format", "text", SOURCE, "NAME",
           "delta (one fenced Delta commit per batch) or parquet (a directory per batch)",
           "delta"),
    Option("checkpoint_root", "text", SOURCE, "PATH",
           "streaming jobs: shared directory of the per-resource checkpoints "
           "(ROOT/GROUP/RESOURCE/), on storage every job of the group reaches", "none"),
    Option("files_history", "text", SOURCE, "PATH",
           "file sources: the Delta table of the files each resource processed (a path or "
           "s3:// URL every job of the group reaches)", "OUTPUT/_rebalancer_files"),
    Option("audit", "text", SOURCE, "PATH",
           "path of the Delta table that records every change of ownership", "no audit"),
    Option("format", "text", SOURCE, "NAME",
           f"Spark reader format of the source files: {', '.join(FORMATS)}"),
    Option("schema", "text", SOURCE, "DDL",
           "Spark DDL schema of the input, e.g. 'id INT, name STRING'", "the reader's own"),
    Option("max_files_per_batch", "count", SOURCE, "N", "most input files read in one batch"),
    Option("metrics_port", "count", SOURCE, "PORT",
           "serve this job's Prometheus metrics on http://driver:PORT/metrics", "0: off"),
    Option("log_format", "text", SOURCE, "NAME",
           "log lines as text or json, each with the group, member and epoch", "text"),
    Option("session_timeout", "duration", TIMING, "DURATION",
           "the lease: a member silent this long loses its resources (0.5s to 600s)"),
    Option("heartbeat_interval", "duration", TIMING, "DURATION",
           "time between lease renewals, below session_timeout / 2", "session_timeout / 5"),
    Option("safety_margin", "duration", TIMING, "DURATION",
           "a member stops all work this long before its lease can expire",
           "max(0.05 * session_timeout, 0.1s)"),
    Option("stability_window", "duration", TIMING, "DURATION",
           "quiet time before a rebalance, so that a rolling restart is one rebalance"),
    Option("max_rebalance_delay", "duration", TIMING, "DURATION",
           "a rebalance starts at most this long after the first change"),
    Option("rejoin_grace", "duration", TIMING, "DURATION",
           "static members: how long a departed member's resources wait for it"),
    Option("callback_timeout", "duration", TIMING, "DURATION",
           "longest a user callback may run before its resources are given up as lost",
           "session_timeout / 2"),
    Option("barrier_timeout", "duration", TIMING, "DURATION",
           "global_barrier: how long the coordinator waits for acknowledgements"),
    Option("drain_timeout", "duration", TIMING, "DURATION",
           "graceful leave: how long to wait for the resources to move away"),
    Option("poll_interval", "duration", TIMING, "DURATION", "time between looks for new input"),
    Option("lag_interval", "duration", TIMING, "DURATION",
           "file sources with --audit: least time between two samples of a resource's lag in "
           "the audit table (at once when it reaches zero or leaves it)"),
    Option("discovery_interval", "duration", TIMING, "DURATION",
           "time between listings of the source's resources, on the coordinator"),
)  # fmt: skip
BY_NAME = {option.name: option for option in OPTIONS}
OPTION_KEYS: tuple[str, ...] = tuple(sorted(BY_NAME))
"""Every option name (besides ``config`` and the reader options), in ``_`` form."""
LAYER_KEYS = (*OPTION_KEYS, "config", "read_options")


def check_read_key(key: object, where: str) -> None:
    """Refuse a reader option name that Spark could not take (``where`` names the layer)."""
    if not isinstance(key, str) or not key or not key.isprintable() or re.search(r"[\s=]", key):
        raise ConfigurationError(
            f"{where}: the reader option name {show(key)} is empty or holds a space, '=' or "
            "control character: write a name such as header or inferSchema"
        )


def unknown_option(
    what: str, name: str, choices: Collection[str], prefix: str, given: str
) -> ConfigurationError:
    """The refusal of the unknown option ``given`` (``name`` in ``_`` form) found in ``what``,
    with a "did you mean" among ``choices`` and the list of every option."""
    dash = "-" if "-" in given else "_"  # answer in the spelling the user chose
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    hint = f" (did you mean {prefix}{close[0].replace('_', dash)}?)" if close else ""
    names = ", ".join(sorted(c.replace("_", dash) for c in choices if not c.startswith("read")))
    return ConfigurationError(
        f"unknown {what}{hint}: the options are {names} (written with '-' or '_'), and reader "
        "options (--read-option KEY=VALUE, spark.rebalancer.read.KEY, a [read] table)"
    )


def show(value: object, limit: int = 80) -> str:
    """``value`` as a message shows it: its repr, secrets hidden, cut at ``limit`` characters."""
    # redact_url knows scheme://user:password@; a "user:password@" elsewhere is cut out too
    text = _USERINFO.sub(_cut_userinfo, redact_url(repr(value)))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cut_userinfo(match: re.Match[str]) -> str:
    return match[0] if match[0].endswith(":***@") else "***@"
