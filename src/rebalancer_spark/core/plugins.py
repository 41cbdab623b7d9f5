"""The plug-in descriptor: one registry line per backend or source kind.

A :class:`Plugin` names a kind of store or input by its URL schemes and says where its code
is, without importing it: the registries (:mod:`rebalancer_spark.backends.registry`,
:mod:`rebalancer_spark.sources.registry`) hold one descriptor per plug-in and import a
plug-in's modules only when a URL names one of its schemes. So listing the schemes, or
refusing an unknown one, needs no client library (kazoo, redis, pika, boto3).

A backend plug-in also has a *grammar* module (stdlib only, in its own folder) that exposes
``GRAMMAR``, a :class:`BackendGrammar`: the scheme-specific part of URL parsing, the URL
options it accepts, and whether the store a URL names is missing locally. A source plug-in
parses its URL in its class's constructor, which is cheap (client libraries are imported
only when the source lists or reads).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rebalancer_spark.core.urls import BackendUrl, SplitUrl

__all__ = ["BackendGrammar", "Plugin"]


@dataclass(frozen=True, slots=True)
class Plugin:
    """One plug-in: its URL schemes and where its code is, as importable names.

    ``implementation`` is ``"package.module:Class"``, imported only when a URL of one of the
    ``schemes`` is opened. ``grammar`` names a stdlib-only module with a ``GRAMMAR``
    (:class:`BackendGrammar`) for plug-ins whose URLs are parsed apart from opening them
    (backends); ``""`` when the class parses its own URL (sources). ``extra`` is the
    ``pip install 'rebalancer-spark[extra]'`` that brings its client library (``""``: none
    needed). ``examples`` gives an example URL per scheme (shown in errors; the first is the
    plug-in's own). ``tls_schemes`` are the schemes that mean "over TLS". ``aliases`` maps
    names people write by mistake to the right scheme, for the "did you mean" of errors.
    """

    name: str
    schemes: tuple[str, ...]
    implementation: str
    examples: Mapping[str, str] = field(hash=False)
    grammar: str = ""
    extra: str = ""
    tls_schemes: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    def __post_init__(self) -> None:
        module, colon, cls = self.implementation.partition(":")
        if not (module and colon and cls):
            raise ValueError(f"plug-in {self.name}: implementation must be 'module:Class'")
        if not self.schemes or not set(self.tls_schemes) <= set(self.schemes):
            raise ValueError(f"plug-in {self.name}: tls_schemes must be among its schemes")
        if set(self.examples) - set(self.schemes):
            raise ValueError(f"plug-in {self.name}: an example names a scheme it lacks")

    @property
    def module(self) -> str:
        """The module of the implementation class."""
        return self.implementation.partition(":")[0]

    @property
    def class_name(self) -> str:
        """The implementation class's name in :attr:`module`."""
        return self.implementation.partition(":")[2]

    def example(self, scheme: str | None = None) -> str:
        """An example URL for ``scheme`` (default: the plug-in's first scheme)."""
        return self.examples.get(scheme or self.schemes[0]) or next(iter(self.examples.values()))

    def install_hint(self) -> str:
        """The pip command that installs the plug-in's client library."""
        return f"pip install 'rebalancer-spark[{self.extra or 'all'}]'"


def _never_missing(url: BackendUrl) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class BackendGrammar:
    """The URL grammar of one backend plug-in.

    ``parse`` turns the generic parts of a URL (:class:`~rebalancer_spark.core.urls.SplitUrl`,
    already checked for what every backend URL shares) into a
    :class:`~rebalancer_spark.core.urls.BackendUrl` with the plug-in's hosts, path and
    defaults, or raises :class:`ConfigurationError` naming the part and the fix. ``options``
    maps every URL option the backend accepts to a one-line description. ``store_missing``
    says whether the store a URL names does not exist locally (an absent SQLite file), so a
    read-only command can refuse instead of creating it; network stores say False.
    ``local_file`` says that the URL names a file on this machine (no host; an ``@`` may
    belong to the path). ``no_slashes(scheme, text, shown)`` gives the message for
    ``scheme:rest`` written without ``//`` (None: the generic one).
    """

    parse: Callable[[SplitUrl], BackendUrl]
    options: Mapping[str, str]
    store_missing: Callable[[BackendUrl], bool] = _never_missing
    local_file: bool = False
    no_slashes: Callable[[str, str, str], str | None] | None = None
