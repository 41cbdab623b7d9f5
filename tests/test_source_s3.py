"""The S3 source against moto's server: discovery (paginated), weights, files, errors, and a
live member that keeps its resources while S3 cannot be listed."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rebalancer_spark import Member, MemberConfig
from rebalancer_spark.core.errors import ConfigurationError, SourceError
from rebalancer_spark.sources import open_source
from rebalancer_spark.sources.s3 import S3Source
from tests.servers.cloud import S3Bucket
from tests.support.helpers import wait_for


def _url(bucket: S3Bucket, prefix: str = "root/", **options: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"endpoint_url": bucket.endpoint, **options}.items())
    return f"s3://{bucket.name}/{prefix}?{query}"


def test_sub_prefixes_are_resources_listed_over_several_pages(
    s3_bucket: S3Bucket, caplog: pytest.LogCaptureFixture
) -> None:
    names = [f"p{i:02d}" for i in range(23)]
    for name in names:
        s3_bucket.put(f"root/{name}/part-0.csv", "1\n")
    for hidden in ("_temporary/x", ".staging/x", "top-level-object.csv", "bad\tname/x"):
        s3_bucket.put(f"root/{hidden}", "x")
    s3_bucket.put("elsewhere/p99/x", "x")
    source = open_source(_url(s3_bucket, page_size="5"))
    assert isinstance(source, S3Source)
    with caplog.at_level(logging.WARNING, logger="rebalancer_spark.sources.s3"):
        found = source.discover()
    assert [r.id for r in found] == names
    assert all(r.weight == 1.0 for r in found)
    assert source.pages >= 5, "23 sub-prefixes at 5 per page take at least five pages"
    assert "bad\\tname" in caplog.text and "skipped" in caplog.text
    assert S3Source(_url(s3_bucket)).discover() == found, "one page gives the same listing"


def test_a_prefix_without_a_trailing_slash_and_the_bucket_root(s3_bucket: S3Bucket) -> None:
    s3_bucket.put("a/x", "1")
    s3_bucket.put("root/b/x", "1")
    assert [r.id for r in S3Source(_url(s3_bucket, "root")).discover()] == ["b"]
    assert [r.id for r in S3Source(_url(s3_bucket, "")).discover()] == ["a", "root"]


def test_weights_are_object_counts_or_bytes(s3_bucket: S3Bucket) -> None:
    for i in range(3):
        s3_bucket.put(f"root/many/f{i}", b"x" * 10)
    s3_bucket.put("root/big/f", b"x" * 1000)
    s3_bucket.put("root/big/_SUCCESS", b"")
    objects = S3Source(_url(s3_bucket, weight="objects", page_size="2")).discover()
    assert {r.id: r.weight for r in objects} == {"big": 1.0, "many": 3.0}
    by_bytes = S3Source(_url(s3_bucket, weight="bytes")).discover()
    assert {r.id: r.weight for r in by_bytes} == {"big": 1000.0, "many": 30.0}


def test_files_are_the_visible_keys_under_the_sub_prefix(s3_bucket: S3Bucket) -> None:
    before = time.time() - 5
    for key in ("b.csv", "a.csv", "deep/c.csv", "deep/_temporary/d", ".e.tmp", "folder/"):
        s3_bucket.put(f"root/r1/{key}", "12345")
    s3_bucket.put("root/r10/not-mine.csv", "x")
    source = S3Source(_url(s3_bucket, page_size="2"))
    files = source.files("r1")
    assert [f.name for f in files] == ["a.csv", "b.csv", "deep/c.csv"]
    assert all(f.size == 5 and f.modified >= before for f in files)
    assert source.files("empty") == []
    assert source.location("r1") == f"s3://{s3_bucket.name}/root/r1/"
    with pytest.raises(SourceError, match="single sub-prefix names"):
        source.files("r1/deep")


def test_a_listing_in_name_order_starts_after_a_key_and_stops_at_a_limit(
    s3_bucket: S3Bucket,
) -> None:
    for i in range(7):
        s3_bucket.put(f"root/r1/2026-11-25/{i:02d}.csv", "x")
    source = S3Source(_url(s3_bucket, page_size="2", order="name", lookback="10m"))
    assert (source.order, source.lookback) == ("name", 600.0)
    after = [f.name for f in source.files("r1", after="2026-11-25/03.csv")]
    assert after == ["2026-11-25/04.csv", "2026-11-25/05.csv", "2026-11-25/06.csv"]
    first = [f.name for f in source.files("r1", limit=3)]
    assert first == ["2026-11-25/00.csv", "2026-11-25/01.csv", "2026-11-25/02.csv"]
    with pytest.raises(ConfigurationError, match="order='random'"):
        S3Source(_url(s3_bucket, order="random"))


def test_nested_layouts_are_resources_at_a_depth(s3_bucket: S3Bucket) -> None:
    for key in ["date=1/hour=00/a.csv", "date=1/hour=01/b.csv", "date=2/hour=00/c.csv"]:
        s3_bucket.put(f"root/{key}", "x\n")
    s3_bucket.put("root/date=2/_tmp/x", "x")
    s3_bucket.put("root/date=3/loose.csv", "x")  # no sub-prefix at the second level
    source = S3Source(_url(s3_bucket, depth="2", page_size="1"))
    assert [r.id for r in source.discover()] == [
        "date=1/hour=00",
        "date=1/hour=01",
        "date=2/hour=00",
    ]
    assert source.pages >= 6, "one listing per level and parent, a key per page"
    assert [f.name for f in source.files("date=1/hour=01")] == ["b.csv"]
    assert source.location("date=1/hour=01") == f"s3://{s3_bucket.name}/root/date=1/hour=01/"
    for bad in ("date=1", "date=1/hour=00/x", "date=1/..", "date=1/"):
        with pytest.raises(SourceError, match="paths of 2 sub-prefix names"):
            source.files(bad)
    assert [r.id for r in S3Source(_url(s3_bucket)).discover()] == ["date=1", "date=2", "date=3"]
    with pytest.raises(ConfigurationError, match="depth='9'"):
        S3Source(_url(s3_bucket, depth="9"))


def test_an_error_without_a_response_is_explained(s3_bucket: S3Bucket) -> None:
    """A connection cut in the middle of an answer raises errors whose ``response`` is None:
    the explanation must not break on it (it once raised AttributeError instead)."""

    class Cut(Exception):
        response = None

    source = S3Source(_url(s3_bucket))
    text = source._explain("list the sub-prefixes", Cut("connection reset"))
    assert text.startswith("cannot list the sub-prefixes of source") and "Cut" in text


def test_a_missing_bucket_is_a_source_error(s3_bucket: S3Bucket) -> None:
    source = S3Source(_url(s3_bucket).replace(s3_bucket.name, s3_bucket.name + "-missing"))
    with pytest.raises(SourceError, match=r"NoSuchBucket.*does not exist"):
        source.discover()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens on it once the socket is closed


@pytest.fixture
def no_aws_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No credentials anywhere in the boto3 chain (and no instance metadata lookup)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.usefixtures("no_aws_config")
def test_missing_credentials_are_a_source_error(s3_bucket: S3Bucket) -> None:
    with pytest.raises(SourceError, match=r"no credentials were found"):
        S3Source(_url(s3_bucket)).discover()


@pytest.mark.usefixtures("no_aws_config")
def test_an_unreachable_endpoint_is_a_source_error_soon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    source = S3Source(f"s3://bucket/p/?endpoint_url={endpoint}&retries=1&connect_timeout=1")
    started = time.monotonic()
    with pytest.raises(SourceError, match=r"cannot be reached"):
        source.discover()
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("s3:///prefix/", "not an S3 URL"),
        ("s3://bucket/p/?weight=rows", "weight='rows' .* none, objects, bytes"),
        ("s3://bucket/p/?page_size=5000", "page_size='5000' .* from 1 to 1000"),
        ("s3://bucket/p/?regoin=eu-west-1", "did you mean region"),
        ("s3://bucket/p/?region=a&region=b", "twice"),
        ("s3://bucket/p/?endpoint_url=127.0.0.1:9000", "not an http:// or https:// URL"),
        ("s3://bucket/p/?reader=hadoop", "reader='hadoop'"),
    ],
)
def test_bad_urls_are_refused_with_the_fix(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        S3Source(url)


@pytest.mark.parametrize(
    "url",
    [
        "s3://AKIAEXAMPLE:hunter2secret@bucket/p/",
        "s3://bucket/p/?aws_secret_access_key=hunter2secret",
        "s3://bucket/p/?session_token=hunter2secret",
    ],
)
def test_credentials_in_the_url_are_refused_without_showing_them(url: str) -> None:
    with pytest.raises(ConfigurationError, match="boto3 chain") as caught:
        S3Source(url)
    assert "hunter2secret" not in str(caught.value)


# -- a live member whose source fails ----------------------------------------------------------


class Cuttable:
    """A TCP relay on a fixed local port to the S3 server: ``cut()`` closes the port and every
    connection through it (the endpoint becomes unreachable), ``restore()`` reopens it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = _closed_port()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            assert self._listener is not None
            self._listener.close()
            self._listener = None
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            server = socket.create_connection(self.upstream)
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    server.close()
                    return
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        src.close()


