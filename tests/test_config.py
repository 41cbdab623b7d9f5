"""Tests of the pure configuration core: backend URLs (core.urls) and MemberConfig (core.config)."""

from __future__ import annotations

import dataclasses
import math
from urllib.parse import quote

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from rebalancer_spark.backends import SCHEMES
from rebalancer_spark.backends.registry import default_store_url
from rebalancer_spark.core import config as config_module
from rebalancer_spark.core import urls as urls_module
from rebalancer_spark.core.config import (
    ASSIGNOR_NAMES,
    CONFIG_KEYS,
    MemberConfig,
    ProtocolName,
    parse_duration,
)
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.urls import (
    BackendUrl,
    parse_backend_url,
    redact_url,
)

SQLITE = "sqlite:///var/lib/rebalancer/groups.db"
REDIS_OPTIONS = {"redis": ["health_check_interval", "socket_timeout"]}


def test_public_surface_is_pinned() -> None:
    assert urls_module.__all__ == [
        "BackendUrl",
        "SplitUrl",
        "did_you_mean",
        "parse_backend_url",
        "redact_url",
        "set_backend_parser",
        "show",
        "split_url",
    ]
    assert config_module.__all__ == [
        "ASSIGNOR_NAMES",
        "CONFIG_KEYS",
        "MemberConfig",
        "ProtocolName",
        "parse_duration",
    ]
    assert SCHEMES == ("sqlite", "zookeeper", "redis", "rediss")
    assert ASSIGNOR_NAMES == ("sticky", "round_robin")


# --- backend URLs: what parses, and to what ---------------------------------------------------


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///abs/path.db", "/abs/path.db"),
        ("sqlite:///var/lib/my%20dir/groups.db", "/var/lib/my dir/groups.db"),
        ("sqlite:///var/lib/my dir/groups.db", "/var/lib/my dir/groups.db"),
        ("sqlite:////abs/path.db", "/abs/path.db"),
        ("SQLite:///x.db", "/x.db"),
        ("  sqlite:///x.db\n", "/x.db"),
        ("sqlite:///data/user@host/x.db", "/data/user@host/x.db"),
    ],
)
def test_sqlite_urls(url: str, path: str) -> None:
    parsed = parse_backend_url(url)
    assert parsed.scheme == "sqlite"
    assert parsed.path == path
    assert parsed.hosts == ()
    assert parsed.database == 0
    assert (parsed.username, parsed.password) == (None, None)
    assert dict(parsed.options) == {}


def test_sqlite_options() -> None:
    parsed = parse_backend_url("sqlite:///x.db?timeout=5&journal=wal")
    assert dict(parsed.options) == {"timeout": "5", "journal": "wal"}
    assert parsed.option("timeout", float, 1.0) == 5.0


@pytest.mark.parametrize(
    ("url", "hosts", "chroot"),
    [
        ("zookeeper://h1:2181,h2:2182/chroot/sub", (("h1", 2181), ("h2", 2182)), "/chroot/sub"),
        ("zookeeper://zk", (("zk", 2181),), "/"),
        ("zookeeper://zk/", (("zk", 2181),), "/"),
        ("zookeeper://zk/a/b/", (("zk", 2181),), "/a/b"),
        ("zookeeper://zk1,zk2,zk3:3000/r", (("zk1", 2181), ("zk2", 2181), ("zk3", 3000)), "/r"),
        (
            "zookeeper://[::1]:2182,[fe80::1%25eth0]/x",
            (("::1", 2182), ("fe80::1%25eth0", 2181)),
            "/x",
        ),
        ("zookeeper://zk_1.example.com:1/a%20b", (("zk_1.example.com", 1),), "/a b"),
        ("zookeeper://zk?timeout=3", (("zk", 2181),), "/"),
    ],
)
def test_zookeeper_urls(url: str, hosts: tuple[tuple[str, int], ...], chroot: str) -> None:
    parsed = parse_backend_url(url)
    assert parsed.scheme == "zookeeper"
    assert parsed.hosts == hosts
    assert parsed.path == chroot
    assert parsed.database == 0


