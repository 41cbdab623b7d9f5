"""Sources chosen by URL scheme, each plug-in imported only when a URL names it.

=================================  ===========================================================
``file:///mount/dir/``             each sub-directory of a share is a resource (files.py)
``s3://bucket/prefix/``            each sub-prefix of a prefix is a resource (s3/; boto3)
``static://a,b,c``                 a fixed list, the same as ``--resources a,b,c`` (static.py)
``rabbitmq://…``, ``amqp://…``     each queue is a resource (rabbitmq.py; pika)
``sqs://…``                        each queue is a resource (sqs.py; boto3)
=================================  ===========================================================

The schemes and where each plug-in lives are one line each in :mod:`.registry`. Every
plug-in class takes the URL as its one argument, parses it itself and implements
:class:`~rebalancer_spark.sources.base.ResourceSource`.
"""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.urls import redact_url
from rebalancer_spark.sources.base import FileEntry, FileSource, ResourceSource
from rebalancer_spark.sources.registry import PLUGINS, plugin

__all__ = ["PLUGINS", "SOURCES", "FileEntry", "FileSource", "ResourceSource", "open_source"]

SOURCES: dict[str, str] = {s: p.implementation for p in PLUGINS for s in sorted(p.schemes)}
"""Scheme → ``module:Class`` of the plug-in that reads it (derived from :data:`PLUGINS`)."""


def open_source(url: str) -> ResourceSource:
    """The source named by ``url``; a :class:`ConfigurationError` for an unknown scheme or a
    plug-in whose library is not installed."""
    scheme = urlsplit(url).scheme.lower()
    target = SOURCES.get(scheme)
    if target is None:
        raise ConfigurationError(
            f"source {redact_url(url)!r} has the unknown scheme {scheme!r}: the known schemes "
            f"are {', '.join(sorted(SOURCES))} (e.g. "
            f"{', '.join(p.example() for p in PLUGINS if p.name in ('s3', 'files', 'static'))})"
        )
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise ConfigurationError(
                f"source scheme {scheme!r} is not available in this installation (module "
                f"{module_name} is missing): upgrade rebalancer-spark or use another source"
            ) from None
        found = plugin(scheme)
        hint = found.install_hint() if found else "pip install 'rebalancer-spark[all]'"
        raise ConfigurationError(
            f"source {redact_url(url)!r} needs the Python package {exc.name!r}, which is not "
            f"installed: {hint}"
        ) from None
    cls = getattr(module, class_name)
    source = cls(url)
    if not isinstance(source, ResourceSource):
        raise ConfigurationError(
            f"{target} built {type(source).__name__}, not a ResourceSource: fix the registry"
        )
    return source
