"""Fixtures that start real ``redis-server`` processes on free ports for the tests.

* ``redis_session_server`` (session scope): one plain server shared by every test; group names
  are unique per test, so tests never see each other's keys. ``redis_backend_url`` is
  ``redis://127.0.0.1:PORT/0`` on it (what the contract suite and the shared tests use).
* ``redis_server``: a server of the test's own, to kill -9, restart without persistence or
  pause with SIGSTOP (:class:`RedisServer`).
* ``redis_acl_server``: default user disabled; ACL users ``rebalancer`` (just the rights the
  backend needs, on ``rb:*``) and ``intruder`` (same commands, other keys).
* ``redis_tls``: a TLS-only server with certificates from a throw-away CA made with the
  ``openssl`` command (skipped, with the reason, where it is missing).

Every server is started with ``--save '' --appendonly no`` (nothing survives a restart unless
a test writes a snapshot with ``SAVE``: the restarted server then loads that older
``dump.rdb`` from its directory) and ended by its PID. Its log is attached to the report of a
failed test that used it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.clockshift import ClockShift

READY_TIMEOUT = 20.0
_USED = pytest.StashKey[list["RedisServer"]]()

# What the backend needs, and nothing more (docs/backends/redis.md, section Security).
BACKEND_ACL = (
    "~rb:* &rb:* -@all +ping +hello +auth +select +info "
    "+evalsha +eval +script|load +script|exists +multi +exec +discard +subscribe "
    "+unsubscribe +publish +time +exists +del +get +set +pexpire +pexpireat +pttl +rename "
    "+hset +hget +hmget +hgetall +hdel +hlen +hincrby +sadd +srem +smembers +sismember"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One ``redis-server`` process on a fixed port, restartable on that port."""

    def __init__(
        self,
        workdir: Path,
        extra: Sequence[str] = (),
        *,
        tls: bool = False,
        clock: ClockShift | None = None,
    ) -> None:
        self.workdir = workdir
        self.clock = clock
        """The server's wall clock, stepped by chaos runs (None: the host's own)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.extra = list(extra)
        self.tls = tls
        self.log = workdir / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def url(self, db: int = 0, *, user: str = "", password: str = "", query: str = "") -> str:
        scheme = "rediss" if self.tls else "redis"
        auth = f"{user}:{password}@" if (user or password) else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}/{db}{'?' + query if query else ''}"

    def start(self) -> None:
        """Start (again) on the same port, with no data, and wait until it is ready."""
        port = (
            ["--port", "0", "--tls-port", str(self.port)]
            if self.tls
            else ["--port", str(self.port)]
        )
        cmd = ["redis-server", *port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        cmd += ["--dir", str(self.workdir), "--logfile", "", *self.extra]
        with open(self.log, "ab") as log:
            log.write(f"--- start {self.starts + 1}: {' '.join(cmd)}\n".encode())
            log.flush()
            env = None if self.clock is None else {**os.environ, **self.clock.env()}
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.starts += 1
        self._await_ready()

    def _await_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        marker = f"--- start {self.starts}:".encode()
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                break
            text = self.log.read_bytes()
            if b"Ready to accept connections" in text[text.rfind(marker) :] and self._answers():
                return
            time.sleep(0.02)  # a poll interval while the server starts
        raise AssertionError(
            f"redis-server on port {self.port} not ready within {READY_TIMEOUT} s "
            f"(exit {self.proc.poll() if self.proc else None}); log:\n{self.log_tail()}"
        )

    def _answers(self) -> bool:
        if self.tls:
            return True  # the log line is the check; a TLS PING needs the client's certificates
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
        except OSError:
            return False
        return reply.startswith((b"+PONG", b"-NOAUTH", b"-NOPERM", b"-WRONGPASS"))

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None and self.proc.poll() is None, "the server is not running"
        os.kill(self.proc.pid, sig)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        """kill -9: everything in memory is lost."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> None:
        """kill -9 then start on the same port: the data is gone (no persistence)."""
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"