def test_zookeeper_digest_credentials_are_percent_decoded() -> None:
    parsed = parse_backend_url("zookeeper://al%20ice:pa%3Ass%2Fw@zk1,zk2:2888/r")
    assert (parsed.username, parsed.password) == ("al ice", "pa:ss/w")
    assert parsed.hosts == (("zk1", 2181), ("zk2", 2888))


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://localhost", ("redis", ("localhost", 6379), 0, None, None)),
        ("redis://localhost/", ("redis", ("localhost", 6379), 0, None, None)),
        ("redis://:secret@h:6380/2", ("redis", ("h", 6380), 2, None, "secret")),
        ("redis://user:p%40ss@h/15", ("redis", ("h", 6379), 15, "user", "p@ss")),
        ("redis://user:@h/1", ("redis", ("h", 6379), 1, "user", None)),
        ("rediss://u@h", ("rediss", ("h", 6379), 0, "u", None)),
        ("REDISS://u:pw@[::1]:7000/3", ("rediss", ("::1", 7000), 3, "u", "pw")),
        ("redis://u:p@ss@h/0", ("redis", ("h", 6379), 0, "u", "p@ss")),
        ("redis://u:p#x:y@h/0", ("redis", ("h", 6379), 0, "u", "p#x:y")),
    ],
)
def test_redis_urls(
    url: str, expected: tuple[str, tuple[str, int], int, str | None, str | None]
) -> None:
    scheme, host, database, username, password = expected
    parsed = parse_backend_url(url)
    assert parsed.scheme == scheme
    assert parsed.hosts == (host,)
    assert parsed.path == ""
    assert parsed.database == database
    assert (parsed.username, parsed.password) == (username, password)


def test_redis_options_are_percent_decoded_and_typed() -> None:
    parsed = parse_backend_url(
        "redis://h/0?socket_timeout=2.5&client_name=a%26b&retries=3&tls=Yes&empty=&"
    )
    assert dict(parsed.options) == {
        "socket_timeout": "2.5",
        "client_name": "a&b",
        "retries": "3",
        "tls": "Yes",
        "empty": "",
    }
    assert parsed.option("socket_timeout", float, 1.0) == 2.5
    assert parsed.option("retries", int, 0) == 3
    assert parsed.option("tls", bool, False) is True
    assert parsed.option("missing", int, 7) == 7
    with pytest.raises(TypeError):
        parsed.options["x"] = "y"  # type: ignore[index]


def test_allowed_options_accept_known_names() -> None:
    parsed = parse_backend_url("redis://h/0?socket_timeout=1", allowed_options=REDIS_OPTIONS)
    assert dict(parsed.options) == {"socket_timeout": "1"}
    assert parse_backend_url("zookeeper://h", allowed_options=REDIS_OPTIONS).options == {}


def test_backend_url_is_a_hashable_value() -> None:
    first = parse_backend_url("redis://:pw@h/0?a=1")
    assert first == parse_backend_url("redis://:pw@h:6379/0?a=1")
    assert hash(first) == hash(parse_backend_url("redis://:pw@h:6379/0?a=1"))
    assert first != parse_backend_url("redis://:pw@h/0?a=2")


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("sqlite:///a b/x.db", "sqlite:///a%20b/x.db"),
        ("zookeeper://u:pw@h1,h2:2/r/", "zookeeper://u:***@h1:2181,h2:2/r"),
        ("zookeeper://h", "zookeeper://h:2181"),
        ("redis://:pw@h", "redis://:***@h:6379/0"),
        ("redis://u@h/1", "redis://u@h:6379/1"),
        ("rediss://[::1]/2?password=pw&a=1", "rediss://[::1]:6379/2?password=***&a=1"),
    ],
)
def test_redacted_is_canonical_and_hides_secrets(url: str, redacted: str) -> None:
    parsed = parse_backend_url(url)
    assert parsed.redacted() == redacted
    assert repr(parsed) == f"BackendUrl({redacted!r})"


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///abs/path.db?timeout=5",
        "sqlite:///a%3Fb%23c%25d/x.db",
        "zookeeper://u@h1:2181,[::1]:2/r/s?x=a%26b",
        "zookeeper://h/a%40b",
        "redis://h:1/15",
        "rediss://u%3Ax@h",
    ],
)
def test_redacted_parses_back_to_the_same_value(url: str) -> None:
    parsed = parse_backend_url(url)
    assert parse_backend_url(parsed.redacted()) == parsed


# --- backend URLs: what is refused, and what the message says ----------------------------------


