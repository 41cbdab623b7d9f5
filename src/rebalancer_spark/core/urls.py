"""Backend URLs: turn the ``--backend`` a user gave into a checked :class:`BackendUrl` value.

The backend plug-in is chosen by the URL's scheme; this module only parses and checks, it
opens nothing::

    sqlite:///abs/path/groups.db[?name=value&...]
    zookeeper://[user:password@]host[:port][,host[:port]...][/chroot][?name=value&...]
    redis://[[user]:password@]host[:port][/db][?name=value&...]     (rediss:// for TLS)

Ports default to 2181 (ZooKeeper) and 6379 (Redis); the Redis database defaults to 0. User
names, passwords, paths and option values are percent-decoded. Backend URLs have no fragment:
``/``, ``?``, ``#``, ``@`` and ``%`` in a password, path or option value are written
percent-encoded (``%2F``, ``%3F``, ``%23``, ``%40``, ``%25``); a raw ``#``, ``:`` or ``@`` in
a password is tolerated. Anything ambiguous is refused rather than guessed.

Every error is a :class:`ConfigurationError` naming the URL, the bad part and the fix. Secrets
never appear in a message or a repr: URLs are shown through :meth:`BackendUrl.redacted` (or,
for arbitrary text such as a driver's exception message, :func:`redact_url`), which replace
passwords, and the values of options whose names look secret (``password``, ``token`` ...),
with ``***``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar, cast
from urllib.parse import quote, unquote

from rebalancer_spark.core.errors import ConfigurationError

__all__ = ["SCHEMES", "BackendUrl", "default_sqlite_url", "parse_backend_url", "redact_url"]

SCHEMES = ("sqlite", "zookeeper", "redis", "rediss")
"""The backend URL schemes, one plug-in each (``rediss`` is Redis over TLS)."""

_DEFAULT_PORTS = {"zookeeper": 2181, "redis": 6379, "rediss": 6379}
_REDIS_MAX_DB = 15
_EXAMPLES = {
    "sqlite": "sqlite:///var/lib/rebalancer/groups.db",
    "zookeeper": "zookeeper://zk1:2181,zk2:2181/rebalancer",
    "redis": "redis://:PASSWORD@redis-host:6379/0",
    "rediss": "rediss://USER:PASSWORD@redis-host:6380/0",
}
_ALIASES = {"zk": "zookeeper", "sqlite3": "sqlite", "file": "sqlite", "redis+tls": "rediss"}

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")
_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_])?\Z")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.\-]+)?\Z")
_SECRET_NAME = re.compile(r"pass|pwd|secret|token|credential|api_?key", re.IGNORECASE)
# "scheme://user:" then everything up to the last "@" of the token: the password, even when
# it holds raw "@", ":", "#", "/" or "?" (over-redacting a rare "@" later in a URL is safe).
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?]*:)\S*@")
_SECRET_QUERY = re.compile(
    r"(?P<head>[?&][^=&\s#]*(?:pass|pwd|secret|token|credential|api_?key)[^=&\s#]*=)[^&\s#]*",
    re.IGNORECASE,
)
_ENCODE_HINT = "percent-encode '/' as %2F, '?' as %3F, '#' as %23 and '@' as %40"

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class BackendUrl:
    """A checked backend URL; build one with :func:`parse_backend_url`.

    ``hosts`` is ``()`` for sqlite, every ``(host, port)`` of the comma list for zookeeper and
    exactly one for redis. ``path`` is the absolute file path for sqlite, the normalised chroot
    for zookeeper (``"/"`` if none, never a trailing slash) and ``""`` for redis. ``database``
    is the Redis database number (0 otherwise). ``options`` holds the query-string options,
    each name at most once. The repr is :meth:`redacted`, so the password never shows.
    """

    scheme: str
    hosts: tuple[tuple[str, int], ...]
    path: str
    database: int
    username: str | None
    password: str | None = field(repr=False)
    options: Mapping[str, str] = field(hash=False)

    def __repr__(self) -> str:  # kept by @dataclass, which never overwrites a defined __repr__
        return f"BackendUrl({self.redacted()!r})"

    def redacted(self) -> str:
        """The URL in canonical form with the password and secret option values as ``***``."""
        userinfo = ""
        if self.username is not None or self.password is not None:
            secret = ":***" if self.password is not None else ""
            userinfo = f"{quote(self.username or '', safe='')}{secret}@"
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)
        if self.scheme == "sqlite":
            path = quote(self.path, safe="/:@")
        elif self.scheme == "zookeeper":
            path = "" if self.path == "/" else quote(self.path, safe="/:")
        else:
            path = f"/{self.database}"
        query = "&".join(
            f"{quote(k, safe='')}={'***' if _is_secret(k) else quote(v, safe='')}"
            for k, v in self.options.items()
        )
        return f"{self.scheme}://{userinfo}{hosts}{path}{'?' if query else ''}{query}"

    def option(self, name: str, parse: Callable[[str], _T], default: _T) -> _T:
        """The option ``name`` converted by ``parse`` (``int``, ``float``, ``bool``, ...), or
        ``default`` when the URL does not give it. ``bool`` understands true/false, yes/no,
        on/off and 1/0. A value ``parse`` refuses is a :class:`ConfigurationError`."""
        raw = self.options.get(name)
        if raw is None:
            return default
        try:
            if parse is bool:
                return cast(_T, _parse_bool(raw))
            return parse(raw)
        except (ValueError, TypeError, ArithmeticError) as exc:
            secret = _is_secret(name)
            what = getattr(parse, "__name__", "value")
            raise ConfigurationError(
                f"option {name} = {'***' if secret else _show(raw)} in backend URL "
                f"{self.redacted()!r} is not a valid {what}"
                f"{'' if secret else f' ({exc})'}: correct the value after '{name}=' in the "
                "URL's query string, or remove the option to use its default"
            ) from None


def parse_backend_url(
    url: str, *, allowed_options: Mapping[str, Collection[str]] | None = None
) -> BackendUrl:
    """Parse and check a backend URL (see the module docstring for the syntax).

    ``allowed_options`` maps a scheme to the option names its plug-in understands; a scheme
    missing from it accepts no options. ``None`` accepts any option. Surrounding whitespace
    is ignored. Raises :class:`ConfigurationError` naming the (redacted) URL, the bad part
    and the fix.
    """
    given: object = url
    if not isinstance(given, str):
        raise ConfigurationError(
            f"backend URL must be a string, got {type(given).__name__}: give a URL such as "
            f"{_EXAMPLES['sqlite']!r}"
        )
    text = given.strip()
    shown = _display(text)
    if not text.isprintable():
        raise ConfigurationError(
            f"backend URL {shown!r} contains a control character (such as NUL, a tab or a "
            "newline, shown escaped): remove it"
        )
    match = _SCHEME.match(text)
    if match is None:
        raise ConfigurationError(_not_a_url(text, shown))
    scheme = match.group(1).lower()
    if scheme not in SCHEMES:
        hint = _ALIASES.get(scheme)
        hint_text = f" (did you mean {hint!r}?)" if hint else _did_you_mean(scheme, SCHEMES)
        raise ConfigurationError(
            f"backend URL {shown!r} has the unknown scheme {_show(scheme)}{hint_text}: use one "
            f"of {', '.join(f'{s} ({e})' for s, e in _EXAMPLES.items())}"
        )
    rest = text[match.end() :]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    path_part, _, query = tail.partition("?")
    if "@" in tail and (authority or scheme != "sqlite"):
        raise ConfigurationError(
            f"backend URL {shown!r} has an '@' after the host: if it belongs to the user name "
            f"or password, {_ENCODE_HINT} in them; an '@' in a path or option value is "
            "written %40"
        )
    if "#" in tail:
        raise ConfigurationError(
            f"backend URL {shown!r} has a '#' in its path or options: backend URLs have no "
            "fragment; write a '#' that belongs to a path or option value as %23"
        )
    if scheme == "sqlite":
        return _sqlite(authority, path_part, query, shown, allowed_options)
    username: str | None = None
    password: str | None = None
    hostpart = authority
    if "@" in authority:
        userinfo, _, hostpart = authority.rpartition("@")
        username, password = _credentials(userinfo, shown)
    if not hostpart:
        raise ConfigurationError(
            f"backend URL {shown!r} names no host: write the host after '//', "
            f"e.g. {_EXAMPLES[scheme]}"
        )
    port = _DEFAULT_PORTS[scheme]
    if scheme == "zookeeper":
        hosts = tuple(_host_port(entry, port, shown) for entry in hostpart.split(","))
        path, database = _chroot(path_part, shown), 0
    else:
        if "," in hostpart:
            raise ConfigurationError(
                f"backend URL {shown!r} lists several hosts ({_show(hostpart)}): {scheme} takes "
                f"exactly one host, e.g. {_EXAMPLES[scheme]}"
            )
        hosts = (_host_port(hostpart, port, shown),)
        path, database = "", _redis_db(path_part, shown)
    options = _options(query, scheme, shown, allowed_options)
    return BackendUrl(scheme, hosts, path, database, username, password, options)


def redact_url(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it, and the value of
    every secret-looking query option (``password=``, ``token=`` ...), replaced by ``***``.

    Works on arbitrary text, such as a driver's exception message; it is a best effort for
    URLs that :func:`parse_backend_url` refuses: a password holding raw whitespace, or a
    raw ``@`` inside an option value, can defeat it.
    """
    return _SECRET_QUERY.sub(r"\g<head>***", _USERINFO.sub(r"\g<head>***@", text))