@pytest.fixture
def member_on() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        m.stop(drain=False)


def test_an_unreachable_s3_revokes_nothing(
    s3_bucket: S3Bucket, member_on: list[Member], tmp_path: Path, group: str
) -> None:
    for name in ("a", "b"):
        s3_bucket.put(f"root/{name}/f.csv", "1\n")
    relay = Cuttable(("127.0.0.1", s3_bucket.server.port))
    url = f"s3://{s3_bucket.name}/root/?endpoint_url=http://127.0.0.1:{relay.port}"
    source = S3Source(url + "&retries=1&connect_timeout=1")
    config = MemberConfig(
        group=group,
        backend=f"sqlite://{tmp_path}/groups.db?poll=0.005",
        member_id="m1",
        session_timeout=2.0,
        stability_window=0.02,
    )
    member = Member(config, discover=source.discover, discovery_interval=0.1).start()
    member_on.append(member)
    wait_for(lambda: len(member.assigned()) == 2, timeout=10, what="a and b owned")
    before = {o.resource: o.epoch for o in member.assigned()}
    relay.cut()

    # The first failure may be a connection cut in the middle of an answer; the next ones
    # find nothing listening.
    def unreachable() -> str | None:
        error = member.discovery_error
        return error if error is not None and "cannot be reached" in error else None

    error = wait_for(unreachable, timeout=10, what="a listing that failed for want of the endpoint")
    assert error is not None and "SourceError: cannot list the sub-prefixes of source" in error
    failed_at = time.monotonic()
    wait_for(
        lambda: time.monotonic() - failed_at > 1.0 and member.discovery_error is not None,
        timeout=10,
        what="a second of failed listings",
    )
    assert {o.resource: o.epoch for o in member.assigned()} == before, "a failed listing revoked"
    # S3 answers again, with a new sub-prefix: discovery resumes and picks it up
    s3_bucket.put("root/c/f.csv", "1\n")
    relay.restore()
    wait_for(
        lambda: {o.resource for o in member.assigned()} == {"a", "b", "c"},
        timeout=10,
        what="c discovered once S3 answers again",
    )
    assert member.discovery_error is None
    assert {o.resource: o.epoch for o in member.assigned() if o.resource != "c"} == before
    relay.cut()
