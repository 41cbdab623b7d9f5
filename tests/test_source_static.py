"""The static list source, the same list as ``--resources``, and the registry of sources."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rebalancer_spark import Member, MemberConfig
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.sources import SOURCES, ResourceSource, open_source
from rebalancer_spark.sources.static import StaticSource
from rebalancer_spark.spark.options import JobConfig, parse_command_line, resolve
from tests.support.helpers import wait_for

MEMBER = MemberConfig(group="g", backend="sqlite:///tmp/unused.db")


def _resources_option(text: str) -> tuple[str, ...] | None:
    """What ``--resources TEXT`` on a job's command line gives."""
    argv = ["--group", "g", "--resources", text]
    return resolve(parse_command_line(argv), {}, default_backend=MEMBER.backend).resources


def test_a_static_url_lists_its_resources_sorted() -> None:
    source = open_source("static://b, a ,c")
    assert isinstance(source, StaticSource)
    assert [r.id for r in source.discover()] == ["a", "b", "c"]
    assert [r.id for r in open_source("static:x/y,z").discover()] == ["x/y", "z"]
    assert JobConfig(member=MEMBER, source="static://a,b").source == "static://a,b"


@pytest.mark.parametrize("text", ["a,b", " a , b/c ", "s3-prefix/2024-01-01,tenant:7"])
def test_static_and_resources_accept_the_same_lists(text: str) -> None:
    from_option = _resources_option(text)
    assert from_option is not None
    assert sorted(from_option) == [r.id for r in StaticSource(f"static://{text}").discover()]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty entry"),
        ("a,,b", "empty entry"),
        ("a,b,a", "more than once"),
        ("a\tb", "control"),
    ],
)
def test_static_and_resources_refuse_the_same_lists(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        _resources_option(text)
    with pytest.raises(ConfigurationError, match=message):
        StaticSource(f"static://{text}")


def test_a_member_discovers_a_static_list(tmp_path: Path, group: str) -> None:
    config = MemberConfig(
        group=group,
        backend=f"sqlite://{tmp_path}/groups.db?poll=0.005",
        member_id="m1",
        session_timeout=2.0,
        stability_window=0.02,
    )
    member = Member(config, discover=open_source("static://q1,q2").discover).start()
    try:
        wait_for(
            lambda: sorted(o.resource for o in member.assigned()) == ["q1", "q2"],
            timeout=10,
            what="q1 and q2 owned",
        )
    finally:
        member.stop(drain=False)


# -- the registry -----------------------------------------------------------------------------


def test_the_registry_names_every_source_kind() -> None:
    assert SOURCES == {
        "amqp": "rebalancer_spark.sources.rabbitmq:RabbitMqSource",
        "amqps": "rebalancer_spark.sources.rabbitmq:RabbitMqSource",
        "file": "rebalancer_spark.sources.files:FileShareSource",
        "rabbitmq": "rebalancer_spark.sources.rabbitmq:RabbitMqSource",
        "rabbitmqs": "rebalancer_spark.sources.rabbitmq:RabbitMqSource",
        "s3": "rebalancer_spark.sources.s3:S3Source",
        "sqs": "rebalancer_spark.sources.sqs:SqsSource",
        "static": "rebalancer_spark.sources.static:StaticSource",
    }
    cases = [
        ("s3", "s3://b/p/"),
        ("file", "file:///tmp/"),
        ("static", "static:a"),
        ("amqps", "amqps://u:p@127.0.0.1:5671/%2F?queues=a"),
    ]
    for scheme, url in cases:
        source = open_source(url)
        assert isinstance(source, ResourceSource)
        assert type(source).__name__ == SOURCES[scheme].split(":")[1]


def test_an_unknown_scheme_lists_the_known_ones_without_secrets() -> None:
    with pytest.raises(ConfigurationError) as caught:
        open_source("ftp://user:hunter2@host/dir/")
    message = str(caught.value)
    assert "'ftp'" in message
    assert "amqp, amqps, file, rabbitmq, rabbitmqs, s3, sqs, static" in message
    assert "hunter2" not in message


@pytest.fixture
def fake_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    (tmp_path / "needs_a_library.py").write_text("import not_installed_library_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(SOURCES, "lib", "needs_a_library:Source")
    monkeypatch.setitem(SOURCES, "gone", "rebalancer_spark.sources.not_written_yet:Source")
    yield
    sys.modules.pop("needs_a_library", None)


@pytest.mark.usefixtures("fake_plugins")
def test_a_missing_plugin_or_library_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match=r"not_installed_library_xyz.*pip install"):
        open_source("lib://x")
    with pytest.raises(ConfigurationError, match=r"'gone' is not available.*not_written_yet"):
        open_source("gone://x")