def default_sqlite_url(state_dir: str) -> str:
    """The URL of ``groups.db`` in the absolute directory ``state_dir``, for example
    ``sqlite:///var/lib/rebalancer/groups.db``; special characters are percent-encoded so that
    :func:`parse_backend_url` gives back exactly that path."""
    if not state_dir.startswith("/"):
        raise ConfigurationError(
            f"state directory {_show(state_dir)} is not an absolute path: give the full path "
            "from the root, e.g. /var/lib/rebalancer"
        )
    return "sqlite://" + quote(state_dir.rstrip("/") + "/groups.db", safe="/:@")


def _sqlite(
    authority: str,
    path_part: str,
    query: str,
    shown: str,
    allowed_options: Mapping[str, Collection[str]] | None,
) -> BackendUrl:
    if authority:
        host = authority.rpartition("@")[2]
        if host.lower() == "localhost" and path_part:
            example = f"sqlite://{path_part}"
        else:
            example = f"sqlite:///full/path/to/{(host + path_part).lstrip('./') or 'groups.db'}"
        raise ConfigurationError(
            f"backend URL {shown!r}: sqlite takes no host, but the URL has "
            f"{_show(host) if host else 'credentials'} between '//' and the path; the file "
            f"is local to this machine: write three slashes then the absolute path, "
            f"e.g. {example}"
        )
    path = unquote(path_part)
    if not path:
        raise ConfigurationError(
            f"backend URL {shown!r} has an empty path: write three slashes then the absolute "
            "path of the database file, e.g. sqlite:///full/path/to/groups.db"
        )
    if not path.isprintable():
        raise ConfigurationError(
            f"backend URL {shown!r}: the path {_show(path)} contains a NUL or control "
            "character: give a plain absolute file path"
        )
    path = "/" + path.lstrip("/")
    relative = path[1:]
    if relative in (".", "..", "~") or relative.startswith(("./", "../", "~")):
        raise ConfigurationError(
            f"backend URL {shown!r}: the path {_show(relative)} is relative (and '~' is not "
            f"expanded): sqlite needs an absolute path, three slashes then the path from the "
            f"root, e.g. sqlite:///full/path/to/{relative.lstrip('./~') or 'groups.db'}"
        )
    if path.endswith("/"):
        raise ConfigurationError(
            f"backend URL {shown!r}: the path {_show(path)} names a directory: add the file "
            f"name, e.g. sqlite://{quote(path, safe='/:@')}groups.db"
        )
    options = _options(query, "sqlite", shown, allowed_options)
    return BackendUrl("sqlite", (), path, 0, None, None, options)