@pytest.mark.parametrize(
    ("url", "fragments"),
    [
        ("redis://h:0/0", ["'0'", "1 to 65535"]),
        ("redis://h:65536", ["'65536'", "1 to 65535"]),
        ("redis://h:abc", ["'abc'", "h:6379"]),
        ("redis://h:", ["port ''"]),
        ("redis://h:\uff19/0", ["'\uff19'"]),
        ("zookeeper://h1:2181,h2:99999/x", ["'99999'", "'h2'"]),
        ("zookeeper://h1,,h2", ["empty entry", "comma"]),
        ("zk://h/x", ["'zk'", "did you mean 'zookeeper'", "zookeeper://zk1:2181"]),
        ("mysql://h/db", ["'mysql'", *SCHEMES, "sqlite:///var/lib/rebalancer/groups.db"]),
        ("redi://h", ["'redi'", "did you mean 'redis'"]),
        ("", ["''", "scheme://"]),
        ("groups.db", ["'groups.db'", "sqlite:///"]),
        ("sqlite:relative.db", ["'relative.db'", "sqlite:///full/path/to/relative.db"]),
        ("sqlite:/abs/x.db", ["three slashes", "sqlite:///abs/x.db"]),
        ("sqlite://relative/x.db", ["sqlite takes no host", "'relative'", "/relative/x.db"]),
        ("sqlite://localhost/data/x.db", ["sqlite takes no host", "sqlite:///data/x.db"]),
        ("sqlite://./x.db", ["sqlite takes no host", "sqlite:///full/path/to/x.db"]),
        ("sqlite:///./x.db", ["'./x.db'", "relative", "sqlite:///full/path/to/x.db"]),
        ("sqlite:///../x.db", ["'../x.db'", "relative"]),
        ("sqlite:///~/x.db", ["'~/x.db'", "not expanded"]),
        ("sqlite://", ["empty path", "sqlite:///full/path/to/groups.db"]),
        ("sqlite://?timeout=1", ["empty path"]),
        ("sqlite:///", ["directory", "sqlite:///groups.db"]),
        ("sqlite:///data/", ["'/data/'", "directory", "sqlite:///data/groups.db"]),
        ("sqlite:///a%00b.db", ["'/a\\x00b.db'", "NUL"]),
        ("sqlite:///a\x00b.db", ["\\x00", "control character"]),
        ("sqlite:///a#b.db", ["'#'", "%23"]),
        ("zookeeper://h/a/../b", ["'/a/../b'", "'..'"]),
        ("zookeeper://h/a/./b", ["'/a/./b'", "'.'"]),
        ("zookeeper://h/%2E%2E", ["'/..'", "'..'"]),
        ("zookeeper://h/a//b", ["'/a//b'", "empty segment"]),
        ("zookeeper://h//", ["'//'", "empty segment"]),
        ("zookeeper://h/a%00", ["'/a\\x00'", "NUL"]),
        ("zookeeper://h/a\x07", ["\\x07", "control character"]),
        ("zookeeper://h/zookeeper/quota", ["'/zookeeper/quota'", "reserves"]),
        ("zookeeper://", ["names no host", "zookeeper://zk1:2181"]),
        ("redis://h/16", ["'16'", "0 to 15"]),
        ("redis://h/-1", ["'-1'", "0 to 15"]),
        ("redis://h/db1", ["'db1'", "0 to 15"]),
        ("redis://h/0/1", ["'0/1'", "0 to 15"]),
        ("redis://h/99999999999999999999", ["'99999999999999999999'"]),
        ("redis://h1,h2/0", ["'h1,h2'", "exactly one host"]),
        ("redis:///0", ["names no host", "redis://"]),
        ("redis://:pw@/0", ["names no host"]),
        ("redis://::1/0", ["'::1'", "brackets", "[::1]:6379"]),
        ("redis://[::1/0", ["'[::1'", "[::1]:6379"]),
        ("redis://[::1]x/0", ["'[::1]x'"]),
        ("redis://[zz]/0", ["'[zz]'"]),
        ("redis://bad host/0", ["'bad host'", "host name"]),
        ("redis://hö/0", ["'hö'", "punycode"]),
        ("redis://-h/0", ["'-h'"]),
        ("redis://h?a=1&a=2", ["'a'", "twice", "'1'", "'2'"]),
        ("redis://h?flag", ["'flag'", "flag=VALUE"]),
        ("redis://h?=1", ["no name"]),
        ("redis://h?a=%0A", ["'a'", "control character"]),
        ("redis://h/0#frag", ["'#'", "no fragment"]),
        ("redis://h/0?x=a@b", ["'@'", "%40"]),
    ],
)
def test_malformed_urls_are_refused_with_a_clear_message(url: str, fragments: list[str]) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_backend_url(url)
    message = str(caught.value)
    assert "backend URL" in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_a_non_string_url_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="must be a string, got int"):
        parse_backend_url(42)  # type: ignore[arg-type]


