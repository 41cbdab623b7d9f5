"""A member's configuration: one frozen :class:`MemberConfig`, validated once at the edge.

The Spark glue merges the command line, the ``spark.rebalancer.*`` Spark conf and the TOML file
(in that order of precedence) into one mapping and calls :meth:`MemberConfig.from_mapping`;
everything below trusts the result. Keys may be written with ``-`` or ``_``; values may be
strings (``"2s"``, ``"250ms"``) or proper types; unknown keys are refused. Every check lives
in ``__post_init__``, so a config built directly, or changed with :meth:`MemberConfig.replace`,
is checked the same way, and every refusal names the option, the value seen, the accepted
range and the fix.

Timing, for a session (lease) of ``session_timeout`` seconds: a member renews its lease every
``heartbeat_interval`` and stops all work ``safety_margin`` before the lease could expire in
the store, so nobody else can be granted its resources while it still works on them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.model import validate_group, validate_member_id
from rebalancer_spark.core.urls import BackendUrl, parse_backend_url

__all__ = [
    "ASSIGNOR_NAMES",
    "CONFIG_KEYS",
    "MemberConfig",
    "ProtocolName",
    "parse_duration",
]

ASSIGNOR_NAMES = ("sticky", "round_robin")
"""The assignors a member may ask for; ``sticky`` moves only what balance requires."""


class ProtocolName(StrEnum):
    """How resources change hands during a rebalance."""

    COOPERATIVE = "cooperative"
    """Only moved resources stop: released by the old owner, then granted to the new one."""
    GLOBAL_BARRIER = "global_barrier"
    """Every member stops and acknowledges, then the new assignment starts everywhere."""
    RESOURCE_BARRIER = "resource_barrier"
    """Members claim resources one by one, each claim waiting for the previous owner."""


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>ms|s|m|h)?", re.I)
_DURATION_HELP = (
    "give seconds as a number (10, 2.5) or a number with a unit: '250ms', '2s', '1.5s', '2m', '1h'"
)
_DURATIONS = (
    "session_timeout",
    "heartbeat_interval",
    "safety_margin",
    "stability_window",
    "max_rebalance_delay",
    "rejoin_grace",
    "barrier_timeout",
    "drain_timeout",
    "callback_timeout",
)
_OPTIONAL_DURATIONS = ("heartbeat_interval", "safety_margin", "callback_timeout")


def parse_duration(name: str, value: object) -> float:
    """Seconds from ``value``: a number of seconds, or a string such as ``"250ms"``, ``"2s"``,
    ``"1.5s"``, ``"2m"``, ``"1h"`` or ``"10"`` (seconds). Negative, NaN, infinite, boolean and
    unparseable values are a :class:`ConfigurationError` naming option ``name``."""
    seen = _show(value)
    if isinstance(value, bool):
        raise ConfigurationError(f"{name} = {seen} is a boolean, not a duration: {_DURATION_HELP}")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        if match is None:
            problem = "is negative" if value.strip().startswith("-") else "is not a duration"
            raise ConfigurationError(f"{name} = {seen} {problem}: {_DURATION_HELP}")
        seconds = float(match["number"]) * _UNITS[(match["unit"] or "s").lower()]
    else:
        raise ConfigurationError(
            f"{name} = {seen} ({type(value).__name__}) is not a duration: {_DURATION_HELP}"
        )
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{name} = {seen} is not a finite duration: {_DURATION_HELP}")
    if seconds < 0:
        raise ConfigurationError(
            f"{name} = {seen} is negative: durations are 0 seconds or more; {_DURATION_HELP}"
        )
    return seconds + 0.0  # -0.0 becomes 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberConfig:
    """Everything one member of a group needs to know; durations are in seconds.

    ``heartbeat_interval`` and ``safety_margin`` left as ``None`` take the values of
    :attr:`effective_heartbeat_interval` and :attr:`effective_safety_margin`. The repr shows
    the backend URL redacted.
    """

    group: str
    backend: str
    member_id: str | None = None
    protocol: ProtocolName = ProtocolName.COOPERATIVE
    assignor: str = "sticky"
    session_timeout: float = 10.0
    heartbeat_interval: float | None = None
    safety_margin: float | None = None
    stability_window: float = 0.1
    max_rebalance_delay: float = 5.0
    rejoin_grace: float = 0.0
    barrier_timeout: float = 10.0
    drain_timeout: float = 30.0
    callback_timeout: float | None = None
    """The longest ``on_assigned`` / ``on_revoked`` / ``on_lost`` may run: past it the member
    gives the resources concerned up as lost so that they move (None: ``session_timeout / 2``,
    see :attr:`effective_callback_timeout`)."""
    metrics_port: int = 0
    """Serve this member's Prometheus metrics over HTTP on this port; 0 (default) = off."""

    def __post_init__(self) -> None:
        validate_group(self.group)
        backend: object = self.backend
        if not isinstance(backend, str):
            raise ConfigurationError(
                f"backend must be a URL string, got {type(backend).__name__}: give e.g. "
                "--backend zookeeper://zk1:2181/rebalancer"
            )
        parse_backend_url(backend)
        if self.member_id is not None:
            validate_member_id(self.member_id)
        object.__setattr__(self, "protocol", _protocol(self.protocol))
        object.__setattr__(self, "assignor", _assignor(self.assignor))
        for name in _DURATIONS:
            value = getattr(self, name)
            if value is not None or name not in _OPTIONAL_DURATIONS:
                object.__setattr__(self, name, parse_duration(name, value))
        object.__setattr__(self, "metrics_port", _port("metrics_port", self.metrics_port))
        self._check_ranges()

    def _check_ranges(self) -> None:
        ttl = self.session_timeout
        _within("session_timeout", ttl, 0.5, 600, "the lease time-to-live of a member")
        half = f"below session_timeout / 2 = {ttl / 2:g} s"
        if self.heartbeat_interval is not None and not 0 < self.heartbeat_interval < ttl / 2:
            raise ConfigurationError(
                f"heartbeat_interval = {self.heartbeat_interval:g} s does not fit "
                f"session_timeout = {ttl:g} s: it must be above 0 and {half}, so that a "
                "lease is renewed at least twice per session. Lower heartbeat_interval, raise "
                f"session_timeout, or leave heartbeat_interval unset for {ttl / 5:g} s"
            )
        if self.safety_margin is not None and not 0 < self.safety_margin < ttl / 2:
            raise ConfigurationError(
                f"safety_margin = {self.safety_margin:g} s does not fit session_timeout = "
                f"{ttl:g} s: it must be above 0 and {half} (a member stops all work this long "
                "before its lease can expire). Change safety_margin or session_timeout, or "
                f"leave safety_margin unset for {_default_margin(ttl):g} s"
            )
        _within("stability_window", self.stability_window, 0, 300, "quiet time before a rebalance")
        if self.max_rebalance_delay < self.stability_window:
            raise ConfigurationError(
                f"max_rebalance_delay = {self.max_rebalance_delay:g} s is shorter than "
                f"stability_window = {self.stability_window:g} s: it must be at least "
                "stability_window (a rebalance waits for quiet, but never longer than "
                "max_rebalance_delay). Raise max_rebalance_delay or lower stability_window"
            )
        _within("rejoin_grace", self.rejoin_grace, 0, 3600, "wait for a departed static member")
        if self.rejoin_grace > 0 and self.member_id is None:
            raise ConfigurationError(
                f"rejoin_grace = {self.rejoin_grace:g} s applies only to static members, but "
                "no member_id is given: set a static member id (--member-id NAME) or set "
                "rejoin_grace to 0"
            )
        _within("barrier_timeout", self.barrier_timeout, 0, 3600, "wait for acks", open_low=True)
        _within("drain_timeout", self.drain_timeout, 0, 3600, "wait to move resources away")
        if self.callback_timeout is not None:
            _within(
                "callback_timeout",
                self.callback_timeout,
                0,
                3600,
                "the longest a user callback may run",
                open_low=True,
            )

    @property
    def effective_heartbeat_interval(self) -> float:
        """Seconds between lease renewals: ``heartbeat_interval``, or ``session_timeout / 5``."""
        if self.heartbeat_interval is not None:
            return self.heartbeat_interval
        return self.session_timeout / 5

    @property
    def effective_safety_margin(self) -> float:
        """How long before its lease can expire a member stops all work: ``safety_margin``,
        or ``max(0.05 * session_timeout, 0.1)``."""
        if self.safety_margin is not None:
            return self.safety_margin
        return _default_margin(self.session_timeout)

    @property
    def effective_callback_timeout(self) -> float:
        """The longest a user callback may run: ``callback_timeout``, or
        ``session_timeout / 2``."""
        if self.callback_timeout is not None:
            return self.callback_timeout
        return self.session_timeout / 2

    @property
    def backend_url(self) -> BackendUrl:
        """The parsed :attr:`backend` (already checked at construction)."""
        return parse_backend_url(self.backend)

    @classmethod
    def from_mapping(cls, values: Mapping[str, object], *, default_backend: str) -> MemberConfig:
        """Build a config from merged settings. Keys use ``-`` or ``_``; a ``None`` value
        counts as not given (as argparse reports an option that was left out); ``backend``
        defaults to ``default_backend``."""
        given = {k: v for k, v in _normalise(values).items() if v is not None}
        if "group" not in given:
            raise ConfigurationError(
                "no group is given: every member must name the group it joins, with "
                '--group NAME, spark.rebalancer.group, or group = "NAME" in the TOML file'
            )
        given.setdefault("backend", default_backend)
        kwargs: dict[str, Any] = given
        return cls(**kwargs)

    def replace(self, **changes: object) -> MemberConfig:
        """A copy with ``changes`` applied and checked like a new config."""
        kwargs: dict[str, Any] = _normalise(changes)
        return dataclasses.replace(self, **kwargs)

    def __repr__(self) -> str:  # kept by @dataclass; shows the backend URL without secrets
        shown = {
            f.name: self.backend_url.redacted() if f.name == "backend" else getattr(self, f.name)
            for f in dataclasses.fields(self)
        }
        return f"MemberConfig({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


