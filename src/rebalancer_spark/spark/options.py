"""A Spark job's options: the command line, ``spark.rebalancer.*`` Spark conf keys and a TOML
file, merged into one frozen, checked :class:`JobConfig`.

Three layers, highest precedence first, all using the same option names (written with ``-``
or ``_``), then the defaults of :class:`JobConfig` and :class:`MemberConfig`::

    command line   spark-submit job.py --group orders --session-timeout 10s \\
                       --read-option header=true
    Spark conf     --conf spark.rebalancer.session-timeout=10s, or spark-defaults.conf;
                   reader options as spark.rebalancer.read.header=true
    TOML file      session-timeout = "10s"; reader options in a [read] table

The TOML file is the one named by ``--config``, else by ``spark.rebalancer.config``, else the
job's own default (``toml_path`` of :func:`resolve`), else ``conf/rebalancer.toml`` in the
current directory if it exists. A file that is named but missing is an error.

Each option is taken whole from the highest layer that gives it; reader options merge key by
key, case-insensitively as Spark reads them. ``source`` and ``resources`` are one choice: the
highest layer giving either decides, and a layer giving both is refused. Unknown names are
refused in every layer, naming the layer, with a "did you mean". The command line is ordered,
so a repeated option keeps its last value; in the Spark conf and the TOML file one option
spelled twice (``session-timeout`` and ``session_timeout``) is refused.

No pyspark import: the driver passes ``SparkConf.getAll()`` to :func:`spark_conf_options`.
Secrets never show: URLs pass through :func:`redact_url`, and reader options with
secret-looking names (``password``, ``token`` ...) are shown as ``***``.

This module merges the layers (:func:`resolve`) and is where every public name of a job's
options is imported from. The parts live in modules named after them: the option table and the
name rules every layer shares in :mod:`.option_table`, reading each layer in :mod:`.layers`,
:class:`JobConfig` with its checks and :meth:`~JobConfig.describe` in :mod:`.job_config`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from rebalancer_spark.core.config import CONFIG_KEYS, MemberConfig
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.spark.job_config import JobConfig
from rebalancer_spark.spark.layers import (
    build_parser,
    load_toml,
    parse_command_line,
    spark_conf_options,
)
from rebalancer_spark.spark.option_table import (
    COMMAND_LINE,
    CONF_PREFIX,
    DEFAULT,
    DEFAULT_CONFIG_FILE,
    FORMATS,
    LAYER_KEYS,
    OPTION_KEYS,
    SPARK_CONF,
    show,
    unknown_option,
)

__all__ = [
    "CONF_PREFIX",
    "DEFAULT_CONFIG_FILE",
    "FORMATS",
    "OPTION_KEYS",
    "JobConfig",
    "build_parser",
    "load_toml",
    "parse_command_line",
    "resolve",
    "spark_conf_options",
]


def resolve(
    command_line: Mapping[str, object],
    spark_conf: Mapping[str, object],
    *,
    toml_path: str | None = None,
    default_backend: str,
) -> JobConfig:
    """Merge the layers into a checked :class:`JobConfig` (see the module docstring for the
    precedence and for how the TOML file is chosen). ``command_line`` and ``spark_conf`` are
    what :func:`parse_command_line` and :func:`spark_conf_options` return; ``backend``
    defaults to ``default_backend``. Every refusal is a :class:`ConfigurationError` that
    names the layers the options involved came from."""
    layers = [
        (COMMAND_LINE, _layer(command_line, COMMAND_LINE, "--")),
        (SPARK_CONF, _layer(spark_conf, SPARK_CONF, CONF_PREFIX)),
    ]
    origins: dict[str, str] = {}
    path, origins["config"], named_by = _toml_choice(layers, toml_path)
    if path is not None:
        try:
            layers.append((f"TOML file {path}", load_toml(path)))
        except ConfigurationError as exc:
            raise ConfigurationError(f"{exc} (the file is named by {named_by})") from None
    else:
        del origins["config"]
    merged: dict[str, object] = {}
    choice = next((v for v in layers if {"source", "resources"} & v[1].keys()), None)
    # source and resources: one choice, made by the highest layer that gives either
    if choice is not None and {"source", "resources"} <= choice[1].keys():
        raise ConfigurationError(
            f"the {choice[0]} gives both source and resources: a job discovers its "
            "resources from a source or takes a static list, not both; remove one"
        )
    for name in OPTION_KEYS:
        candidates = [choice] if name in ("source", "resources") and choice else layers
        found = next(((lay, v[name]) for lay, v in candidates if name in v), None)
        if found is not None:
            origins[name], merged[name] = found
    reads: dict[str, str] = {}
    for layer, values in layers:  # reader options: key by key, case-insensitively
        given = values.get("read_options", {})
        if not isinstance(given, Mapping):
            raise ConfigurationError(f"the {layer} gives read_options that are not a mapping")
        for key, value in given.items():
            if not any(k.lower() == str(key).lower() for k in reads):
                reads[key] = value
                origins[f"read.{key}"] = layer
    for name in OPTION_KEYS:
        origins.setdefault(name, DEFAULT)
    job: dict[str, Any] = {k: v for k, v in merged.items() if k not in CONFIG_KEYS}
    try:
        member = MemberConfig.from_mapping(
            {k: v for k, v in merged.items() if k in CONFIG_KEYS}, default_backend=default_backend
        )
        return JobConfig(
            member=member, **job, read_options=reads, config_file=path, origins=origins
        )
    except ConfigurationError as exc:
        named = [
            f"{k} from {o}"
            for k, o in origins.items()
            if o != DEFAULT and k != "config" and re.search(rf"\b{re.escape(k)}\b", str(exc))
        ]
        raise ConfigurationError(f"{exc} ({'; '.join(named)})" if named else str(exc)) from None


def _layer(values: Mapping[str, object], layer: str, prefix: str) -> dict[str, object]:
    found: dict[str, object] = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name not in LAYER_KEYS:
            noun = "key" if layer == SPARK_CONF else "option"
            raise unknown_option(
                f"{layer} {noun} {prefix}{key}", name, LAYER_KEYS, prefix, str(key)
            )
        if name in found:
            raise ConfigurationError(f"{layer} option {name} is given twice: keep one")
        if value is not None:
            found[name] = value
    return found


def _toml_choice(
    layers: list[tuple[str, dict[str, object]]], toml_path: str | None
) -> tuple[str | None, str, str]:
    """The TOML file to read, the layer that named it and how, for messages."""
    named = [
        (layers[0][1].get("config"), COMMAND_LINE, "--config on the command line"),
        (layers[1][1].get("config"), SPARK_CONF, f"spark conf key {CONF_PREFIX}config"),
        (toml_path, DEFAULT, "the job's default TOML file"),
    ]
    for path, layer, by in named:
        if path is not None:
            if not isinstance(path, str) or not path.strip():
                raise ConfigurationError(f"the TOML file named by {by} is {show(path)}")
            return path, layer, by
    if os.path.exists(DEFAULT_CONFIG_FILE):  # a missing default file is fine
        return DEFAULT_CONFIG_FILE, DEFAULT, f"the default, {DEFAULT_CONFIG_FILE}"
    return None, DEFAULT, ""
