"""Fixtures that start real ZooKeeper servers for the tests.

* ``zookeeper_server`` (session): one standalone server from Debian's ``zookeeper`` package on
  a free port, ``tickTime=500`` so that session timeouts of 1 to 10 s are accepted;
* ``zookeeper_backend_url``: ``zookeeper://127.0.0.1:PORT/rb-<unique>``, a fresh chroot per
  test on that server;
* ``zookeeper_ensemble``: three servers forming a quorum, for fault tests, with helpers to
  kill, stop, pause and start single servers and to find the leader.

Every server runs in its own temporary directory (``zoo.cfg``, ``data/``, ``zookeeper.out``)
and is ended by its PID. When a test that used a server fails, the tail of each server's log
is attached to the report. A missing ``java`` or ZooKeeper jar is a visible skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
CONF_DIR = Path("/etc/zookeeper/conf")
# Debian's zookeeper.jar has no SLF4J binding: without these the server logs nothing.
LOG_JARS = [Path("/usr/share/java/slf4j-log4j12.jar"), Path("/usr/share/java/log4j-1.2.jar")]
TICK_MS = 500
START_TIMEOUT = 60.0

_used: dict[str, list[ZkServer]] = {}
"""Test node id -> the servers it used, for the failure report."""


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that were free a moment ago."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def four_letter(port: int, command: str, timeout: float = 2.0) -> str:
    """A ZooKeeper four-letter command's answer, or "" if the server did not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(command.encode())
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


SERVER_JVM = ("-Xms1g", "-Xmx2g")
"""JVM options of a server for benchmarks: a production-sized heap (100,000 resources with their
claims, epochs and progress are some 300,000 znodes) and the JVM's default compilers and
collector."""


@dataclass
class ZkServer:
    """One ZooKeeper server process in its own directory."""

    workdir: Path
    port: int
    myid: int = 0
    peers: list[tuple[int, int, int]] = field(default_factory=list)
    """(myid, quorum port, election port) of every server of an ensemble; empty if standalone."""
    proc: subprocess.Popen[bytes] | None = None
    jvm: tuple[str, ...] = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
    """JVM options: by default a small heap and the quick-starting compiler, for tests;
    :data:`SERVER_JVM` for benchmarks."""

    @property
    def log(self) -> Path:
        return self.workdir / "zookeeper.out"

    def write_config(self) -> None:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={TICK_MS}",
            f"dataDir={data}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            # Every client here comes from 127.0.0.1, and each member opens two connections
            # (the backend's and its session's): ZooKeeper's default of 60 per address would
            # refuse the 31st member (bench_scale.py hosts 99 in one process).
            "maxClientCnxns=0",
        ]
        if self.peers:
            lines += ["initLimit=20", "syncLimit=10", "cnxTimeout=1000"]
            lines += [f"server.{i}=127.0.0.1:{q}:{e}" for i, q, e in self.peers]
            (data / "myid").write_text(f"{self.myid}\n")
        (self.workdir / "zoo.cfg").write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        classpath = ":".join(str(p) for p in [ZOOKEEPER_JAR, CONF_DIR, *LOG_JARS] if p.exists())
        cmd = [
            "java",
            *self.jvm,
            "-Dzookeeper.root.logger=INFO,CONSOLE",
            f"-Dzookeeper.log.dir={self.workdir}",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            classpath,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(self.workdir / "zoo.cfg"),
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """kill -9, and reap."""
        if self.running:
            assert self.proc is not None
            self.signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 15 s), and reap."""
        if self.running:
            assert self.proc is not None
            self.signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)

    def mode(self) -> str | None:
        """ "leader", "follower" or "standalone" while serving, else None."""
        for line in four_letter(self.port, "srvr").splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def wait_serving(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"ZooKeeper server {self.myid} on port {self.port} exited with "
                    f"{self.proc.returncode}; its log:\n{self.log_tail()}"
                )
            if self.mode() is not None:
                return
            time.sleep(0.05)  # polling a server that is starting, not synchronising threads
        raise AssertionError(
            f"ZooKeeper server {self.myid} on port {self.port} did not serve within {timeout} s; "
            f"its log:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 60) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Ensemble:
    """Three servers forming one quorum."""

    servers: list[ZkServer]

    @classmethod
    def of_three(cls, base: Path) -> Ensemble:
        """Three servers under ``base`` on free ports, configured as one quorum (not started)."""
        ports = free_ports(9)
        peers = [(i + 1, ports[3 + i], ports[6 + i]) for i in range(3)]
        return cls(
            [ZkServer(base / f"server{i + 1}", ports[i], myid=i + 1, peers=peers) for i in range(3)]
        )

    @classmethod
    def with_a_slow_follower(cls, base: Path) -> tuple[Ensemble, list[TcpProxy]]:
        """Three servers (not started) of which the third reaches the others' quorum ports
        through a :class:`TcpProxy` each (returned): whichever of the first two leads, holding
        the proxies keeps what the leader sends from that follower, which goes on serving its
        clients from what it has. Start it with :meth:`start_slow_follower`."""
        ensemble = cls.of_three(base)
        third = ensemble.servers[2]
        first, second, own = third.peers
        proxies = [TcpProxy(first[1]), TcpProxy(second[1])]
        third.peers = [(1, proxies[0].port, first[2]), (2, proxies[1].port, second[2]), own]
        return ensemble, proxies

    def start_slow_follower(self) -> None:
        """Start the first two servers, wait for one to lead, then start the third as their
        follower."""
        for server in self.servers:
            server.write_config()
        for server in self.servers[:2]:
            server.start()
        self.wait_quorum()
        self.servers[2].start()
        self.servers[2].wait_serving()

    def start(self) -> None:
        """Write each server's configuration, start them all, and wait for the quorum."""
        for server in self.servers:
            server.write_config()
            server.start()
        self.wait_quorum()

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{s.port}" for s in self.servers)

    def url(self, chroot: str | None = None, userinfo: str = "", query: str = "") -> str:
        path = chroot or f"/rb-{uuid.uuid4().hex[:12]}"
        at = f"{userinfo}@" if userinfo else ""
        return f"zookeeper://{at}{self.hosts}{path}{'?' + query if query else ''}"

    def leader(self, timeout: float = 30.0) -> ZkServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for server in self.servers:
                if server.running and server.mode() == "leader":
                    return server
            time.sleep(0.05)  # polling the servers' state, not synchronising threads
        raise AssertionError(f"no leader within {timeout} s; modes: {self.modes()}")

    def modes(self) -> dict[int, str | None]:
        return {s.myid: s.mode() if s.running else "down" for s in self.servers}

    def wait_quorum(self, timeout: float = START_TIMEOUT) -> None:
        """Every running server serves (as leader or follower)."""
        for server in self.servers:
            if server.running:
                server.wait_serving(timeout)
        self.leader(timeout)

    def close(self) -> None:
        for server in self.servers:
            server.kill()