def test_unknown_option_names_the_key_the_allowed_ones_and_a_suggestion() -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_backend_url("redis://h/0?sokcet_timeout=1", allowed_options=REDIS_OPTIONS)
    message = str(caught.value)
    assert "'sokcet_timeout'" in message
    assert "did you mean 'socket_timeout'?" in message
    assert "health_check_interval, socket_timeout" in message


def test_unknown_option_far_from_any_allowed_gets_no_suggestion() -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_backend_url("redis://h/0?zzz=1", allowed_options=REDIS_OPTIONS)
    assert "did you mean" not in str(caught.value)
    assert "'zzz'" in str(caught.value)


def test_a_scheme_missing_from_allowed_options_accepts_none() -> None:
    with pytest.raises(ConfigurationError, match=r"sqlite URLs accept these options: none"):
        parse_backend_url("sqlite:///x.db?timeout=1", allowed_options=REDIS_OPTIONS)


def test_option_with_a_bad_value_names_option_value_and_url() -> None:
    parsed = parse_backend_url("redis://u:hunter2@h/0?socket_timeout=soon&tls=maybe")
    with pytest.raises(ConfigurationError) as caught:
        parsed.option("socket_timeout", float, 1.0)
    message = str(caught.value)
    assert "socket_timeout" in message
    assert "'soon'" in message
    assert "redis://u:***@h:6379/0" in message
    assert "hunter2" not in message
    with pytest.raises(ConfigurationError, match=r"tls = 'maybe'.*true/false"):
        parsed.option("tls", bool, False)


def test_option_with_a_secret_name_never_shows_its_value() -> None:
    parsed = parse_backend_url("redis://h/0?auth_token=s3cr3t-value")
    with pytest.raises(ConfigurationError) as caught:
        parsed.option("auth_token", int, 0)
    assert "s3cr3t-value" not in str(caught.value)
    assert "auth_token = ***" in str(caught.value)
    with pytest.raises(ConfigurationError) as twice:
        parse_backend_url("redis://h/0?password=one-secret&password=two-secret")
    assert "secret" not in str(twice.value)


# --- redact_url and default_store_url ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("redis://u:pw@h:6379/0", "redis://u:***@h:6379/0"),
        ("redis://:pw@h", "redis://:***@h"),
        (
            "Error connecting to redis://u:p@ss/w?d@h:1. Bye",
            "Error connecting to redis://u:***@h:1. Bye",
        ),
        ("a zookeeper://x:y@z and rediss://:q@r", "a zookeeper://x:***@z and rediss://:***@r"),
        ("redis://h/0?password=pw&x=1", "redis://h/0?password=***&x=1"),
        ("redis://h/0?x=1&auth_token=t", "redis://h/0?x=1&auth_token=***"),
        ("zookeeper://h1:2181,h2:2181/r", "zookeeper://h1:2181,h2:2181/r"),
        ("redis://user@h/0", "redis://user@h/0"),
        ("connection refused", "connection refused"),
    ],
)
def test_redact_url(text: str, expected: str) -> None:
    assert redact_url(text) == expected
    assert redact_url(expected) == expected


def test_default_store_url() -> None:
    assert default_store_url("/var/lib/rebalancer") == SQLITE
    assert default_store_url("/var/lib/rebalancer/") == SQLITE
    assert default_store_url("/") == "sqlite:///groups.db"
    with pytest.raises(ConfigurationError, match=r"'state' is not an absolute path"):
        default_store_url("state")


# Printable characters but '/', drawn as such (filtering them out of any text failed
# Hypothesis' filter_too_much health check on some seeds).
_NAME_CHARS = st.characters(
    exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"), exclude_characters="/"
)


@given(st.lists(st.text(_NAME_CHARS, min_size=1), max_size=4))
def test_default_sqlite_url_round_trips_any_directory(parts: list[str]) -> None:
    assume(not parts or (parts[0] not in (".", "..") and not parts[0].startswith("~")))
    directory = "/" + "/".join(parts)
    parsed = parse_backend_url(default_store_url(directory))
    assert parsed.path == directory.rstrip("/") + "/groups.db"


