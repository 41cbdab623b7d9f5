"""Sources chosen by URL scheme: ``file:///dir/`` (each sub-directory is a resource)."""

from __future__ import annotations

from urllib.parse import urlsplit

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.sources.base import FileEntry, FileSource, ResourceSource

__all__ = ["FileEntry", "FileSource", "ResourceSource", "open_source"]


def open_source(url: str) -> ResourceSource:
    """The source named by ``url``."""
    scheme = urlsplit(url).scheme
    if scheme == "file":
        from rebalancer_spark.sources.files import FileShareSource

        return FileShareSource(url)
    raise ConfigurationError(
        f"source {url!r} has the unknown scheme {scheme!r}: use file:///absolute/dir/ (each "
        "sub-directory is a resource), or give a static list with --resources a,b,c"
    )
