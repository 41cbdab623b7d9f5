"""redis-py's exceptions and the scripts' refusals, translated into the library's error tree.

A script refuses with an error reply ``CODE {json}``; :func:`refusal` parses it into a
:class:`Refusal` that the backend turns into :class:`FencedError`, :class:`SessionExpired` or
:class:`MemberIdInUse` with a message naming the group, member, resource and epochs. Every
other failure becomes a :class:`BackendError` whose message shows the URL redacted
(:meth:`BackendUrl.redacted`) and the driver's text through :func:`redact_url`, so a password
never reaches a log or a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis

from rebalancer_spark.core.errors import (
    BackendError,
    BackendUnavailable,
    CorruptStateError,
)
from rebalancer_spark.core.urls import BackendUrl, redact_url

__all__ = ["Refusal", "refusal", "translate"]

_CODES = frozenset({"EXPIRED", "FENCED", "INUSE", "STALE"})


class Refusal(Exception):
    """A script said no: ``code`` is EXPIRED, FENCED, INUSE or STALE, ``fields`` its details."""

    def __init__(self, code: str, fields: dict[str, str]) -> None:
        super().__init__(code)
        self.code = code
        self.fields = fields

    def get(self, name: str, default: str = "") -> str:
        return str(self.fields.get(name, default))


def refusal(exc: redis.exceptions.ResponseError) -> Refusal | None:
    """The :class:`Refusal` carried by a script's error reply, or None for any other error."""
    code, _, payload = str(exc).partition(" ")
    if code not in _CODES:
        return None
    try:
        fields = json.loads(payload) if payload.strip() else {}
    except ValueError:
        fields = {}
    if not isinstance(fields, dict):
        fields = {}
    return Refusal(code, {str(k): str(v) for k, v in fields.items()})


def translate(exc: BaseException, url: BackendUrl, doing: str) -> BackendError:
    """The library's error for a redis-py exception raised while ``doing`` something."""
    where = f"Redis at {url.redacted()!r}"
    text = redact_url(str(exc))
    if url.password:
        text = text.replace(url.password, "***")
    code = str(getattr(exc, "status_code", None) or text.partition(" ")[0])
    facts = _Facts(exc, url, doing, where, text, code)
    return (
        _refused_access(facts)
        or _unreachable(facts)
        or _unusable_store(facts)
        or BackendError(f"{where} failed while {doing} ({type(exc).__name__}: {text})")
    )


@dataclass(frozen=True, slots=True)
class _Facts:
    exc: BaseException
    url: BackendUrl
    doing: str
    where: str
    text: str
    code: str


def _refused_access(f: _Facts) -> BackendError | None:
    """Credentials, ACL permissions, a cluster node: the server refuses this client."""
    where, doing, code, text = f.where, f.doing, f.code, f.text
    if isinstance(f.exc, redis.exceptions.AuthenticationError) or code in ("WRONGPASS", "NOAUTH"):
        return BackendUnavailable(
            f"{where} refused the credentials while {doing} ({code} {text}): check the user "
            "name and password in the URL (redis://USER:PASSWORD@host:port/db; percent-encode "
            "'@', '/' and '#' in them) and that the ACL user is enabled ('ACL GETUSER USER')"
        )
    if code == "NOPERM":
        user = f.url.username or "default"
        return BackendUnavailable(
            f"{where}: the ACL user {user!r} may not run what {doing} needs ({text}): grant it "
            "the keys ~rb:*, the channels &rb:* and the commands listed in "
            "docs/backends/redis.md (section Security)"
        )
    if code in ("MOVED", "ASK", "CROSSSLOT", "CLUSTERDOWN", "TRYAGAIN"):
        return BackendUnavailable(
            f"{where} is a Redis Cluster node ({code} {text}) while {doing}: this backend talks "
            "to one server; point the URL at a standalone server or a primary with a proxy"
        )
    return None


def _unreachable(f: _Facts) -> BackendError | None:
    """A server that does not answer, or cannot be connected to."""
    where, doing, text = f.where, f.doing, f.text
    if isinstance(f.exc, redis.exceptions.TimeoutError):
        return BackendUnavailable(
            f"{where} did not answer in time while {doing} ({text}): check that the server is "
            "running and not paused or overloaded, or raise ?timeout= in the URL"
        )
    if isinstance(f.exc, redis.exceptions.ConnectionError):
        hint = "check the host, the port and that redis-server is running"
        if "certificate" in text.lower() or "ssl" in text.lower():
            hint = (
                "the TLS handshake failed: check that the server's certificate is signed by "
                "the CA given in ?ca_file= and names the host (or set check_hostname=false), "
                "and that the port is the server's tls-port"
            )
        return BackendUnavailable(f"{where} cannot be reached while {doing} ({text}): {hint}")
    return None


def _unusable_store(f: _Facts) -> BackendError | None:
    """Keys of another program, a server that cannot take writes now, bytes not ours."""
    where, doing, code, text = f.where, f.doing, f.code, f.text
    if code == "WRONGTYPE":
        return CorruptStateError(
            f"{where}: a key under the rb: prefix has a type this library never writes while "
            f"{doing} ({text}): another program uses the rb:{{GROUP}}: keys; move it to "
            "another prefix or database"
        )
    if code in ("OOM", "READONLY", "MASTERDOWN", "BUSY", "LOADING", "MISCONF"):
        return BackendUnavailable(
            f"{where} cannot accept writes now while {doing} ({code} {text}): connect to the "
            "primary, free memory (maxmemory with the noeviction policy), or wait until it "
            "has loaded"
        )
    if isinstance(f.exc, UnicodeDecodeError):
        return CorruptStateError(
            f"{where} holds bytes that are not UTF-8 under the group's keys while {doing}: "
            "they were not written by rebalancer-spark"
        )
    return None