# --- secrets never leak (property-based) -------------------------------------------------------

LEAK_TEMPLATES = [
    "redis://user:{pw}@host:6379/0?socket_timeout=x",
    "rediss://:{pw}@host/0",
    "redis://:{pw}@host:70000/0",
    "redis://:{pw}@host/99",
    "redis://u:{pw}@h1,h2/0",
    "redis://u:{pw}@h/0?sokcet_timeout=1",
    "redis://u:{pw}@h/0?a=1&a=2",
    "redis://u:{pw}@h/0?password={quoted}",
    "redis://u:{pw}@h/0#x",
    "redis://u:{pw}@/0",
    "zookeeper://u:{pw}@h1,h2:2182/r",
    "zookeeper://u:{pw}@h1,h2:0/r",
    "zookeeper://u:{pw}@h/../x",
    "zookeeper://u:{pw}@h/zookeeper",
    "sqlite://u:{pw}@/x.db",
    "mysql://u:{pw}@h/db",
    "redis:u:{pw}@h",
]


def _texts(url: str) -> list[str]:
    """Everything a user or a log could see of ``url``."""
    seen = []
    if "://" in url:  # redact_url knows scheme://user:password@ only
        seen.append(redact_url(f"Error 111 connecting to {url}. Connection refused."))
    try:
        parsed = parse_backend_url(url, allowed_options=REDIS_OPTIONS)
    except ConfigurationError as exc:
        return [*seen, str(exc), repr(exc)]
    seen += [repr(parsed), str(parsed), parsed.redacted()]
    try:
        parsed.option("socket_timeout", float, 1.0)
    except ConfigurationError as exc:
        seen.append(str(exc))
    try:
        config = MemberConfig(group="g", backend=url)
    except ConfigurationError as exc:
        seen.append(str(exc))
    else:
        seen.append(repr(config))
    return seen


@given(password=st.text(min_size=1, max_size=40), template=st.sampled_from(LEAK_TEMPLATES))
def test_percent_encoded_passwords_never_leak(password: str, template: str) -> None:
    if "password={quoted}" in template:  # an option value with control characters is refused
        assume(password.isprintable())
    reference = _texts(template.format(pw="Reference", quoted="Reference"))
    assume(not any(password in text or quote(password, safe="") in text for text in reference))
    encoded = quote(password, safe="")
    seen = _texts(template.format(pw=encoded, quoted=encoded))
    assert seen == reference  # nothing a user sees depends on the password
    if template.startswith("redis://user:"):
        assert parse_backend_url(template.format(pw=encoded)).password == password


RAW_PASSWORD = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Cf", "Co", "Cn", "Zs", "Zl", "Zp")),
    min_size=1,
    max_size=30,
)
STRUCTURAL = set("/?#@:&=%")


@given(password=RAW_PASSWORD, template=st.sampled_from(LEAK_TEMPLATES))
def test_raw_passwords_never_leak_even_with_unencoded_special_characters(
    password: str, template: str
) -> None:
    # Replacing every non-structural character must change nothing a user sees.
    reference_password = "".join(c if c in STRUCTURAL else "x" for c in password)
    assume(reference_password != password)
    seen = _texts(template.format(pw=password, quoted=quote(password, safe="")))
    reference = _texts(
        template.format(pw=reference_password, quoted=quote(reference_password, safe=""))
    )
    assert seen == reference


@given(password=RAW_PASSWORD.filter(lambda p: not set(p) & set("/?%")))
def test_raw_passwords_with_at_colon_and_hash_are_understood(password: str) -> None:
    parsed = parse_backend_url(f"redis://user:{password}@host:6379/0")
    assert (parsed.username, parsed.password, parsed.hosts) == ("user", password, (("host", 6379),))


