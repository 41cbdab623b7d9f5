"""Reading the three layers of a Spark job's options, each into a plain dict of options.

* :func:`parse_command_line` (its parser: :func:`build_parser`): the arguments after the
  script, ``--kebab-case`` (``--snake_case`` accepted), ``--read-option KEY=VALUE`` repeated;
* :func:`spark_conf_options`: the ``spark.rebalancer.*`` pairs of ``SparkConf.getAll()``;
* :func:`load_toml`: a TOML file, reader options in its ``[read]`` table.

Each layer refuses unknown names (naming the layer, with a "did you mean") and an option given
twice; keys come out in ``_`` form, reader options as ``read_options``. Merging the layers and
checking the values is :func:`.options.resolve`'s part.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import tomllib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import NoReturn

from rebalancer_spark.core.config import MemberConfig
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.urls import redact_url
from rebalancer_spark.spark.job_config import JobConfig
from rebalancer_spark.spark.option_table import (
    BY_NAME,
    CONF_PREFIX,
    DEFAULT_CONFIG_FILE,
    MEMBERSHIP,
    OPTION_KEYS,
    OPTIONS,
    SOURCE,
    TIMING,
    Option,
    check_read_key,
    show,
    unknown_option,
)

__all__ = ["build_parser", "load_toml", "parse_command_line", "spark_conf_options"]


_DURATION_HELP = "seconds, or a number with a unit: 250ms, 2s, 1.5m, 1h"


# --- the command line ---------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        super().error(redact_url(message))


_EPILOG = f"""\
Every option can also be given as a Spark conf key spark.rebalancer.NAME (--conf or
spark-defaults.conf; reader options as spark.rebalancer.read.KEY), or as NAME = value in
the TOML file (reader options in a [read] table). Precedence: the command line, then the
Spark conf, then the TOML file, then the defaults. Names are written with '-' or '_'.
Durations: {_DURATION_HELP}."""


AddArguments = Callable[[argparse._ArgumentGroup], None]
"""Adds a pipeline's own flags to the group of the parser it is given."""


def build_parser(
    prog: str = "rebalancer job", add_arguments: AddArguments | None = None
) -> argparse.ArgumentParser:
    """The job's argument parser: every option as ``--kebab-case``, defaulting to ``None``
    (not given), so that the layers below it can supply the value; then the pipeline's own
    flags (``add_arguments``), in a group of their own."""
    parser = _Parser(
        prog=prog,
        description="Join a rebalancer group and work on the resources this job is assigned.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # an abbreviation that works today would break with a new option
    )
    parser.add_argument(
        "--config",
        metavar="PATH",
        help=f"the TOML file of options (default: spark.rebalancer.config, else "
        f"{DEFAULT_CONFIG_FILE} in the current directory if it exists)",
    )
    sections = {name: parser.add_argument_group(name) for name in (MEMBERSHIP, SOURCE, TIMING)}
    for option in OPTIONS:
        default = option.default or _default_text(option)
        shown = "required" if default == "required" else f"default: {default}"
        sections[option.section].add_argument(
            _flag(option.name),
            dest=option.name,
            metavar=option.metavar,
            help=f"{option.help} ({shown})".replace("%", "%%"),
        )
        if option.name == "schema":
            sections[SOURCE].add_argument(
                "--read-option",
                dest="read_option",
                action="append",
                metavar="KEY=VALUE",
                help="a Spark reader option, e.g. header=true; repeat for more (default: none)",
            )
    if add_arguments is not None:
        add_arguments(parser.add_argument_group("this job's own options"))
    return parser


def parse_command_line(argv: Sequence[str], *, prog: str = "rebalancer job") -> dict[str, object]:
    """The options given in ``argv`` (the arguments after the script), keys in ``_`` form;
    ``--read-option`` pairs become ``read_options``. Bad or unknown arguments print a message
    (with a "did you mean") and exit with status 2, as argparse does."""
    return parse_job_command_line(argv, prog=prog)[0]


