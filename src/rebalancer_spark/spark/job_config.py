"""The checked, frozen options of a Spark job: :class:`JobConfig`.

Every value is checked once, when the object is made (whoever makes it: :func:`.options.resolve`
or a test), and every refusal is a :class:`ConfigurationError` that names the option, the value
seen (secrets hidden) and what to give instead. :meth:`JobConfig.describe` is the start-up
summary of every option, its value and the layer it came from.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from rebalancer_spark.core.config import CONFIG_KEYS, MemberConfig, parse_duration
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.model import validate_resource_id
from rebalancer_spark.core.urls import redact_url
from rebalancer_spark.spark.option_table import (
    BY_NAME,
    DEFAULT,
    FORMATS,
    MEMBERSHIP,
    OPTIONS,
    OUTPUT_FORMATS,
    SOURCE,
    TIMING,
    check_read_key,
    show,
)

__all__ = ["JobConfig"]


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://\S")
_SECRET_NAME = re.compile(r"pass|pwd|secret|token|credential|api_?key", re.IGNORECASE)


def _empty() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class JobConfig:
    """A Spark job's options, merged from its layers and checked; durations are in seconds.

    ``origins`` names, for every option, the layer that gave it (``"command line"``,
    ``"spark conf"``, ``"TOML file PATH"`` or ``"default"``); reader options appear there as
    ``read.KEY``. The repr and :meth:`describe` show URLs redacted.
    """

    member: MemberConfig
    source: str | None = None
    resources: tuple[str, ...] | None = None
    output: str | None = None
    output_format: str = "delta"
    checkpoint_root: str | None = None
    files_history: str | None = None
    audit: str | None = None
    format: str = "csv"
    schema: str | None = None
    read_options: Mapping[str, str] = field(default_factory=_empty, hash=False)
    max_files_per_batch: int = 100
    log_format: str = "text"
    poll_interval: float = 2.0
    lag_interval: float = 60.0
    discovery_interval: float = 30.0
    config_file: str | None = None
    origins: Mapping[str, str] = field(default_factory=_empty, hash=False)

    def __post_init__(self) -> None:
        member: object = self.member
        if not isinstance(member, MemberConfig):
            raise ConfigurationError(
                f"member must be a MemberConfig, got {type(member).__name__}: build it with "
                "MemberConfig.from_mapping, or let resolve() build the whole JobConfig"
            )
        source = _text("source", self.source)
        if source is not None and not _URL.match(source):
            raise ConfigurationError(
                f"source = {show(source)} is not a URL: give scheme://..., e.g. "
                "file:///data/landing/ or s3://bucket/prefix/"
            )
        resources = _resources(self.resources)
        if source is not None and resources is not None:
            raise ConfigurationError(
                f"source = {show(source)} and resources ({len(resources)} listed) are both "
                "given: a job discovers its resources from a source or takes a static list, "
                "not both; remove one"
            )
        checked = {
            "source": source,
            "resources": resources,
            "output": _text("output", self.output),
            "output_format": _output_format(self.output_format),
            "checkpoint_root": _text("checkpoint_root", self.checkpoint_root),
            "files_history": _text("files_history", self.files_history),
            "audit": _text("audit", self.audit),
            "format": _format(self.format),
            "schema": _text("schema", self.schema),
            "read_options": MappingProxyType(_read_options(self.read_options, "read_options")),
            "max_files_per_batch": _count("max_files_per_batch", self.max_files_per_batch),
            "log_format": _log_format(self.log_format),
            "poll_interval": _interval("poll_interval", self.poll_interval, 3600),
            "lag_interval": _interval("lag_interval", self.lag_interval, 86400),
            "discovery_interval": _interval("discovery_interval", self.discovery_interval, 86400),
            "config_file": _text("config_file", self.config_file),
            "origins": MappingProxyType({str(k): str(v) for k, v in self.origins.items()}),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def describe(self) -> str:
        """A multi-line summary for the start-up log: every option, its value (secrets
        hidden) and the layer it came from."""
        where = f"TOML file {self.config_file}" if self.config_file else "no TOML file"
        rows: list[tuple[str, str, str]] = []  # (name, origin, value); no origin: a heading
        for section in (MEMBERSHIP, SOURCE, TIMING):
            rows.append((f"{section}:", "", ""))
            options = [o.name for o in OPTIONS if o.section == section]
            rows += [(name, self._origin(name), self._shown(name)) for name in options]
        rows.append(("reader options:", "", "" if self.read_options else "none"))
        for key, value in sorted(_redacted(self.read_options).items()):
            rows.append((f"read.{key}", self._origin(f"read.{key}"), value))
        width = max(len(name) for name, origin, _ in rows if origin)
        lines = [f"rebalancer job options ({where}):"]
        for name, origin, value in rows:
            line = f"    {name:<{width}}  {origin:<12}  {value}" if origin else f"  {name} {value}"
            lines.append(line.rstrip())
        return "\n".join(lines)

    def _origin(self, name: str) -> str:
        origin = self.origins.get(name, DEFAULT)
        return "TOML file" if origin == f"TOML file {self.config_file}" else origin

    def _shown(self, name: str) -> str:
        member = self.member
        derived: dict[str, Callable[[], str]] = {
            "backend": member.backend_url.redacted,
            "heartbeat_interval": lambda: (
                f"{member.effective_heartbeat_interval:g}s (session_timeout / 5)"
            ),
            "safety_margin": lambda: f"{member.effective_safety_margin:g}s (the default margin)",
            "callback_timeout": lambda: (
                f"{member.effective_callback_timeout:g}s (session_timeout / 2)"
            ),
        }
        value = getattr(member if name in CONFIG_KEYS else self, name)
        if name in derived and (name == "backend" or value is None):
            return derived[name]()
        return _shown_value(BY_NAME[name].kind, value)

    def __repr__(self) -> str:  # kept by @dataclass; shows URLs and secret options redacted
        shown: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("read_options", "origins"):
                value = _redacted(value) if f.name == "read_options" else dict(value)
            elif isinstance(value, str):
                value = redact_url(value)
            elif f.name == "resources" and value is not None:
                value = tuple(redact_url(r) for r in value)
            shown[f.name] = value
        return f"JobConfig({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


def _shown_value(kind: str, value: object) -> str:
    """An option's value as the options table shows it: durations in seconds, long lists cut
    at ten, URLs redacted, ``-`` for none."""
    if value is None:
        return "-"
    if kind == "duration":
        return f"{value:g}s"
    if kind == "list" and isinstance(value, list | tuple):
        more = f", ... ({len(value)} in all)" if len(value) > 10 else ""
        return redact_url(", ".join(str(v) for v in value[:10]) + more)
    return redact_url(str(value))


# --- checks ---------------------------------------------------------------------------------------


def _text(name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"{name} = {show(value)} is not a non-empty string: give a value, or leave {name} out"
        )
    return value.strip()


def _resources(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        items: list[object] = [item.strip() for item in value.split(",")]
    elif isinstance(value, Iterable) and not isinstance(value, Mapping):
        items = list(value)
    else:
        raise ConfigurationError(
            f"resources must be a list of strings, got {type(value).__name__}: give e.g. "
            "--resources a,b,c"
        )
    if not items or "" in items:
        raise ConfigurationError(
            "resources has an empty entry (or is empty): list resource ids separated by "
            "single commas, e.g. --resources a,b,c, or give --source instead"
        )
    ids = tuple(validate_resource_id(item) for item in items)
    twice = sorted({r for r in ids if ids.count(r) > 1})
    if twice:
        raise ConfigurationError(
            f"resources lists {', '.join(map(show, twice[:5]))} more than once: list each once"
        )
    return ids


def _format(value: object) -> str:
    wanted = value.strip().lower() if isinstance(value, str) else value
    if wanted in FORMATS and isinstance(wanted, str):
        return wanted
    hint = _did_you_mean(wanted, FORMATS) if isinstance(wanted, str) else ""
    raise ConfigurationError(
        f"format = {show(value)} is not a reader format{hint}: use one of {', '.join(FORMATS)}"
    )


def _output_format(value: object) -> str:
    wanted = value.strip().lower() if isinstance(value, str) else value
    if wanted in OUTPUT_FORMATS and isinstance(wanted, str):
        return wanted
    raise ConfigurationError(
        f"output_format = {show(value)} is not an output format: use delta (the default: one "
        "fenced Delta commit per batch) or parquet (a directory per batch)"
    )


def _log_format(value: object) -> str:
    wanted = value.strip().lower() if isinstance(value, str) else value
    if wanted in ("text", "json") and isinstance(wanted, str):
        return wanted
    raise ConfigurationError(
        f"log_format = {show(value)} is not a log format: use text (the default) or json"
    )


def _count(name: str, value: object) -> int:
    if isinstance(value, str) and value.strip().isdecimal():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"{name} = {show(value)} is not a whole number of 1 or more: give e.g. 100"
        )
    return value


def _interval(name: str, value: object, high: float) -> float:
    seconds = parse_duration(name, value)
    if not 0 < seconds <= high:
        raise ConfigurationError(
            f"{name} = {seconds:g} s is out of range: accepted is above 0 to {high:g} seconds; "
            f"set {name} to a value in that range"
        )
    return seconds


def _read_options(values: object, name: str) -> dict[str, str]:
    if not isinstance(values, Mapping):
        raise ConfigurationError(f"{name} must be a mapping of names to strings")
    result: dict[str, str] = {}
    for key, value in values.items():
        check_read_key(key, name)
        if not isinstance(value, str):
            raise ConfigurationError(
                f"{name}: reader option {key} is {type(value).__name__}, not a string: give "
                "the value as Spark takes it, e.g. 'true'"
            )
        if any(k.lower() == key.lower() for k in result):
            raise ConfigurationError(f"{name}: reader option {key} is given twice: keep one")
        result[key] = value
    return result


def _redacted(options: Mapping[str, str]) -> dict[str, str]:
    return {k: "***" if _SECRET_NAME.search(k) else redact_url(v) for k, v in options.items()}


def _did_you_mean(word: str, choices: Collection[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