# --- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (10, 10.0),
        (2.5, 2.5),
        (0, 0.0),
        (-0.0, 0.0),
        ("10", 10.0),
        ("250ms", 0.25),
        ("2s", 2.0),
        ("1.5s", 1.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        (" 3 S ", 3.0),
        (".5s", 0.5),
        ("5.", 5.0),
        ("0ms", 0.0),
    ],
)
def test_parse_duration_accepts(value: object, seconds: float) -> None:
    result = parse_duration("session_timeout", value)
    assert result == seconds
    assert type(result) is float
    assert math.copysign(1.0, result) == 1.0


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (-1, "-1"),
        (-0.5, "-0.5"),
        ("-1s", "'-1s'"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        ("nan", "'nan'"),
        ("inf", "'inf'"),
        (True, "True"),
        (False, "False"),
        (None, "None"),
        ([1], "[1]"),
        ("", "''"),
        ("soon", "'soon'"),
        ("2 days", "'2 days'"),
        ("1e3", "'1e3'"),
        ("5x", "'5x'"),
        ("1.2.3s", "'1.2.3s'"),
        (10**400, "1000"),
        ("9" * 400 + "h", "'999"),
    ],
)
def test_parse_duration_refuses(value: object, shown: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_duration("drain_timeout", value)
    message = str(caught.value)
    assert message.startswith(f"drain_timeout = {shown}")
    assert "'250ms'" in message


@given(st.integers(0, 10**6), st.sampled_from([("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)]))
def test_parse_duration_units(number: int, unit: tuple[str, float]) -> None:
    suffix, factor = unit
    assert math.isclose(parse_duration("x", f"{number}{suffix}"), number * factor)


@given(st.floats(min_value=0, allow_nan=False, allow_infinity=False))
def test_parse_duration_keeps_numbers(value: float) -> None:
    assert parse_duration("x", value) == value


# --- MemberConfig ------------------------------------------------------------------------------


def test_config_keys_are_the_sorted_fields() -> None:
    assert CONFIG_KEYS == (
        "assignor",
        "backend",
        "barrier_timeout",
        "callback_timeout",
        "drain_timeout",
        "group",
        "heartbeat_interval",
        "max_rebalance_delay",
        "member_id",
        "metrics_port",
        "protocol",
        "rejoin_grace",
        "safety_margin",
        "session_timeout",
        "stability_window",
    )
    assert set(CONFIG_KEYS) == {f.name for f in dataclasses.fields(MemberConfig)}


def test_defaults() -> None:
    config = MemberConfig(group="orders", backend=SQLITE)
    assert config.member_id is None
    assert config.protocol is ProtocolName.COOPERATIVE
    assert config.assignor == "sticky"
    assert config.session_timeout == 10.0
    assert (config.heartbeat_interval, config.safety_margin) == (None, None)
    assert config.effective_heartbeat_interval == 2.0
    assert config.effective_safety_margin == 0.5
    assert config.stability_window == 0.1
    assert config.max_rebalance_delay == 5.0
    assert config.rejoin_grace == 0.0
    assert config.barrier_timeout == 10.0
    assert config.drain_timeout == 30.0
    assert config.backend_url == parse_backend_url(SQLITE)


@pytest.mark.parametrize(
    ("session_timeout", "heartbeat", "margin"),
    [(0.5, 0.1, 0.1), (1.0, 0.2, 0.1), (2.0, 0.4, 0.1), (10.0, 2.0, 0.5), (600.0, 120.0, 30.0)],
)
def test_derived_timings(session_timeout: float, heartbeat: float, margin: float) -> None:
    config = MemberConfig(group="g", backend=SQLITE, session_timeout=session_timeout)
    assert math.isclose(config.effective_heartbeat_interval, heartbeat)
    assert math.isclose(config.effective_safety_margin, margin)


def test_explicit_timings_win() -> None:
    config = MemberConfig(group="g", backend=SQLITE, heartbeat_interval=1.0, safety_margin=0.3)
    assert (config.effective_heartbeat_interval, config.effective_safety_margin) == (1.0, 0.3)


@given(st.floats(min_value=0.5, max_value=600))
def test_derived_timings_always_leave_room(session_timeout: float) -> None:
    config = MemberConfig(group="g", backend=SQLITE, session_timeout=session_timeout)
    heartbeat, margin = config.effective_heartbeat_interval, config.effective_safety_margin
    assert 0 < heartbeat < session_timeout / 2
    assert 0 < margin < session_timeout / 2
    assert heartbeat + margin < session_timeout


def test_from_mapping_accepts_strings_and_both_spellings() -> None:
    config = MemberConfig.from_mapping(
        {
            "group": "orders",
            "member-id": "job-1",
            "protocol": "global-barrier",
            "assignor": "Round-Robin",
            "session-timeout": "2s",
            "heartbeat_interval": "250ms",
            "safety-margin": 0.2,
            "stability-window": "0",
            "max_rebalance_delay": "1m",
            "rejoin-grace": "30s",
            "barrier_timeout": 5,
            "drain-timeout": "1h",
            "backend": "zookeeper://zk1,zk2/r",
        },
        default_backend=SQLITE,
    )
    assert config == MemberConfig(
        group="orders",
        backend="zookeeper://zk1,zk2/r",
        member_id="job-1",
        protocol=ProtocolName.GLOBAL_BARRIER,
        assignor="round_robin",
        session_timeout=2.0,
        heartbeat_interval=0.25,
        safety_margin=0.2,
        stability_window=0.0,
        max_rebalance_delay=60.0,
        rejoin_grace=30.0,
        barrier_timeout=5.0,
        drain_timeout=3600.0,
    )
    assert config.backend == "zookeeper://zk1,zk2/r"  # the original string is kept


def test_from_mapping_defaults_backend_and_treats_none_as_not_given() -> None:
    config = MemberConfig.from_mapping(
        {"group": "g", "backend": None, "session_timeout": None, "member_id": None},
        default_backend=SQLITE,
    )
    assert config == MemberConfig(group="g", backend=SQLITE)


def test_missing_group_says_how_to_give_it() -> None:
    for values in ({}, {"group": None}, {"session_timeout": "1s"}):
        with pytest.raises(ConfigurationError) as caught:
            MemberConfig.from_mapping(values, default_backend=SQLITE)
        message = str(caught.value)
        assert "--group NAME" in message
        assert "spark.rebalancer.group" in message
        assert 'group = "NAME"' in message


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("sesion_timeout", "session_timeout"),
        ("session-timout", "session_timeout"),
        ("sessionTimeout", "session_timeout"),
        ("heartbeat", "heartbeat_interval"),
        ("groups", "group"),
        ("protocl", "protocol"),
    ],
)
def test_unknown_keys_are_refused_with_a_suggestion(key: str, suggestion: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        MemberConfig.from_mapping({"group": "g", key: "1"}, default_backend=SQLITE)
    message = str(caught.value)
    assert f"unknown option {key!r}" in message
    assert f"did you mean {suggestion!r}?" in message
    assert ", ".join(CONFIG_KEYS) in message


def test_unknown_key_far_from_any_gets_no_suggestion() -> None:
    with pytest.raises(ConfigurationError) as caught:
        MemberConfig.from_mapping({"group": "g", "xyzzy": 1}, default_backend=SQLITE)
    assert "did you mean" not in str(caught.value)


def test_a_key_given_in_both_spellings_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"session_timeout is given twice"):
        MemberConfig.from_mapping(
            {"group": "g", "session-timeout": 1, "session_timeout": 2}, default_backend=SQLITE
        )


def test_a_non_string_key_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"option name 3 is not a string"):
        MemberConfig.from_mapping({"group": "g", 3: 1}, default_backend=SQLITE)  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({"session_timeout": 0.4}, ["session_timeout = 0.4 s", "0.5 to 600 seconds"]),
        ({"session_timeout": "601s"}, ["session_timeout = 601 s", "0.5 to 600 seconds"]),
        ({"session_timeout": "11m"}, ["session_timeout = 660 s"]),
        ({"heartbeat_interval": 5}, ["heartbeat_interval = 5 s", "below session_timeout / 2"]),
        ({"heartbeat_interval": 0}, ["heartbeat_interval = 0 s", "above 0", "unset for 2 s"]),
        ({"safety_margin": "5s"}, ["safety_margin = 5 s", "below session_timeout / 2 = 5 s"]),
        ({"safety_margin": 0}, ["safety_margin = 0 s", "unset for 0.5 s"]),
        ({"stability_window": 301}, ["stability_window = 301 s", "0 to 300 seconds"]),
        (
            {"stability_window": 2, "max_rebalance_delay": 1},
            ["max_rebalance_delay = 1 s", "stability_window = 2 s", "at least"],
        ),
        ({"rejoin_grace": 3601, "member_id": "m"}, ["rejoin_grace = 3601 s", "0 to 3600"]),
        ({"rejoin_grace": 5}, ["rejoin_grace = 5 s", "static members", "--member-id"]),
        ({"barrier_timeout": 0}, ["barrier_timeout = 0 s", "above 0 to 3600 seconds"]),
        ({"barrier_timeout": "2h"}, ["barrier_timeout = 7200 s", "above 0 to 3600 seconds"]),
        ({"drain_timeout": 3601}, ["drain_timeout = 3601 s", "0 to 3600 seconds"]),
        ({"drain_timeout": -1}, ["drain_timeout = -1", "negative"]),
        ({"session_timeout": "fast"}, ["session_timeout = 'fast'", "'250ms'"]),
        ({"session_timeout": True}, ["session_timeout = True", "boolean"]),
        ({"protocol": "eager"}, ["protocol = 'eager'", "cooperative, global_barrier"]),
        ({"protocol": "global barrier"}, ["did you mean 'global_barrier'"]),
        ({"protocol": 1}, ["protocol = 1", "resource_barrier"]),
        ({"assignor": "range"}, ["assignor = 'range'", "sticky, round_robin"]),
        ({"assignor": "stiky"}, ["did you mean 'sticky'"]),
        ({"assignor": None}, ["assignor = None"]),
        ({"group": "a/b"}, ["group name 'a/b'"]),
        ({"group": ""}, ["group name ''"]),
        ({"member_id": "bad id"}, ["member id 'bad id'"]),
        ({"backend": "zk://h"}, ["'zk'", "did you mean 'zookeeper'"]),
        ({"backend": 5}, ["backend must be a URL string, got int"]),
    ],
)
def test_invalid_settings_are_refused(changes: dict[str, object], fragments: list[str]) -> None:
    base = MemberConfig(group="g", backend=SQLITE)
    with pytest.raises(ConfigurationError) as caught:
        base.replace(**changes)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    if None in changes.values():
        return  # from_mapping reads None as "not given"
    with pytest.raises(ConfigurationError) as again:
        MemberConfig.from_mapping({"group": "g", **changes}, default_backend=SQLITE)
    assert str(again.value) == message