def _credentials(userinfo: str, shown: str) -> tuple[str | None, str | None]:
    if any(c.isspace() for c in userinfo):
        raise ConfigurationError(
            f"backend URL {shown!r}: the user name or password contains whitespace: "
            "percent-encode it (a space is %20)"
        )
    user, colon, secret = userinfo.partition(":")
    username = unquote(user) or None
    if username is not None and not username.isprintable():
        raise ConfigurationError(
            f"backend URL {shown!r}: the user name {username!r} contains a control character: "
            "remove it"
        )
    return username, (unquote(secret) or None) if colon else None


def _host_port(entry: str, default_port: int, shown: str) -> tuple[str, int]:
    example = f"host:{default_port}"
    if entry.startswith("["):
        end = entry.find("]")
        host, after = (entry[1:end], entry[end + 1 :]) if end > 0 else ("", "")
        if not _IPV6.match(host) or (after and not after.startswith(":")):
            raise ConfigurationError(
                f"backend URL {shown!r}: {_show(entry)} is not a bracketed IPv6 address: "
                f"write it as [::1]:{default_port}"
            )
        port_text = after[1:] if after else None
    else:
        if not entry:
            raise ConfigurationError(
                f"backend URL {shown!r} has an empty entry in its host list (a doubled or "
                f"trailing comma): write host:port pairs separated by single commas"
            )
        if entry.count(":") > 1:
            raise ConfigurationError(
                f"backend URL {shown!r}: {_show(entry)} has several ':'; an IPv6 address goes "
                f"in brackets, e.g. [::1]:{default_port}"
            )
        host, colon, port_given = entry.partition(":")
        port_text = port_given if colon else None
        if not _HOST.match(host):
            raise ConfigurationError(
                f"backend URL {shown!r}: the host {_show(host)} is not a valid host name: use "
                f"letters, digits, '.', '-' and '_' (ASCII; punycode for others), e.g. {example}"
            )
    if port_text is None:
        return host, default_port
    if (
        not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5)
        or not 1 <= int(port_text) <= 65535
    ):
        raise ConfigurationError(
            f"backend URL {shown!r}: the port {_show(port_text)} of host {_show(host)} is not "
            f"a number from 1 to 65535: write host:port, e.g. {host}:{default_port}, or leave "
            f"out ':port' for the default {default_port}"
        )
    return host, int(port_text)