def _use(request: pytest.FixtureRequest, server: RedisServer) -> RedisServer:
    """Attach the server's log to this test's report if it fails."""
    used = request.node.stash.setdefault(_USED, [])
    if server not in used:
        used.append(server)
    return server


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        for server in item.stash.get(_USED, []):
            report.sections.append((f"redis-server :{server.port} log", server.log_tail()))


def _require_redis() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed here (Debian: apt-get install redis-server)")


@pytest.fixture(scope="session")
def redis_session_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    _require_redis()
    server = RedisServer(tmp_path_factory.mktemp("redis-session"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_backend_url(request: pytest.FixtureRequest, redis_session_server: RedisServer) -> str:
    return _use(request, redis_session_server).url()


@pytest.fixture
def redis_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own, to kill, restart or pause."""
    _require_redis()
    server = _use(request, RedisServer(tmp_path / "redis"))
    server.start()
    yield server
    server.stop()


@dataclass(frozen=True)
class AclServer:
    server: RedisServer
    password: str
    intruder_password: str


@pytest.fixture
def redis_acl_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AclServer]:
    """Default user off; ``rebalancer`` may use rb:* only; ``intruder`` has the same commands
    on other keys."""
    _require_redis()
    password, intruder = "s3cr3t-Pw:@#/?x", "intruder-pw-Zq9"
    extra = [
        "--user", "default", "off",
        "--user", "rebalancer", "on", f">{password}", *BACKEND_ACL.split(),
        "--user", "intruder", "on", f">{intruder}",
        *BACKEND_ACL.replace("~rb:* &rb:*", "~other:* &other:*").split(),
    ]  # fmt: skip
    server = _use(request, RedisServer(tmp_path / "redis-acl", extra))
    server.start()
    yield AclServer(server, password, intruder)
    server.stop()


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    """A CA that signed nothing here: verification against it must fail."""


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def make_certificates(directory: Path) -> TlsFiles:
    """A throw-away CA, a server certificate for 127.0.0.1/localhost and a client certificate,
    made with the ``openssl`` command."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed here: cannot make a test CA")
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    # Extensions as Python 3.13's strict verification (VERIFY_X509_STRICT) wants them: a CA
    # with critical basicConstraints and keyUsage, leaves naming their issuer's key.
    leaf = "basicConstraints=CA:FALSE\nauthorityKeyIdentifier=keyid,issuer\n"
    (d / "san.ext").write_text(f"{leaf}subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    (d / "leaf.ext").write_text(leaf)
    for ca in ("ca", "other-ca"):
        new_ca = ["req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-days", "2",
                  "-addext", "basicConstraints=critical,CA:TRUE",
                  "-addext", "keyUsage=critical,keyCertSign,cRLSign"]  # fmt: skip
        _openssl(*new_ca, "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                 "-subj", f"/CN=rb-test-{ca}", cwd=d)  # fmt: skip
    for who, ext in (("server", ["-extfile", "san.ext"]), ("client", ["-extfile", "leaf.ext"])):
        _openssl("req", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", f"{who}.key",
                 "-out", f"{who}.csr", "-subj", f"/CN=rb-test-{who}", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-out", f"{who}.crt", *ext, cwd=d)  # fmt: skip
    return TlsFiles(
        d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key",
        d / "other-ca.crt",
    )  # fmt: skip


@dataclass(frozen=True)
class TlsServer:
    server: RedisServer
    files: TlsFiles


@pytest.fixture
def redis_tls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TlsServer]:
    """A TLS-only server that also requires a client certificate signed by the test CA."""
    _require_redis()
    files = make_certificates(tmp_path / "pki")
    extra = ["--tls-cert-file", str(files.server_cert), "--tls-key-file", str(files.server_key),
             "--tls-ca-cert-file", str(files.ca), "--tls-auth-clients", "optional"]  # fmt: skip
    server = _use(request, RedisServer(tmp_path / "redis-tls", extra, tls=True))
    with contextlib.suppress(Exception):
        server.start()
    if server.proc is None or server.proc.poll() is not None:
        pytest.skip(f"this redis-server cannot serve TLS; its log:\n{server.log_tail(1500)}")
    yield TlsServer(server, files)
    server.stop()