@pytest.mark.parametrize(
    "changes",
    [
        {"session_timeout": 0.5},
        {"session_timeout": 600},
        {"heartbeat_interval": 4.99},
        {"safety_margin": 4.99},
        {"stability_window": 0, "max_rebalance_delay": 0},
        {"stability_window": 300, "max_rebalance_delay": 300},
        {"rejoin_grace": 3600, "member_id": "static-1"},
        {"barrier_timeout": 3600},
        {"drain_timeout": 0},
        {"drain_timeout": 3600},
        {"member_id": "host:1@app"},
    ],
)
def test_boundaries_are_accepted(changes: dict[str, object]) -> None:
    MemberConfig(group="g", backend=SQLITE).replace(**changes)


def test_direct_construction_is_validated_and_normalised() -> None:
    with pytest.raises(ConfigurationError, match=r"session_timeout = 0.1 s"):
        MemberConfig(group="g", backend=SQLITE, session_timeout=0.1)
    config = MemberConfig(
        group="g",
        backend=SQLITE,
        session_timeout=20,
        protocol="resource-barrier",  # type: ignore[arg-type]
    )
    assert type(config.session_timeout) is float
    assert config.protocol is ProtocolName.RESOURCE_BARRIER


def test_replace_returns_a_checked_copy() -> None:
    base = MemberConfig(group="g", backend=SQLITE)
    changed = base.replace(session_timeout="30s", **{"stability-window": "1s"})
    assert (changed.session_timeout, changed.stability_window) == (30.0, 1.0)
    assert base.session_timeout == 10.0
    assert base.replace() == base
    assert (
        base.replace(member_id="m", rejoin_grace=1).replace(member_id=None, rejoin_grace=0) == base
    )
    with pytest.raises(ConfigurationError, match=r"unknown option 'session'"):
        base.replace(session=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.group = "other"  # type: ignore[misc]


def test_repr_hides_the_backend_password() -> None:
    config = MemberConfig(group="g", backend="redis://user:hunter2@h/0?token=t0ken")
    assert "hunter2" not in repr(config)
    assert "t0ken" not in repr(config)
    assert "backend='redis://user:***@h:6379/0?token=***'" in repr(config)
    assert config.backend == "redis://user:hunter2@h/0?token=t0ken"


def test_protocol_names() -> None:
    assert [p.value for p in ProtocolName] == ["cooperative", "global_barrier", "resource_barrier"]
    assert ProtocolName("global_barrier") is ProtocolName.GLOBAL_BARRIER


def test_backend_url_property_parses_the_backend() -> None:
    config = MemberConfig(group="g", backend="zookeeper://zk1,zk2:2182/r")
    assert isinstance(config.backend_url, BackendUrl)
    assert config.backend_url.hosts == (("zk1", 2181), ("zk2", 2182))
