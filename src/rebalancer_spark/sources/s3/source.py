"""``s3://bucket/prefix/``: each sub-prefix of a prefix is a resource (boto3, paginated).

Use it for a landing zone in S3 (or MinIO, Ceph, moto: any S3 endpoint) where each producer,
tenant or day writes under its own sub-prefix, ``s3://lake/raw/orders/<name>/…`` (or several
levels down, ``depth=N``). Discovery is one ``ListObjectsV2`` with ``Delimiter='/'`` per level
and parent, paginated, run by the coordinator only.

URL options (query string), each at most once; anything else is refused:

==================  ======================================================================
``endpoint_url``    another S3 endpoint, e.g. ``http://127.0.0.1:9000`` (path-style access)
``region``          the bucket's region (default: the boto3 chain's, else ``us-east-1``)
``profile``         a named profile of ``~/.aws/config`` (default: the boto3 chain)
``weight``          ``none`` (default: every resource weighs 1, one cheap listing),
                    ``objects`` or ``bytes`` (lists every object on each discovery)
``page_size``       keys per listing request, 1 to 1000 (default 1000)
``reader``          how Spark reads: ``auto`` (default), ``s3a`` or ``arrow``
                    (see :mod:`.spark_read`)
``connect_timeout`` seconds per connection attempt (default 5)
``retries``         attempts per request, standard boto3 retry mode (default 3)
``on_change``       ``ignore`` (default) or ``reread``: what to do with an object processed
                    already and then rewritten under the same key (another size or ETag);
                    either way a warning is logged and the object counted
``order``           ``none`` (default: each listing lists every key of the resource) or
                    ``name``: keys sort by arrival (dates, hours, timestamps), so a listing
                    starts after the last key processed (``StartAfter``)
``lookback``        with ``order=name``: how late (a duration, default 0) an object may
                    arrive under a key below the last one processed and still be picked up
``depth``           1 to 8 (default 1): the resources are the sub-prefixes that many levels
                    below the prefix, named by their path (``depth=2`` over
                    ``date=*/hour=*``: ``date=2026-11-25/hour=10``); one ``Delimiter``
                    listing per level and parent
==================  ======================================================================

Credentials come from the standard boto3 chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
/ ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, ``~/.aws/credentials``, an instance or pod role) or the
``profile`` option. Keys are never taken from the URL: a URL with a user part or an option that
looks secret is refused, so that no secret can reach a log, the audit table or a repr.

Names, chosen to match the file-share source so that a half-written object is never read:

* sub-prefixes and key segments starting with ``.`` or ``_`` are ignored (``_temporary``,
  ``_SUCCESS``); keys ending with ``/`` (folder markers) are ignored;
* a sub-prefix whose name cannot be a resource id (a control character, over the id size
  limit) is **skipped with a warning** naming it, so that one bad producer does not stop the
  discovery of every other resource; rename it to have it picked up;
* a resource's files are the keys under ``prefix/<resource>/``, named relative to it.

An unreachable endpoint, a missing bucket, refused access or missing credentials raise
:class:`SourceError`; the coordinator then keeps the group's resource set as it was.
"""

from __future__ import annotations

