"""Log lines that say which group, member and epoch they are about, as text or as JSON.

Use case: a driver runs one member; its log shows ``group=orders member=job-a epoch=3`` on every
line the member's threads write, and with ``--log-format json`` (or
``configure_logging("json")``) each line is one JSON object that a log pipeline can index::

    {"ts": "2026-11-21T06:31:02.118Z", "level": "INFO", "logger": "rebalancer_spark.member",
     "thread": "rebalancer-member", "group": "orders", "member": "job-a", "epoch": 3,
     "message": "member job-a joined group orders"}

How the fields get there: each :class:`~rebalancer_spark.member.Member` binds its three threads
(heartbeat, coordinator, member) to a :class:`LogContext`, and a Spark job's node
(:meth:`rebalancer_spark.spark.session.RebalancerNode.start`) also binds the driver thread that
started it, where the job's main loop runs, until the node stops. :class:`MemberContextFilter`,
placed on a handler, copies the context of the thread that logs into the record (``group``,
``member``, ``epoch``; ``None`` outside any bound thread). Values passed explicitly with
``extra={"group": ...}`` win, so user code can log with the fields through
:func:`member_logger`. ``epoch`` is the coordinator epoch the member last saw (the fencing
token of the coordinator whose targets it follows); ``None`` before it saw one.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import weakref
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

from rebalancer_spark.core.errors import ConfigurationError

__all__ = [
    "FIELDS",
    "LOG_FORMATS",
    "JsonFormatter",
    "LogContext",
    "MemberContextFilter",
    "bind_thread",
    "configure_logging",
    "member_logger",
    "unbind_thread",
]

FIELDS = ("group", "member", "epoch")
"""The fields :class:`MemberContextFilter` adds to every record."""
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = (
    "%(asctime)s %(levelname)s %(name)s [group=%(group)s member=%(member)s epoch=%(epoch)s] "
    "%(message)s"
)


@dataclass(frozen=True, slots=True)
class LogContext:
    """Who is logging: a member of a group, and a way to read its current epoch."""

    group: str
    member: str
    epoch: Callable[[], int | None] = lambda: None

    def fields(self) -> dict[str, object]:
        try:
            epoch = self.epoch()
        except Exception:  # a log line must never fail because of its context
            epoch = None
        return {"group": self.group, "member": self.member, "epoch": epoch}


_contexts: weakref.WeakKeyDictionary[threading.Thread, LogContext] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def bind_thread(thread: threading.Thread, context: LogContext) -> None:
    """Log lines written on ``thread`` carry ``context``'s fields (through the filter)."""
    with _lock:
        _contexts[thread] = context


def unbind_thread(thread: threading.Thread, context: LogContext) -> None:
    """Undo :func:`bind_thread` if ``thread`` is still bound to ``context``."""
    with _lock:
        if _contexts.get(thread) is context:
            del _contexts[thread]


def _current() -> LogContext | None:
    with _lock:
        return _contexts.get(threading.current_thread())


class MemberContextFilter(logging.Filter):
    """Adds ``group``, ``member`` and ``epoch`` to every record (never drops one). Put it on
    a handler: a filter on a logger does not see records from its child loggers."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _current()
        found = context.fields() if context is not None else dict.fromkeys(FIELDS)
        for name, value in found.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ms), level, logger, thread, group, member, epoch,
    message, and ``exc`` with the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        line: dict[str, object] = {
            "ts": stamp.replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "thread": record.threadName,
        }
        for name in FIELDS:
            line[name] = getattr(record, name, None)
        line["message"] = record.getMessage()
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def configure_logging(
    log_format: str = "text", *, level: int = logging.INFO, stream: IO[str] | None = None
) -> logging.Handler:
    """Send the root logger's records to ``stream`` (default stderr) in ``log_format``
    (``text`` or ``json``), each with the member fields; replaces the root's handlers.
    Returns the handler."""
    if log_format not in LOG_FORMATS:
        raise ConfigurationError(
            f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}: use text "
            "(the default) or json"
        )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(MemberContextFilter())
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler


class _MemberAdapter(logging.LoggerAdapter[logging.Logger]):
    def __init__(self, logger: logging.Logger, context: LogContext) -> None:
        super().__init__(logger, {})
        self._context = context

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**self._context.fields(), **kwargs.get("extra", {})}
        return msg, kwargs


def member_logger(logger: logging.Logger, context: LogContext) -> logging.LoggerAdapter[Any]:
    """``logger`` with ``context``'s fields on every record, from any thread."""
    return _MemberAdapter(logger, context)
