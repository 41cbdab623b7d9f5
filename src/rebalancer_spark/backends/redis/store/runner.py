"""Running the Lua scripts: evalsha with reload, staging pipelines, errors translated.

A :class:`ScriptRunner` owns the redis-py client (a thread-safe connection pool) of one
backend handle. :meth:`ScriptRunner.run` calls a script by name with ``KEYS[1]`` = the group's
meta key (redis-py's :class:`~redis.commands.core.Script` sends EVALSHA and, on NOSCRIPT, loads
the script and sends it again); :meth:`ScriptRunner.run_staged` first fills staging keys in
the same MULTI/EXEC, so that large targets and resource sets never travel as one giant script
argument. A refusal comes back as :class:`.errors.Refusal`; every other failure as the
library's :class:`BackendError` with the URL redacted.

The epoch memory is wrapped around the runner: every script is registered with its body inside
a function whose reply travels with the group's high-water mark (meta ``high``: every number
the group ever handed out or stored is at most it, see :mod:`.prelude`), and the runner keeps
it in :attr:`ScriptRunner.memory` before it hands the reply on. No caller has to remember to
note the numbers it saw: whatever the script, what Redis answered is remembered (see
:mod:`.memory` for what that memory is for).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

import redis
from redis.client import Pipeline
from redis.commands.core import Script

from rebalancer_spark.backends.redis import (
    control,
    coordinator,
    ownership,
    reads,
    resources,
    sessions,
)
from rebalancer_spark.backends.redis.errors import refusal, translate
from rebalancer_spark.backends.redis.store.connection import open_client
from rebalancer_spark.backends.redis.store.keys import meta_key
from rebalancer_spark.backends.redis.store.memory import Memory
from rebalancer_spark.backends.redis.store.prelude import PRELUDE
from rebalancer_spark.core.errors import BackendUnavailable
from rebalancer_spark.core.urls import BackendUrl

__all__ = ["SCRIPT_MODULES", "Lua", "ScriptRunner"]

SCRIPT_MODULES = (sessions, coordinator, resources, control, ownership, reads)
"""Every module whose ``__all__`` names Lua script constants."""


class Lua(StrEnum):
    """Every Lua script, by name: :meth:`ScriptRunner.run` takes one of these, so a call to a
    script that does not exist is a type error, not a ``KeyError`` at run time."""

    ACKNOWLEDGE = "ACKNOWLEDGE"
    CLAIM = "CLAIM"
    COMMIT = "COMMIT"
    CONTROL = "CONTROL"
    ELECT = "ELECT"
    HEAD = "HEAD"
    HOLDERS = "HOLDERS"
    JOIN = "JOIN"
    LEASES = "LEASES"
    LEAVE = "LEAVE"
    LIFT_EPOCHS = "LIFT_EPOCHS"
    MEMBER_HEAD = "MEMBER_HEAD"
    MEMBER_VIEW = "MEMBER_VIEW"
    PUBLISH = "PUBLISH"
    PUBLISH_CHANGE = "PUBLISH_CHANGE"
    RELEASE = "RELEASE"
    RENEW = "RENEW"
    RESIGN = "RESIGN"
    RESOURCES = "RESOURCES"
    RESOURCE_CHANGES = "RESOURCE_CHANGES"
    SET_LEAVING = "SET_LEAVING"
    STATE = "STATE"
    TARGET = "TARGET"
    UPDATE_CONTROL = "UPDATE_CONTROL"
    UPDATE_INFO = "UPDATE_INFO"
    UPDATE_RESOURCES = "UPDATE_RESOURCES"


_DEFINED = {name for module in SCRIPT_MODULES for name in module.__all__}
if set(Lua) != _DEFINED:  # pragma: no cover - caught by any import in the tests
    raise ImportError(f"Lua names {sorted(set(Lua) ^ _DEFINED)} do not match the scripts")

log = logging.getLogger("rebalancer_spark.backends.redis")

_REMEMBERED = """
end
local reply = body()
if type(reply) == 'table' and (reply.err or reply.ok) then return reply end
if reply == nil then reply = false end
return {reply, redis.call('HGET', META, 'high') or false}
"""


def remembered(name: str, text: str) -> str:
    """Script ``text`` with its body wrapped so that it answers ``{reply, meta high}`` (a
    refusal, an error reply, is passed on as it is)."""
    if not text.startswith(PRELUDE):  # pragma: no cover - caught by any import in the tests
        raise ImportError(f"the Lua script {name} does not start with the prelude")
    return PRELUDE + "local function body()\n" + text[len(PRELUDE) :] + _REMEMBERED


_FAILURES = (redis.exceptions.RedisError, UnicodeDecodeError, OSError)


class ScriptRunner:
    """The client and the registered scripts of one backend handle."""

    def __init__(self, url: BackendUrl) -> None:
        self.url = url
        self.client: redis.Redis = open_client(url)
        self.closed = False
        self.memory = Memory()
        """What this handle remembers of each group (:mod:`.memory`); every reply keeps it."""
        self._lock = threading.Lock()
        self._scripts: dict[str, Script] = {
            name: self.client.register_script(remembered(name, getattr(module, name)))
            for module in SCRIPT_MODULES
            for name in module.__all__
        }
        self._run_id = self._connect()
        self._last_reply = time.monotonic()
        """When a command last got an answer (a refusal is one): the server of ``_run_id``, or
        one after it, was up then."""

    def _connect(self) -> str | None:
        """PING (so that a bad URL, password or certificate fails at once) and note which
        server process answers; None if the ACL user may not run INFO."""
        try:
            self.client.ping()
        except _FAILURES as exc:
            self.client.close()
            raise translate(exc, self.url, "connecting") from None
        try:
            memory = self.client.info("memory")
            run_id = str(self.client.info("server").get("run_id", ""))
        except redis.exceptions.RedisError:
            return None
        policy = str(memory.get("maxmemory_policy", "noeviction"))
        if int(memory.get("maxmemory", 0) or 0) and policy != "noeviction":
            log.warning(
                "Redis at %s evicts keys when full (maxmemory-policy %s): an evicted lease "
                "key ends a live session early, and a resource could then have two owners; "
                "set maxmemory-policy noeviction",
                self.url.redacted(),
                policy,
            )
        return run_id

    def check_open(self) -> None:
        if self.closed:
            raise BackendUnavailable(
                f"the Redis backend for {self.url.redacted()!r} was closed: open a new one"
            )

    def _remember(self, group: str, wrapped: Any) -> Any:
        """The script's own reply, the group's high-water mark that came with it kept."""
        reply, high = wrapped
        if high is not None and str(high).isdigit():  # anything else: corrupt, read elsewhere
            self.memory.see(group, [int(high)])
        return reply

    def run(self, name: Lua, group: str, args: Sequence[object], doing: str) -> Any:
        """Run script ``name`` on ``group``; a refusal is raised as :class:`Refusal`."""
        self.check_open()
        key = meta_key(group)
        try:
            reply = self._scripts[name](keys=[key], args=[str(a) for a in args])
        except redis.exceptions.ResponseError as exc:
            self._answered()
            found = refusal(exc)
            if found is not None:
                raise found from None
            raise translate(exc, self.url, doing) from None
        except _FAILURES as exc:
            raise translate(exc, self.url, doing) from None
        self._answered()
        return self._remember(group, reply)

    def _answered(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._last_reply = max(self._last_reply, now)

    def run_staged(
        self,
        name: Lua,
        group: str,
        fill: Callable[[Pipeline], None],
        args: Sequence[object],
        doing: str,
    ) -> Any:
        """Fill staging keys and run script ``name`` in one MULTI/EXEC (one round trip)."""
        self.check_open()
        key = meta_key(group)
        try:
            with self.client.pipeline(transaction=True) as pipe:
                fill(pipe)
                self._scripts[name](keys=[key], args=[str(a) for a in args], client=pipe)
                results = pipe.execute(raise_on_error=False)
        except _FAILURES as exc:
            raise translate(exc, self.url, doing) from None
        self._answered()
        failed = next((r for r in results if isinstance(r, Exception)), None)
        if isinstance(failed, redis.exceptions.ResponseError):
            found = refusal(failed)
            if found is not None:
                raise found from None
        if failed is not None:
            raise translate(failed, self.url, doing) from None
        return self._remember(group, results[-1])

    def pipeline_read(self, fill: Callable[[Pipeline], None], doing: str) -> list[Any]:
        """Plain reads, pipelined (no transaction)."""
        self.check_open()
        try:
            with self.client.pipeline(transaction=False) as pipe:
                fill(pipe)
                replies = pipe.execute()
        except _FAILURES as exc:
            raise translate(exc, self.url, doing) from None
        self._answered()
        return replies

    def server_uptime(self) -> int:
        """Whole seconds since the server started, if it is not the process this handle talked
        to before *and* it started after this handle's last answer from that one (it is the
        restart that lost the group's data, so its start bounds the loss); else -1: the same
        process (keys deleted some other way), INFO not allowed, or a server that was already
        up while the previous one still answered (a DNS/VIP switch to a standby, a promoted
        replica): its start says nothing about when the data was lost, only "now" bounds it.

        ``uptime_in_seconds`` is a whole number of seconds (the server started less than
        ``uptime + 1`` s ago), and only durations are compared, never clocks of two hosts."""
        try:
            info = self.client.info("server")
            run_id = str(info.get("run_id", ""))
            uptime = int(info.get("uptime_in_seconds", 0))
        except (redis.exceptions.RedisError, ValueError):
            return -1
        now = time.monotonic()
        with self._lock:
            same = self._run_id is not None and run_id == self._run_id
            since_last_reply = now - self._last_reply
            self._run_id = run_id
            self._last_reply = max(self._last_reply, now)
        if same or uptime + 1 >= since_last_reply:
            return -1
        return uptime

    def close(self) -> None:
        self.closed = True
        self.client.close()