class TcpProxy:
    """Forwards a local port to a server, and can cut the network: :meth:`cut` drops every
    open connection and black-holes new ones (accepted, never answered) until :meth:`restore`.
    For making a client's connection drop while its server keeps running. :meth:`hold` keeps
    the connections open but forwards nothing until :meth:`flow` (a slow link: what is sent
    meanwhile arrives then, in order)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._held: list[socket.socket] = []
        self._cut = False
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                if self._cut:
                    self._held.append(conn)
                    continue
            try:
                up = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._open += [conn, up]
            for src, dst in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            conns, self._open = self._open, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def hold(self) -> None:
        self._flowing.clear()

    def flow(self) -> None:
        self._flowing.set()

    def restore(self) -> None:
        with self._lock:
            self._cut = False
            held, self._held = self._held, []
        for conn in held:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        self.flow()
        self.cut()
        self.restore()
        self._listener.close()
        self._thread.join(5)


def _require_zookeeper() -> None:
    if shutil.which("java") is None:
        pytest.skip(
            "java is not installed: the ZooKeeper tests need Java 17 "
            "(apt-get install -y openjdk-17-jre-headless)"
        )
    if not ZOOKEEPER_JAR.exists():
        pytest.skip(f"{ZOOKEEPER_JAR} is missing: apt-get install -y zookeeper")


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZkServer]:
    _require_zookeeper()
    (port,) = free_ports(1)
    server = ZkServer(tmp_path_factory.mktemp("zookeeper"), port)
    server.write_config()
    server.start()
    try:
        server.wait_serving()
        yield server
    finally:
        server.stop()


@pytest.fixture
def zookeeper_backend_url(zookeeper_server: ZkServer, request: pytest.FixtureRequest) -> str:
    _used.setdefault(request.node.nodeid, []).append(zookeeper_server)
    return f"zookeeper://127.0.0.1:{zookeeper_server.port}/rb-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def zookeeper_ensemble(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Ensemble]:
    _require_zookeeper()
    ensemble = Ensemble.of_three(tmp_path_factory.mktemp("zk-ensemble"))
    _used.setdefault(request.node.nodeid, []).extend(ensemble.servers)
    try:
        ensemble.start()
        yield ensemble
    finally:
        ensemble.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    servers = _used.get(item.nodeid, [])
    if report.failed and servers:
        for server in servers:
            name = f"ZooKeeper server {server.myid or 'standalone'} (port {server.port}) log"
            report.sections.append((name, server.log_tail(80)))
    if report.when == "teardown":
        _used.pop(item.nodeid, None)
    return report