def parse_job_command_line(
    argv: Sequence[str], *, prog: str = "rebalancer job", add_arguments: AddArguments | None = None
) -> tuple[dict[str, object], argparse.Namespace]:
    """:func:`parse_command_line` for a pipeline with flags of its own (``add_arguments``):
    (our options, the pipeline's flags as argparse parsed them)."""
    parser = build_parser(prog, add_arguments)
    ours = {"config", "read_option", *(o.name for o in OPTIONS)}
    flags = ["-h", "--help", "--config", "--read-option", *(_flag(o.name) for o in OPTIONS)]
    namespace, extra = parser.parse_known_args([_dashes(arg, flags) for arg in argv])
    if extra:
        parser.error(f"unrecognized arguments: {_unrecognised(extra, flags)}; see --help")
    values = vars(namespace)
    own = argparse.Namespace(**{k: v for k, v in values.items() if k not in ours})
    given = {k: v for k, v in values.items() if v is not None and k in ours}
    pairs = given.pop("read_option", None)
    if isinstance(pairs, list):
        reads: dict[str, str] = {}
        for pair in pairs:
            key, equals, value = str(pair).partition("=")
            if not equals:
                parser.error(
                    f"--read-option {show(pair)} is not KEY=VALUE: write e.g. "
                    "--read-option header=true"
                )
            try:
                check_read_key(key, "--read-option")
            except ConfigurationError as exc:
                parser.error(str(exc))
            for old in [k for k in reads if k.lower() == key.lower()]:
                del reads[old]  # the command line is ordered: the last one wins
            reads[key] = value
        given["read_options"] = reads
    return given, own


def _dashes(arg: str, flags: Collection[str]) -> str:
    name, equals, value = arg.partition("=")
    dashed = name.replace("_", "-")
    return dashed + equals + value if name.startswith("--") and dashed in flags else arg


def _unrecognised(extra: Sequence[str], flags: Collection[str]) -> str:
    shown = []
    for arg in extra:
        text = redact_url(arg)
        if arg.startswith("-"):
            wanted = arg.partition("=")[0].replace("_", "-")
            close = difflib.get_close_matches(wanted, list(flags), n=1, cutoff=0.6)
            text += f" (did you mean {close[0]}?)" if close else ""
        shown.append(text)
    return " ".join(shown)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _default_text(option: Option) -> str:
    fields = {f.name: f.default for f in dataclasses.fields(MemberConfig)}
    fields |= {f.name: f.default for f in dataclasses.fields(JobConfig)}
    value = fields[option.name]
    return f"{value:g}s" if option.kind == "duration" and isinstance(value, float) else str(value)


# --- the Spark conf and the TOML file -----------------------------------------------------------


def spark_conf_options(pairs: Iterable[tuple[str, str]]) -> dict[str, object]:
    """The options among ``SparkConf.getAll()`` pairs: keys starting with ``spark.rebalancer.``,
    the prefix removed, in ``_`` form; ``spark.rebalancer.read.X`` becomes ``read_options[X]``.
    Unknown keys and keys given twice are refused."""
    found: dict[str, object] = {}
    spelled: dict[str, str] = {}
    reads: dict[str, str] = {}
    for key, value in pairs:
        if not key.startswith(CONF_PREFIX):
            continue
        rest = key[len(CONF_PREFIX) :]
        if rest.startswith("read."):
            option = rest[len("read.") :]
            check_read_key(option, f"spark conf key {key}")
            name = f"read.{option.lower()}"
            reads[option] = value
        else:
            name = rest.replace("-", "_")
            if name not in (*OPTION_KEYS, "config"):
                raise unknown_option(
                    f"spark conf key {key}", name, (*OPTION_KEYS, "config"), CONF_PREFIX, rest
                )
            found[name] = value
        if name in spelled:
            raise ConfigurationError(
                f"spark conf option {name} is given twice, as {spelled[name]} and {key}: keep one"
            )
        spelled[name] = key
    if reads:
        found["read_options"] = reads
    return found


