"""The plug-in registries: one descriptor per backend or source, lazy, and consistent with the
plug-ins they name."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rebalancer_spark.backends import PLUGINS as BACKEND_PLUGINS
from rebalancer_spark.backends import (
    SCHEMES,
    Backend,
    check_backend_url,
    open_backend,
    parse_backend_url,
    store_missing,
)
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.plugins import Plugin
from rebalancer_spark.sources import PLUGINS as SOURCE_PLUGINS
from rebalancer_spark.sources import SOURCES, open_source
from rebalancer_spark.sources.registry import plugin_named

CLIENT_LIBRARIES = ["boto3", "botocore", "kazoo", "pika", "pyarrow", "pyspark", "redis"]


def test_every_scheme_belongs_to_exactly_one_plugin() -> None:
    for plugins in (BACKEND_PLUGINS, SOURCE_PLUGINS):
        schemes = [s for p in plugins for s in p.schemes]
        assert len(schemes) == len(set(schemes)), schemes
    assert SCHEMES == ("sqlite", "zookeeper", "redis", "rediss")
    assert sorted(SOURCES) == sorted(s for p in SOURCE_PLUGINS for s in p.schemes)


@pytest.mark.parametrize("plugin", [*BACKEND_PLUGINS, *SOURCE_PLUGINS], ids=lambda p: p.name)
def test_every_descriptor_names_code_that_exists(plugin: Plugin) -> None:
    cls = getattr(importlib.import_module(plugin.module), plugin.class_name)
    assert isinstance(cls, type)
    if plugin.grammar:
        assert issubclass(cls, Backend)
        grammar = importlib.import_module(plugin.grammar).GRAMMAR
        # the backend class declares exactly the options its grammar accepts
        assert dict(cls.options) == dict(grammar.options), plugin.name


def test_a_descriptor_refuses_a_malformed_line() -> None:
    with pytest.raises(ValueError, match="module:Class"):
        Plugin("x", ("x",), "no_class_here", {"x": "x://"})
    with pytest.raises(ValueError, match="tls_schemes"):
        Plugin("x", ("x",), "m:C", {"x": "x://"}, tls_schemes=("xs",))


def test_rabbitmq_schemes_and_tls_come_from_its_registry_line() -> None:
    rabbitmq = plugin_named("rabbitmq")
    for scheme in rabbitmq.schemes:
        source = open_source(f"{scheme}://u:p@127.0.0.1/%2F?queues=a")
        assert source.tls == (scheme in rabbitmq.tls_schemes)  # type: ignore[attr-defined]


def test_parsing_urls_and_opening_sources_imports_no_client_library() -> None:
    script = (
        "import json, sys\n"
        "from rebalancer_spark.backends import check_backend_url\n"
        "from rebalancer_spark.sources import open_source\n"
        "check_backend_url('zookeeper://zk1,zk2/r?connect_timeout=3')\n"
        "check_backend_url('rediss://:pw@h/1?ca_file=/x.pem')\n"
        "check_backend_url('sqlite:///tmp/x.db?poll=0.1')\n"
        "for url in ('s3://b/p/', 'sqs://us-east-1/q', 'amqp://u:p@h/%2F?queues=a',\n"
        "            'file:///tmp/', 'static://a,b'):\n"
        "    open_source(url)\n"
        f"heavy = {CLIENT_LIBRARIES!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_check_backend_url_applies_the_backend_options_without_connecting() -> None:
    assert check_backend_url("zookeeper://h/r?use_ssl=true").options == {"use_ssl": "true"}
    with pytest.raises(ConfigurationError) as caught:
        check_backend_url("zookeeper://h/r?use_tls=true")
    message = str(caught.value)
    assert "'use_tls'" in message
    assert "did you mean 'use_ssl'?" in message
    assert "zookeeper URLs accept these options: ca, certfile" in message


def test_store_missing_is_true_only_for_an_absent_local_file(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/groups.db"
    assert store_missing(parse_backend_url(url))
    assert not (tmp_path / "groups.db").exists()
    with open_backend(url):
        pass
    assert not store_missing(parse_backend_url(url))
    assert not store_missing(parse_backend_url("zookeeper://h/r"))
    assert not store_missing(parse_backend_url("redis://h/0"))
