"""The source registry: one :class:`~rebalancer_spark.core.plugins.Plugin` line per source.

A new source is a module (or folder) under ``sources/`` whose class takes the URL as its one
argument and implements :class:`~rebalancer_spark.sources.base.ResourceSource`, plus one line
in :data:`PLUGINS`. Nothing here imports a plug-in: its module is imported when a URL of one
of its schemes is opened, and its client library (boto3, pika) only when it lists or reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from rebalancer_spark.core.plugins import Plugin

__all__ = ["PLUGINS", "plugin", "plugin_named"]

_HERE = "rebalancer_spark.sources"

PLUGINS: tuple[Plugin, ...] = (
    Plugin("files", ("file",), f"{_HERE}.files:FileShareSource", {"file": "file:///abs/dir/"}),
    Plugin("s3", ("s3",), f"{_HERE}.s3:S3Source", {"s3": "s3://bucket/prefix/"}, extra="s3"),
    Plugin("static", ("static",), f"{_HERE}.static:StaticSource", {"static": "static://a,b,c"}),
    Plugin(
        "rabbitmq",
        ("rabbitmq", "rabbitmqs", "amqp", "amqps"),
        f"{_HERE}.rabbitmq:RabbitMqSource",
        {"rabbitmq": "rabbitmq://USER:PASSWORD@HOST:5672/VHOST?queues=a,b"},
        extra="rabbitmq",
        tls_schemes=("rabbitmqs", "amqps"),
    ),
    Plugin(
        "sqs",
        ("sqs",),
        f"{_HERE}.sqs:SqsSource",
        {"sqs": "sqs://us-east-1/orders-"},
        extra="sqs",
    ),
)
"""Every source plug-in, one line each."""

_BY_SCHEME: Mapping[str, Plugin] = MappingProxyType(
    {scheme: p for p in PLUGINS for scheme in p.schemes}
)
_BY_NAME: Mapping[str, Plugin] = MappingProxyType({p.name: p for p in PLUGINS})


def plugin(scheme: str) -> Plugin | None:
    """The plug-in of ``scheme`` (lower case), or None."""
    return _BY_SCHEME.get(scheme)


def plugin_named(name: str) -> Plugin:
    """The plug-in called ``name`` (``"rabbitmq"``, ``"s3"`` ...): how a plug-in module finds
    its own schemes without writing them a second time."""
    return _BY_NAME[name]