def load_toml(path: str) -> dict[str, object]:
    """The options in the TOML file ``path``, keys in ``_`` form; the ``[read]`` table becomes
    ``read_options`` (values as Spark wants them: ``true``, ``10``). A missing or unreadable
    file, invalid TOML, an unknown key or a value of the wrong type is refused."""
    where = f"TOML file {path}"
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigurationError(
            f"{where} does not exist (looked for {os.path.abspath(path)}): correct the path; "
            "relative paths start from the current directory"
        ) from None
    except IsADirectoryError:
        raise ConfigurationError(f"{where} is a directory: name the .toml file in it") from None
    except OSError as exc:
        raise ConfigurationError(
            f"{where} cannot be read ({exc.strerror}): check its permissions"
        ) from None
    except UnicodeDecodeError:
        raise ConfigurationError(f"{where} is not UTF-8 text: save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(
            f"{where} is not valid TOML: {exc}; fix the file there (strings need quotes, "
            'e.g. session-timeout = "10s")'
        ) from None
    found: dict[str, object] = {}
    spelled: dict[str, str] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name == "read":
            if not isinstance(value, dict):
                raise ConfigurationError(
                    f"{where} key {key!r} is {_toml_type(value)}: reader options go in a table, "
                    "e.g. [read] then header = true"
                )
            found["read_options"] = _toml_reads(where, value)
        elif name == "config":
            raise ConfigurationError(
                f"{where} key {key!r}: a TOML file cannot name another one; give the file with "
                "--config PATH or spark.rebalancer.config"
            )
        elif name not in OPTION_KEYS:
            raise unknown_option(f"{where} key {key!r}", name, (*OPTION_KEYS, "read"), "", key)
        else:
            found[name] = _toml_value(where, key, BY_NAME[name], value)
        if name in spelled:
            raise ConfigurationError(
                f"{where}: option {name} is given twice, as {spelled[name]!r} and {key!r}: keep one"
            )
        spelled[name] = key
    return found


def _toml_value(where: str, key: str, option: Option, value: object) -> object:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if option.kind == "list" and isinstance(value, list):
        bad = next((item for item in value if not isinstance(item, str)), None)
        if bad is None:
            return tuple(value)
        problem = f"an array holding {_toml_type(bad)}"
    elif (
        isinstance(value, str)
        or (option.kind == "duration" and number)
        or (option.kind == "count" and isinstance(value, int) and not isinstance(value, bool))
    ):
        return value
    else:
        problem = _toml_type(value)
    expected, example = {
        "text": ("a string", '"..."'),
        "duration": ("a duration", '"2s" (or 2, in seconds)'),
        "count": ("a whole number", "100"),
        "list": ("an array of strings", '["a", "b"]'),
    }[option.kind]
    raise ConfigurationError(
        f"{where} key {key!r} is {problem}, but {option.name} takes {expected}: write "
        f"{key} = {example}"
    )


def _toml_reads(where: str, table: Mapping[str, object]) -> dict[str, str]:
    reads: dict[str, str] = {}
    for key, value in table.items():
        check_read_key(key, f"{where} table [read]")
        if isinstance(value, bool):
            reads[key] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            reads[key] = str(value)
        else:
            raise ConfigurationError(
                f"{where} key 'read.{key}' is {_toml_type(value)}: reader options are strings, "
                f"numbers or booleans, e.g. {key} = true"
            )
        if any(k.lower() == key.lower() for k in reads if k != key):
            raise ConfigurationError(f"{where}: reader option {key} is given twice: keep one")
    return reads


def _toml_type(value: object) -> str:
    kinds: tuple[tuple[type, str], ...] = (
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a float"),
        (str, "a string"),
        (list, "an array"),
        (dict, "a table"),
    )
    return next((text for kind, text in kinds if isinstance(value, kind)), "a date or time")