CONFIG_KEYS: tuple[str, ...] = tuple(sorted(f.name for f in dataclasses.fields(MemberConfig)))
"""The keys :meth:`MemberConfig.from_mapping` accepts (each may also be written with ``-``)."""


def _normalise(values: Mapping[str, object]) -> dict[str, object]:
    result: dict[str, object] = {}
    spelled: dict[str, str] = {}
    for raw, value in values.items():
        key_given: object = raw
        if not isinstance(key_given, str):
            raise ConfigurationError(
                f"option name {key_given!r} is not a string: use one of {', '.join(CONFIG_KEYS)}"
            )
        key = key_given.strip().replace("-", "_")
        if key not in CONFIG_KEYS:
            raise ConfigurationError(
                f"unknown option {key_given!r}{_did_you_mean(key, CONFIG_KEYS)}: the options are "
                f"{', '.join(CONFIG_KEYS)} (written with '-' or '_')"
            )
        if key in result:
            raise ConfigurationError(
                f"option {key} is given twice, as {spelled[key]!r} and {key_given!r}: keep one"
            )
        result[key], spelled[key] = value, key_given
    return result


def _protocol(value: object) -> ProtocolName:
    if isinstance(value, ProtocolName):
        return value
    names = [p.value for p in ProtocolName]
    if isinstance(value, str):
        wanted = value.strip().lower().replace("-", "_")
        for protocol in ProtocolName:
            if protocol.value == wanted:
                return protocol
        hint = _did_you_mean(wanted, names)
    else:
        hint = ""
    raise ConfigurationError(
        f"protocol = {_show(value)} is not a protocol{hint}: use one of {', '.join(names)} "
        "(cooperative is the default)"
    )