def _chroot(path_part: str, shown: str) -> str:
    path = unquote(path_part)
    if path in ("", "/"):
        return "/"
    fix = "write the chroot as /name/sub, e.g. zookeeper://zk1:2181/rebalancer/orders"
    if not path.isprintable() or any("\ud800" <= c <= "\udfff" for c in path):
        raise ConfigurationError(
            f"backend URL {shown!r}: the ZooKeeper chroot {_show(path)} contains a NUL, "
            f"control or unpaired surrogate character, which ZooKeeper refuses: {fix}"
        )
    segments = path[1:].removesuffix("/").split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise ConfigurationError(
                f"backend URL {shown!r}: the ZooKeeper chroot {_show(path)} has "
                f"{'an empty segment' if not segment else f'the segment {segment!r}'}; ZooKeeper "
                f"paths have no empty, '.' or '..' parts: {fix}"
            )
    if segments[0] == "zookeeper":
        raise ConfigurationError(
            f"backend URL {shown!r}: the chroot {_show(path)} is inside /zookeeper, which "
            f"ZooKeeper reserves for itself: {fix}"
        )
    return "/" + "/".join(segments)


def _redis_db(path_part: str, shown: str) -> int:
    if path_part in ("", "/"):
        return 0
    text = unquote(path_part[1:])
    if not (text.isascii() and text.isdigit() and len(text) <= 5) or int(text) > _REDIS_MAX_DB:
        raise ConfigurationError(
            f"backend URL {shown!r}: the Redis database {_show(text)} after the host is not a "
            f"number from 0 to {_REDIS_MAX_DB}: write e.g. redis://host:6379/0, or leave the "
            "path out for database 0"
        )
    return int(text)