import difflib
import logging
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from rebalancer_spark.core.errors import ConfigurationError, SourceError
from rebalancer_spark.core.model import Resource, validate_resource_id
from rebalancer_spark.core.urls import redact_url
from rebalancer_spark.sources.base import (
    FileEntry,
    FileSource,
    check_depth,
    check_listing,
    check_on_change,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from pyspark.sql import DataFrame, SparkSession

__all__ = ["S3Source"]

log = logging.getLogger("rebalancer_spark.sources.s3")

OPTIONS = (
    "connect_timeout",
    "depth",
    "endpoint_url",
    "lookback",
    "on_change",
    "order",
    "page_size",
    "profile",
    "reader",
    "region",
    "retries",
    "weight",
)
WEIGHTS = ("none", "objects", "bytes")
READERS = ("auto", "s3a", "arrow")
_SECRET_WORDS = ("secret", "password", "token", "credential", "key")


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def _number(url: str, name: str, raw: str, low: float, high: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        raise ConfigurationError(
            f"option {name}={raw!r} of source {url!r} is not a number from {low:g} to {high:g}: "
            f"correct it or remove it to use the default"
        )
    return value


class S3Source(FileSource):
    """Sub-prefixes of ``s3://bucket/prefix/`` as resources; see the module docstring."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        shown = redact_url(url)
        if parts.scheme.lower() != "s3" or not parts.netloc:
            raise ConfigurationError(
                f"source {shown!r} is not an S3 URL: write s3://bucket/prefix/"
            )
        if "@" in parts.netloc or parts.fragment:
            raise ConfigurationError(
                f"source {shown!r} holds a user part or a '#': credentials never go in a source "
                "URL; use the boto3 chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE) "
                "or ?profile=NAME"
            )
        options: dict[str, str] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if any(word in name.lower() for word in _SECRET_WORDS):
                raise ConfigurationError(
                    f"source {shown!r} carries the option {name!r}, which looks like a "
                    "credential: keys never go in a source URL; use the boto3 chain "
                    "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE) or ?profile=NAME"
                )
            if name not in OPTIONS:
                close = difflib.get_close_matches(name, OPTIONS, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigurationError(
                    f"source {shown!r} has the unknown option {name!r}{hint}: the options "
                    f"are {', '.join(OPTIONS)}"
                )
            if name in options:
                raise ConfigurationError(f"source {shown!r} gives the option {name!r} twice")
            options[name] = value
        prefix = unquote(parts.path).lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.url = url
        self.bucket = parts.netloc
        self.prefix = prefix
        self.endpoint_url = options.get("endpoint_url") or None
        self.region = options.get("region") or None
        self.profile = options.get("profile") or None
        self.weight = options.get("weight", "none")
        self.reader = options.get("reader", "auto")
        self.on_change = check_on_change(options.get("on_change", "ignore"), shown)
        self.order, self.lookback = check_listing(options, shown)
        self.depth = check_depth(options, shown)
        for name, value, allowed in (
            ("weight", self.weight, WEIGHTS),
            ("reader", self.reader, READERS),
        ):
            if value not in allowed:
                raise ConfigurationError(
                    f"option {name}={value!r} of source {shown!r} is unknown: use one of "
                    f"{', '.join(allowed)}"
                )
        if self.endpoint_url is not None and urlsplit(self.endpoint_url).scheme not in (
            "http",
            "https",
        ):
            raise ConfigurationError(
                f"option endpoint_url={self.endpoint_url!r} of source {shown!r} is not an "
                "http:// or https:// URL: write e.g. endpoint_url=http://127.0.0.1:9000"
            )
        self.page_size = int(_number(shown, "page_size", options.get("page_size", "1000"), 1, 1000))
        self.connect_timeout = _number(
            shown, "connect_timeout", options.get("connect_timeout", "5"), 0.1, 600
        )
        self.retries = int(_number(shown, "retries", options.get("retries", "3"), 1, 20))
        self.pages = 0
        """How many listing pages the last :meth:`discover` read."""
        self._client: Any = None
        self._session: Any = None
        self._lock = threading.RLock()  # boto3 sessions are not thread-safe

    def __repr__(self) -> str:
        return f"S3Source({redact_url(self.url)!r})"

    # -- boto3 -------------------------------------------------------------------------------

    def session(self) -> Any:
        """The boto3 session (credentials chain, region) of this source."""
        with self._lock:
            return self._make_session()

    def _make_session(self) -> Any:
        if self._session is None:
            try:
                import boto3
            except ModuleNotFoundError:
                raise ConfigurationError(
                    f"source {self!r} needs boto3: pip install 'rebalancer-spark[s3]'"
                ) from None
            try:
                self._session = boto3.session.Session(
                    profile_name=self.profile, region_name=self.region
                )
            except Exception as exc:  # ProfileNotFound and friends
                raise SourceError(f"cannot set up S3 access for {self!r}: {exc}") from None
        return self._session

    def client(self) -> Any:
        """The boto3 S3 client (thread-safe once made)."""
        with self._lock:
            return self._make_client()

    def _make_client(self) -> Any:
        if self._client is None:
            from botocore.config import Config

            config = Config(
                connect_timeout=self.connect_timeout,
                read_timeout=max(self.connect_timeout, 30.0),
                retries={"max_attempts": self.retries, "mode": "standard"},
                s3={"addressing_style": "path" if self.endpoint_url else "auto"},
            )
            self._client = self.session().client(
                "s3",
                endpoint_url=self.endpoint_url,
                region_name=self.region_name(),
                config=config,
            )
        return self._client

    def region_name(self) -> str:
        """The region in use: the URL's, else the boto3 chain's, else us-east-1."""
        return self.region or self.session().region_name or "us-east-1"

    def credentials(self) -> tuple[str, str, str | None] | None:
        """(access key, secret key, session token) resolved by boto3, or None (anonymous).
        For readers that cannot use boto3 (pyarrow); never log the result."""
        with self._lock:
            creds = self.session().get_credentials()
        if creds is None:
            return None
        frozen = creds.get_frozen_credentials()
        return frozen.access_key, frozen.secret_key, frozen.token

    def credential_method(self) -> str | None:
        """How boto3 found this source's credentials (``env``, ``shared-credentials-file``,
        ``iam-role``, ``container-role`` …), or None when it found none (anonymous)."""
        with self._lock:
            creds = self.session().get_credentials()
        return None if creds is None else str(creds.method)

    def _pages(self, what: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        try:
            paginator = self.client().get_paginator("list_objects_v2")
            yield from paginator.paginate(
                Bucket=self.bucket, PaginationConfig={"PageSize": self.page_size}, **kwargs
            )
        except (ConfigurationError, SourceError):
            raise
        except Exception as exc:
            raise SourceError(self._explain(what, exc)) from None

    def _explain(self, what: str, exc: Exception) -> str:
        # botocore's client errors carry the response as a dict; others carry None there (a
        # connection cut in the middle of an answer), which must not break the explanation
        response = getattr(exc, "response", None)
        error = response.get("Error") if isinstance(response, dict) else None
        code = str(error.get("Code", "")) if isinstance(error, dict) else ""
        hint = {
            "NoSuchBucket": f"the bucket {self.bucket!r} does not exist: check the URL",
            "AccessDenied": "access is refused: check the credentials' permissions",
            "InvalidAccessKeyId": "the access key is unknown: check the credentials",
            "SignatureDoesNotMatch": "the secret key is wrong: check the credentials",
        }.get(code)
        if hint is None:
            name = type(exc).__name__
            if "Credentials" in name:
                hint = "no credentials were found: set AWS_ACCESS_KEY_ID or ?profile=NAME"
            elif "Connect" in name or "Endpoint" in name:
                hint = (
                    f"the endpoint {self.endpoint_url or 'of AWS'} cannot be reached: check "
                    "endpoint_url, the network and that the service runs"
                )
            else:
                hint = "check the endpoint, bucket and credentials"
        return f"cannot {what} of source {self!r} ({type(exc).__name__}: {exc}): {hint}"

    # -- the contract ------------------------------------------------------------------------

    def discover(self) -> list[Resource]:
        prefixes = [self.prefix]
        pages = 0
        for _ in range(self.depth):  # the sub-prefixes `depth` levels down, by path
            below: list[str] = []
            for parent in prefixes:
                for page in self._pages("list the sub-prefixes", Prefix=parent, Delimiter="/"):
                    pages += 1
                    for entry in page.get("CommonPrefixes", []):
                        found = str(entry["Prefix"])
                        name = found[len(parent) : -1]
                        if name and not _hidden(name):
                            below.append(found)
            prefixes = below
        names: list[str] = []
        for found in prefixes:
            try:
                names.append(validate_resource_id(found[len(self.prefix) : -1]))
            except ConfigurationError as exc:
                log.warning("source %r: sub-prefix skipped, it cannot be a resource: %s", self, exc)
        self.pages = pages
        names.sort()
        if self.weight == "none":
            return [Resource(name) for name in names]
        resources = []
        for name in names:
            entries = self.files(name)
            load = len(entries) if self.weight == "objects" else sum(e.size for e in entries)
            resources.append(Resource(name, float(max(load, 1))))
        return resources

    def key_prefix(self, resource: str) -> str:
        """The key prefix of ``resource``'s objects (ends with '/')."""
        parts = resource.split("/")
        if len(parts) != self.depth or any(p in ("", ".", "..") for p in parts):
            shape = (
                "single sub-prefix names"
                if self.depth == 1
                else f"paths of {self.depth} sub-prefix names (depth={self.depth})"
            )
            raise SourceError(
                f"resource {resource!r} of source {self!r} is not one of its sub-prefixes: the "
                f"resource ids of this S3 source are {shape}, none of them '.' or '..'"
            )
        return f"{self.prefix}{resource}/"

    def files(
        self, resource: str, after: str | None = None, limit: int | None = None
    ) -> list[FileEntry]:
        base = self.key_prefix(resource)
        found: list[FileEntry] = []
        start = {} if after is None else {"StartAfter": base + after}
        what = f"list the objects of resource {resource!r}"
        for page in self._pages(what, Prefix=base, **start):
            for obj in page.get("Contents", []):
                name = str(obj["Key"])[len(base) :]
                if not name or name.endswith("/") or any(_hidden(s) for s in name.split("/")):
                    continue
                found.append(
                    FileEntry(
                        name,
                        int(obj["Size"]),
                        obj["LastModified"].timestamp(),
                        str(obj.get("ETag", "")).strip('"'),
                    )
                )
            if limit is not None and len(found) >= limit:
                break  # keys come in order: the next pages hold only later keys
        found.sort()
        return found if limit is None else found[:limit]

    def location(self, resource: str) -> str:
        return f"s3://{self.bucket}/{self.key_prefix(resource)}"

    def load(
        self,
        spark: SparkSession,
        resource: str,
        names: Sequence[str],
        *,
        format: str,
        schema: str | None,
        options: Mapping[str, str],
    ) -> DataFrame:
        """The objects ``names`` of ``resource``, read by Spark's ``s3a://`` reader or the
        Arrow fallback (the ``reader`` option; :mod:`.spark_read`)."""
        from rebalancer_spark.sources.s3.spark_read import load_s3

        return load_s3(spark, self, resource, names, format=format, schema=schema, options=options)

    def prepare_spark(self, spark: SparkSession) -> None:
        """An output in this source's bucket is written with its endpoint and credentials:
        set them as per-bucket S3A keys where Spark has hadoop-aws."""
        from rebalancer_spark.sources.s3.spark_read import configure_s3a, s3a_available

        if s3a_available(spark):
            configure_s3a(spark, self)