def _assignor(value: object) -> str:
    if isinstance(value, str):
        wanted = value.strip().lower().replace("-", "_")
        if wanted in ASSIGNOR_NAMES:
            return wanted
        hint = _did_you_mean(wanted, ASSIGNOR_NAMES)
    else:
        hint = ""
    raise ConfigurationError(
        f"assignor = {_show(value)} is not an assignor{hint}: use one of "
        f"{', '.join(ASSIGNOR_NAMES)} (sticky is the default)"
    )


def _port(name: str, value: object) -> int:
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and text.isdigit():
        text = int(text)
    if isinstance(text, bool) or not isinstance(text, int) or not 0 <= text <= 65535:
        raise ConfigurationError(
            f"{name} = {_show(value)} is not a TCP port: give a whole number from 1 to 65535, "
            "or 0 to turn it off"
        )
    return text


def _within(
    name: str, seconds: float, low: float, high: float, what: str, *, open_low: bool = False
) -> None:
    if (seconds <= low if open_low else seconds < low) or seconds > high:
        accepted = f"{'above ' if open_low else ''}{low:g} to {high:g} seconds"
        raise ConfigurationError(
            f"{name} = {seconds:g} s is out of range ({what}): accepted is {accepted}; set "
            f"{name} to a value in that range"
        )


def _default_margin(session_timeout: float) -> float:
    return max(0.05 * session_timeout, 0.1)


def _did_you_mean(word: str, choices: Collection[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _show(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
