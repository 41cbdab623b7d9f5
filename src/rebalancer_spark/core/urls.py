"""URLs, generically: split a ``--backend`` URL into its parts, check what every backend URL
shares, and keep secrets out of everything shown.

Each backend plug-in owns its own grammar (hosts, default port, what the path means, its
options) in its folder (``backends/<name>/url.py``); this module knows no scheme. The shape
shared by every backend URL::

    scheme://[user[:password]@]authority[/path][?name=value&...]

User names, passwords, paths and option values are percent-decoded. Backend URLs have no
fragment: ``/``, ``?``, ``#``, ``@`` and ``%`` in a password, path or option value are
written percent-encoded (``%2F``, ``%3F``, ``%23``, ``%40``, ``%25``); a raw ``#``, ``:`` or
``@`` in a password is tolerated. Anything ambiguous is refused rather than guessed.

:func:`parse_backend_url` parses with the grammar of the URL's scheme; the backend registry
(:mod:`rebalancer_spark.backends.registry`) provides it when it is imported, which
``import rebalancer_spark`` does, so the core never imports a plug-in.

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

__all__ = [
    "BackendUrl",
    "SplitUrl",
    "did_you_mean",
    "parse_backend_url",
    "redact_url",
    "set_backend_parser",
    "show",
    "split_url",
]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")
_SCHEME_WORD = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
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

    ``hosts`` holds every ``(host, port)`` the URL names (``()`` for a local file), ``path``
    what the plug-in made of the URL's path (a file path, a chroot, ``""``), ``database`` a
    database number (0 where the store has none). ``options`` holds the query-string
    options, each name at most once. ``shown_path`` is the path as the canonical URL writes
    it (``/0`` for a Redis database, ``""`` for a ZooKeeper URL without chroot); it does not
    take part in equality. The repr is :meth:`redacted`, so the password never shows.
    """

    scheme: str
    hosts: tuple[tuple[str, int], ...]
    path: str
    database: int
    username: str | None
    password: str | None = field(repr=False)
    options: Mapping[str, str] = field(hash=False)
    shown_path: str = field(default="", compare=False)

    def __repr__(self) -> str:  # kept by @dataclass, which never overwrites a defined __repr__
        return f"BackendUrl({self.redacted()!r})"

    def redacted(self) -> str:
        """The URL in canonical form with the password and secret option values as ``***``."""
        userinfo = ""
        if self.username is not None or self.password is not None:
            secret = ":***" if self.password is not None else ""
            userinfo = f"{quote(self.username or '', safe='')}{secret}@"
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)
        query = "&".join(
            f"{quote(k, safe='')}={'***' if _is_secret(k) else quote(v, safe='')}"
            for k, v in self.options.items()
        )
        return f"{self.scheme}://{userinfo}{hosts}{self.shown_path}{'?' if query else ''}{query}"

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
                f"option {name} = {'***' if secret else show(raw)} in backend URL "
                f"{self.redacted()!r} is not a valid {what}"
                f"{'' if secret else f' ({exc})'}: correct the value after '{name}=' in the "
                "URL's query string, or remove the option to use its default"
            ) from None


@dataclass(frozen=True, slots=True)
class SplitUrl:
    """A backend URL cut into its generic parts by :func:`split_url`, not yet interpreted.

    ``shown`` is the URL as it may be shown (secrets cut out); ``authority`` (user
    information and hosts), ``path`` and ``query`` are still percent-encoded.
    """

    shown: str
    scheme: str
    authority: str
    path: str
    query: str

    def credentials(self) -> tuple[tuple[str | None, str | None], str]:
        """((user name, password), the host part of the authority), decoded."""
        if "@" not in self.authority:
            return (None, None), self.authority
        userinfo, _, hostpart = self.authority.rpartition("@")
        return _credentials(userinfo, self.shown), hostpart

    def host_port(self, entry: str, default_port: int) -> tuple[str, int]:
        """One ``host[:port]`` or ``[ipv6][:port]`` entry, checked; ``default_port`` if none."""
        return _host_port(entry, default_port, self.shown)

    def options(self, allowed: Collection[str] | None) -> Mapping[str, str]:
        """The query options, decoded and checked; names outside ``allowed`` are refused
        (``None``: any name)."""
        return _options(self.query, self.scheme, self.shown, allowed)

    def fail(self, problem: str) -> ConfigurationError:
        """An error about this URL: ``backend URL '<shown>' <problem>``."""
        return ConfigurationError(f"backend URL {self.shown!r} {problem}")


def split_url(
    url: object,
    *,
    examples: Collection[str],
    check_scheme: Callable[[str, str], None] = lambda scheme, shown: None,
    local_path: Callable[[str], bool] = lambda scheme: False,
    no_slashes: Callable[[str, str, str], str | None] = lambda scheme, text, shown: None,
) -> SplitUrl:
    """``url`` cut into scheme, authority, path and query, with the checks every backend URL
    shares: a string, no control characters, ``scheme://``, no fragment, no ``@`` after the
    host. ``examples`` are shown when the URL is not of the form ``scheme://...``;
    ``check_scheme(scheme, shown)`` may refuse the scheme before anything else is checked.
    ``local_path(scheme)`` says whether the scheme's URLs name a local file (no authority; an
    ``@`` may belong to the path); ``no_slashes(scheme, text, shown)`` may give a better
    message for ``scheme:rest`` written without ``//``."""
    if not isinstance(url, str):
        raise ConfigurationError(
            f"backend URL must be a string, got {type(url).__name__}: give a URL such as "
            f"{next(iter(examples), 'scheme://host')!r}"
        )
    text = url.strip()
    shown = _display(text, local_path)
    if not text.isprintable():
        raise ConfigurationError(
            f"backend URL {shown!r} contains a control character (such as NUL, a tab or a "
            "newline, shown escaped): remove it"
        )
    match = _SCHEME.match(text)
    if match is None:
        word = _SCHEME_WORD.match(text)
        better = no_slashes(word.group(1).lower(), text, shown) if word else None
        raise ConfigurationError(
            better
            or f"backend URL {shown!r} is not of the form scheme://...: use one of "
            f"{', '.join(examples)}"
        )
    scheme = match.group(1).lower()
    check_scheme(scheme, shown)
    rest = text[match.end() :]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    path, _, query = tail.partition("?")
    if "@" in tail and (authority or not local_path(scheme)):
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
    return SplitUrl(shown, scheme, authority, path, query)