def _options(
    query: str,
    scheme: str,
    shown: str,
    allowed_options: Mapping[str, Collection[str]] | None,
) -> Mapping[str, str]:
    found: dict[str, str] = {}
    for piece in query.split("&"):
        if not piece:
            continue
        raw_key, equals, raw_value = piece.partition("=")
        key, value = unquote(raw_key), unquote(raw_value)
        seen = "***" if _is_secret(key) else _show(value)
        if not key:
            raise ConfigurationError(
                f"backend URL {shown!r} has an option value with no name before '=': write "
                "name=value pairs separated by '&'"
            )
        if not equals:
            raise ConfigurationError(
                f"backend URL {shown!r}: the option {_show(key)} has no value: write "
                f"{key}=VALUE, or remove it"
            )
        if not (key.isprintable() and value.isprintable()):
            raise ConfigurationError(
                f"backend URL {shown!r}: the option {_show(key)} contains a control "
                "character in its name or value: remove it"
            )
        if key in found:
            before = "***" if _is_secret(key) else _show(found[key])
            raise ConfigurationError(
                f"backend URL {shown!r} gives the option {_show(key)} twice ({before} and "
                f"{seen}): keep only one"
            )
        found[key] = value
    if allowed_options is not None:
        allowed = sorted(allowed_options.get(scheme, ()))
        for key in found:
            if key not in allowed:
                accepted = ", ".join(allowed) if allowed else "none"
                raise ConfigurationError(
                    f"backend URL {shown!r} has the unknown option {_show(key)}"
                    f"{_did_you_mean(key, allowed)}: {scheme} URLs accept these options: "
                    f"{accepted}. Correct or remove it"
                )
    return MappingProxyType(found)


def _not_a_url(text: str, shown: str) -> str:
    if text.lower().startswith("sqlite:") and "@" not in text:
        path = text[len("sqlite:") :]
        if path.startswith("/"):
            return (
                f"backend URL {shown!r} needs three slashes after 'sqlite:': write sqlite://{path}"
            )
        return (
            f"backend URL {shown!r} has the relative path {_show(path)}: sqlite needs an "
            f"absolute path, three slashes then the path from the root, e.g. "
            f"sqlite:///full/path/to/{path.lstrip('./~') or 'groups.db'}"
        )
    return (
        f"backend URL {shown!r} is not of the form scheme://...: use one of "
        f"{', '.join(_EXAMPLES.values())}"
    )


def _display(text: str) -> str:
    """``text`` made safe to show although it may not parse: the password is cut out by the
    rules the parser uses; where an ``@`` makes those rules ambiguous, all after the scheme."""
    text = _SECRET_QUERY.sub(r"\g<head>***", text)
    match = _SCHEME.match(text)
    if "@" not in text:
        return text
    if match is None:
        prefix = re.match(r"[A-Za-z][A-Za-z0-9+.\-]*:", text)
        return (prefix.group() if prefix else "") + "***"
    head, rest = text[: match.end()], text[match.end() :]
    if match.group(1).lower() == "sqlite" and rest.startswith("/"):
        return text  # no authority: an "@" belongs to the file path
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in tail:
        return head + "***"
    userinfo, _, hostpart = authority.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    return f"{head}{user}{':***' if colon else ''}@{hostpart}{tail}"


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("use true/false, yes/no, on/off or 1/0")


def _is_secret(name: str) -> bool:
    return _SECRET_NAME.search(name) is not None


def _did_you_mean(word: str, choices: Collection[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _show(value: str, limit: int = 80) -> str:
    return repr(value if len(value) <= limit else value[: limit - 3] + "...")
