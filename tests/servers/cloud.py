"""Fixtures for the sources' servers: S3 and SQS from moto's server mode, and RabbitMQ.

* ``moto_server`` (session scope): ``python -m moto.server`` in its own process on a free port
  (a real HTTP endpoint that boto3, pyarrow's S3 filesystem and member processes all reach);
  ended by its PID. Its log is attached to the report of a failed test that used it.
* ``s3_bucket``: a fresh bucket on it (``S3Bucket``: name, endpoint, a boto3 client).
* ``sqs_prefix``: a queue-name prefix no other test uses, and a boto3 SQS client.
* ``rabbitmq``: the machine's RabbitMQ (``RABBITMQ_URL``, default
  ``amqp://guest:guest@127.0.0.1:5672/%2F``) with a queue-name prefix of the test's own; the
  queues it made are deleted afterwards. A RabbitMQ that cannot be reached fails the test with
  the reason: the build machines run one.
* ``rabbitmq_management`` (session scope): a RabbitMQ node of the tests' own, started from the
  machine's RabbitMQ installation (``/usr/lib/rabbitmq/bin/rabbitmq-server``) on free ports,
  with the management plugin enabled in its own plugins file (the machine's broker has it
  disabled, and changing that is not the tests' business); its data and logs in a temporary
  directory; ended by its PID. About 16 s to start here.

Credentials for moto are throw-away values; nothing here touches a real cloud.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

READY_TIMEOUT = 30.0
ACCESS_KEY = "testing-access-key"
SECRET_KEY = "testing-secret-key"  # noqa: S105 - moto accepts any key; nothing real
REGION = "us-east-1"
_names = itertools.count()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class MotoServer:
    """One ``moto.server`` process serving S3 and SQS on 127.0.0.1."""

    workdir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "moto.log"

    def start(self) -> None:
        self.port = _free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            probe = self.endpoint + "/moto-api/"  # http on loopback, built here
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(probe, timeout=1),  # noqa: S310
            ):
                return
            time.sleep(0.05)  # polling a starting server's port, not synchronising a test
        self.stop()
        raise RuntimeError(
            f"moto.server did not answer on {self.endpoint} within {READY_TIMEOUT} s "
            f"(exit {self.proc.poll() if self.proc else None}); log:\n{self.log()}"
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def client(self, service: Literal["s3", "sqs"]) -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )


@dataclass
class S3Bucket:
    name: str
    server: MotoServer
    client: Any = field(repr=False)

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def put(self, key: str, body: bytes | str) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.client.put_object(Bucket=self.name, Key=key, Body=data)


@dataclass
class SqsPrefix:
    prefix: str
    server: MotoServer
    client: Any = field(repr=False)

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def create(self, name: str) -> str:
        url: str = self.client.create_queue(QueueName=self.prefix + name)["QueueUrl"]
        return url


@dataclass
class RabbitMq:
    """The machine's RabbitMQ, with a queue-name prefix of the test's own."""

    url: str
    prefix: str
    made: list[str] = field(default_factory=list)

    def connection(self) -> Any:
        import pika

        return pika.BlockingConnection(pika.URLParameters(self.url))

    def declare(self, name: str, messages: list[bytes] | None = None) -> str:
        queue = self.prefix + name
        conn = self.connection()
        try:
            channel = conn.channel()
            channel.queue_declare(queue=queue, durable=True)
            self.made.append(queue)
            for body in messages or []:
                channel.basic_publish(exchange="", routing_key=queue, body=body)
        finally:
            conn.close()
        return queue

    def publish(
        self,
        queue: str,
        messages: Sequence[tuple[str | None, bytes]],
        headers: dict[str, str] | None = None,
    ) -> None:
        """Publish ``(message_id, body)`` pairs (persistent) to the queue named ``queue``."""
        import pika

        conn = self.connection()
        try:
            channel = conn.channel()
            for message_id, body in messages:
                props = pika.BasicProperties(
                    message_id=message_id, headers=headers, delivery_mode=2
                )
                channel.basic_publish(exchange="", routing_key=queue, body=body, properties=props)
        finally:
            conn.close()

    def depth(self, queue: str) -> int:
        conn = self.connection()
        try:
            count: int = (
                conn.channel().queue_declare(queue=queue, passive=True).method.message_count
            )
            return count
        finally:
            conn.close()

    def source_url(self, **options: str) -> str:
        """A rabbitmq:// source URL on this broker with these query options."""
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return self.url.replace("amqp://", "rabbitmq://", 1) + ("?" + query if query else "")

    def cleanup(self) -> None:
        if not self.made:
            return
        conn = self.connection()
        try:
            channel = conn.channel()
            for queue in self.made:
                channel.queue_delete(queue=queue)
        finally:
            conn.close()


RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")


@dataclass
class RabbitMqNode:
    """A RabbitMQ node of the tests' own, with the management plugin; see the module doc."""

    workdir: Path
    port: int = 0
    management_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def management(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"

    def start(self) -> None:
        self.port, self.management_port, dist_port = _free_port(), _free_port(), _free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "enabled_plugins").write_text("[rabbitmq_management].\n")
        (self.workdir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            f"management.tcp.port = {self.management_port}\n"
            "management.tcp.ip = 127.0.0.1\n"
        )
        env = {
            **os.environ,
            "HOME": str(self.workdir),  # its own Erlang cookie
            "RABBITMQ_NODENAME": f"rbtest{os.getpid()}x{next(_names)}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.workdir / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.workdir / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.workdir / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.workdir / "advanced.config"),
            "RABBITMQ_PID_FILE": str(self.workdir / "pid"),
        }
        with open(self.workdir / "out.log", "ab") as log:
            self.proc = subprocess.Popen(
                [str(RABBITMQ_SERVER)], stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + 90
        probe = urllib.request.Request(f"{self.management}/api/overview")  # noqa: S310
        probe.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(probe, timeout=1):  # noqa: S310
                    return
            except urllib.error.HTTPError as exc:  # up, not ready: close the answer
                exc.close()
            except OSError:
                pass
            time.sleep(0.1)  # polling a starting server's port, not synchronising a test
        log_text = self.log()
        self.stop()
        raise RuntimeError(f"RabbitMQ node did not start within 90 s; log:\n{log_text}")

    def stop(self) -> None:
        """Kill the Erlang VM (its PID file) and the launcher script, by PID."""
        pid_file = self.workdir / "pid"
        if pid_file.exists():
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def log(self) -> str:
        try:
            return (self.workdir / "out.log").read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"


@pytest.fixture(scope="session")
def rabbitmq_management(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMqNode]:
    if not RABBITMQ_SERVER.exists():
        pytest.fail(
            f"{RABBITMQ_SERVER} is missing: install Debian's rabbitmq-server package (the "
            "build machines have it) to test listing queues through the management API"
        )
    node = RabbitMqNode(tmp_path_factory.mktemp("rabbitmq-node"))
    node.start()
    yield node
    node.stop()


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    server.start()
    yield server
    server.stop()


def _unique(request: pytest.FixtureRequest) -> str:
    base = request.node.name.split("[")[0][-20:].replace("_", "-").strip("-").lower()
    return f"{base}-{os.getpid()}-{next(_names)}"


@pytest.fixture
def s3_bucket(moto_server: MotoServer, request: pytest.FixtureRequest) -> S3Bucket:
    client = moto_server.client("s3")
    name = _unique(request)[-63:].strip("-")
    client.create_bucket(Bucket=name)
    return S3Bucket(name, moto_server, client)


@pytest.fixture
def sqs_prefix(moto_server: MotoServer, request: pytest.FixtureRequest) -> SqsPrefix:
    return SqsPrefix(_unique(request) + "-", moto_server, moto_server.client("sqs"))


@pytest.fixture
def rabbitmq(request: pytest.FixtureRequest) -> Iterator[RabbitMq]:
    url = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
    broker = RabbitMq(url, f"{_unique(request)}-{uuid.uuid4().hex[:6]}-")
    try:
        broker.connection().close()
    except Exception as exc:  # the reason, not a silent skip
        pytest.fail(f"RabbitMQ at {url.split('@')[-1]} cannot be reached ({exc}); start it")
    yield broker
    broker.cleanup()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when != "call" or not report.failed:
        return
    for value in getattr(item, "funcargs", {}).values():
        server = value if isinstance(value, MotoServer) else getattr(value, "server", None)
        if isinstance(server, MotoServer):
            report.sections.append(("moto.server log", server.log()))
            return