BackendParser = Callable[[str, Mapping[str, Collection[str]] | None], BackendUrl]
_parser: list[BackendParser] = []


def set_backend_parser(parser: BackendParser) -> None:
    """Install the function behind :func:`parse_backend_url`; the backend registry does, when
    imported (the core knows no plug-in, so it is handed the registry's parser)."""
    _parser[:] = [parser]


def parse_backend_url(
    url: str, *, allowed_options: Mapping[str, Collection[str]] | None = None
) -> BackendUrl:
    """Parse and check a backend URL with the grammar of its scheme's plug-in.

    ``allowed_options`` maps a scheme to the option names its plug-in understands; a scheme
    missing from it accepts no options. ``None`` accepts any option. Surrounding whitespace
    is ignored. Raises :class:`ConfigurationError` naming the (redacted) URL, the bad part
    and the fix.
    """
    if not _parser:  # pragma: no cover - `import rebalancer_spark` installs it
        raise ConfigurationError(
            "no backend registry is loaded, so backend URLs cannot be parsed: import "
            "rebalancer_spark.backends first"
        )
    return _parser[0](url, allowed_options)


def redact_url(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it, and the value of
    every secret-looking query option (``password=``, ``token=`` ...), replaced by ``***``.

    Works on arbitrary text, such as a driver's exception message; it is a best effort for
    URLs that :func:`parse_backend_url` refuses: a password holding raw whitespace, or a
    raw ``@`` inside an option value, can defeat it.
    """
    return _SECRET_QUERY.sub(r"\g<head>***", _USERINFO.sub(r"\g<head>***@", text))


def did_you_mean(word: str, choices: Collection[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``word``, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def show(value: str, limit: int = 80) -> str:
    """``value`` quoted for a message, cut to ``limit`` characters."""
    return repr(value if len(value) <= limit else value[: limit - 3] + "...")


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
                f"backend URL {shown!r}: {show(entry)} is not a bracketed IPv6 address: "
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
                f"backend URL {shown!r}: {show(entry)} has several ':'; an IPv6 address goes "
                f"in brackets, e.g. [::1]:{default_port}"
            )
        host, colon, port_given = entry.partition(":")
        port_text = port_given if colon else None
        if not _HOST.match(host):
            raise ConfigurationError(
                f"backend URL {shown!r}: the host {show(host)} is not a valid host name: use "
                f"letters, digits, '.', '-' and '_' (ASCII; punycode for others), e.g. {example}"
            )
    if port_text is None:
        return host, default_port
    if (
        not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5)
        or not 1 <= int(port_text) <= 65535
    ):
        raise ConfigurationError(
            f"backend URL {shown!r}: the port {show(port_text)} of host {show(host)} is not "
            f"a number from 1 to 65535: write host:port, e.g. {host}:{default_port}, or leave "
            f"out ':port' for the default {default_port}"
        )
    return host, int(port_text)


def _options(
    query: str, scheme: str, shown: str, allowed_names: Collection[str] | None
) -> Mapping[str, str]:
    found: dict[str, str] = {}
    for piece in query.split("&"):
        if not piece:
            continue
        raw_key, equals, raw_value = piece.partition("=")
        key, value = unquote(raw_key), unquote(raw_value)
        seen = "***" if _is_secret(key) else show(value)
        if not key:
            raise ConfigurationError(
                f"backend URL {shown!r} has an option value with no name before '=': write "
                "name=value pairs separated by '&'"
            )
        if not equals:
            raise ConfigurationError(
                f"backend URL {shown!r}: the option {show(key)} has no value: write "
                f"{key}=VALUE, or remove it"
            )
        if not (key.isprintable() and value.isprintable()):
            raise ConfigurationError(
                f"backend URL {shown!r}: the option {show(key)} contains a control "
                "character in its name or value: remove it"
            )
        if key in found:
            before = "***" if _is_secret(key) else show(found[key])
            raise ConfigurationError(
                f"backend URL {shown!r} gives the option {show(key)} twice ({before} and "
                f"{seen}): keep only one"
            )
        found[key] = value
    if allowed_names is not None:
        allowed = sorted(allowed_names)
        for key in found:
            if key not in allowed:
                accepted = ", ".join(allowed) if allowed else "none"
                raise ConfigurationError(
                    f"backend URL {shown!r} has the unknown option {show(key)}"
                    f"{did_you_mean(key, allowed)}: {scheme} URLs accept these options: "
                    f"{accepted}. Correct or remove it"
                )
    return MappingProxyType(found)


def _display(text: str, local_path: Callable[[str], bool]) -> str:
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
    if local_path(match.group(1).lower()) and rest.startswith("/"):
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
