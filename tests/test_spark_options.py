"""Tests of a Spark job's options (spark.options): three layers merged into one JobConfig."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rebalancer_spark.core.config import CONFIG_KEYS, MemberConfig
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.spark import options as options_module
from rebalancer_spark.spark.options import (
    OPTION_KEYS,
    JobConfig,
    build_parser,
    load_toml,
    parse_command_line,
    resolve,
    spark_conf_options,
)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
SQLITE = "sqlite:///var/lib/rebalancer/groups.db"
CONF = "spark.rebalancer."


def _toml(tmp_path: Path, text: str, name: str = "job.toml") -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


def _resolve(
    argv: list[str],
    conf: dict[str, str] | None = None,
    toml_path: str | None = None,
) -> JobConfig:
    return resolve(
        parse_command_line(argv),
        spark_conf_options((conf or {}).items()),
        toml_path=toml_path,
        default_backend=SQLITE,
    )


def test_public_surface_is_pinned() -> None:
    assert options_module.__all__ == [
        "CONF_PREFIX",
        "DEFAULT_CONFIG_FILE",
        "FORMATS",
        "OPTION_KEYS",
        "JobConfig",
        "build_parser",
        "load_toml",
        "parse_command_line",
        "resolve",
        "spark_conf_options",
    ]
    job_fields = {
        "source",
        "resources",
        "output",
        "output_format",
        "checkpoint_root",
        "files_history",
        "audit",
        "format",
        "schema",
    }
    job_fields |= {"max_files_per_batch", "poll_interval", "discovery_interval", "log_format"}
    job_fields |= {"lag_interval"}
    assert set(OPTION_KEYS) == set(CONFIG_KEYS) | job_fields


def test_importing_the_options_needs_no_spark() -> None:
    code = (
        "import sys; import rebalancer_spark.spark.options; "
        "print(sorted(m for m in ('pyspark', 'py4j', 'deltalake') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- precedence and origins ---------------------------------------------------------------------


def test_command_line_beats_spark_conf_beats_toml_beats_default(tmp_path: Path) -> None:
    toml = _toml(
        tmp_path,
        'group = "from-toml"\nsession-timeout = "30s"\nformat = "json"\n'
        'output = "/toml/out"\npoll_interval = 7\nassignor = "round_robin"\n',
    )
    conf = {
        f"{CONF}group": "from-conf",
        f"{CONF}session-timeout": "20s",
        f"{CONF}format": "parquet",
        f"{CONF}max_files_per_batch": "7",
    }
    job = _resolve(["--group", "from-cli", "--session-timeout", "1500ms", "--config", toml], conf)
    assert job.member.group == "from-cli"
    assert job.member.session_timeout == 1.5
    assert job.format == "parquet"
    assert job.max_files_per_batch == 7
    assert job.output == "/toml/out"
    assert job.poll_interval == 7.0
    assert job.member.assignor == "round_robin"
    assert job.discovery_interval == 30.0
    assert job.member.backend == SQLITE
    layer = f"TOML file {toml}"
    assert {k: job.origins[k] for k in ("group", "session_timeout", "format", "output")} == {
        "group": "command line",
        "session_timeout": "command line",
        "format": "spark conf",
        "output": layer,
    }
    assert job.origins["max_files_per_batch"] == "spark conf"
    assert job.origins["poll_interval"] == layer
    assert (job.origins["discovery_interval"], job.origins["backend"]) == ("default", "default")
    assert job.origins["config"] == "command line"
    assert job.config_file == toml
    assert set(OPTION_KEYS) <= job.origins.keys()


def test_each_layer_alone_and_both_spellings(tmp_path: Path) -> None:
    toml = _toml(tmp_path, 'group = "g"\nmax_files_per_batch = 5\ndrain-timeout = 12\n')
    from_toml = _resolve([], toml_path=toml)
    assert (from_toml.max_files_per_batch, from_toml.member.drain_timeout) == (5, 12.0)
    from_conf = _resolve([], {f"{CONF}group": "g", f"{CONF}drain_timeout": "1.5m"})
    assert from_conf.member.drain_timeout == 90.0
    from_cli = _resolve(["--group", "g", "--drain_timeout=2m", "--max_files_per_batch", "3"])
    assert (from_cli.member.drain_timeout, from_cli.max_files_per_batch) == (120.0, 3)


def test_defaults_when_nothing_but_the_group_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no conf/rebalancer.toml here
    job = _resolve(["--group", "g"])
    assert job.config_file is None
    assert job.member == MemberConfig(group="g", backend=SQLITE)
    assert (job.source, job.resources, job.output, job.audit, job.schema) == (None,) * 5
    assert (job.format, job.max_files_per_batch) == ("csv", 100)
    assert (job.poll_interval, job.discovery_interval) == (2.0, 30.0)
    assert dict(job.read_options) == {}
    assert "config" not in job.origins
    assert hash(job) == hash(_resolve(["--group", "g"]))


def test_the_config_file_comes_from_cli_then_conf_then_the_job(tmp_path: Path) -> None:
    files = {n: _toml(tmp_path, f'output = "/{n}"\n', f"{n}.toml") for n in ("a", "b", "c")}
    conf = {f"{CONF}config": files["b"]}
    assert _resolve(["--group", "g", "--config", files["a"]], conf, files["c"]).output == "/a"
    assert _resolve(["--group", "g"], conf, files["c"]).output == "/b"
    job = _resolve(["--group", "g"], {}, files["c"])
    assert (job.output, job.origins["config"], job.origins["output"]) == (
        "/c",
        "default",
        f"TOML file {files['c']}",
    )


def test_default_config_file_is_read_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _toml(tmp_path, 'group = "from-default-file"\n', "conf/rebalancer.toml")
    job = _resolve([])
    assert job.member.group == "from-default-file"
    assert job.config_file == "conf/rebalancer.toml"
    assert job.origins["group"] == "TOML file conf/rebalancer.toml"
    assert "TOML file conf/rebalancer.toml" in job.describe()


def test_read_options_merge_key_by_key(tmp_path: Path) -> None:
    toml = _toml(
        tmp_path,
        'group = "g"\n[read]\nheader = false\nsep = ";"\nsamplingRatio = 0.5\nmaxColumns = 9\n'
        "inferSchema = true\n",
    )
    conf = {f"{CONF}read.header": "true", f"{CONF}read.mode": "PERMISSIVE"}
    argv = ["--read-option", "MODE=FAILFAST", "--read-option", "nullValue=", "--config", toml]
    job = _resolve(argv, conf)
    assert dict(job.read_options) == {
        "MODE": "FAILFAST",  # Spark reads options case-insensitively: one key, CLI wins
        "nullValue": "",
        "header": "true",
        "sep": ";",
        "samplingRatio": "0.5",
        "maxColumns": "9",
        "inferSchema": "true",
    }
    assert job.origins["read.MODE"] == "command line"
    assert job.origins["read.header"] == "spark conf"
    assert job.origins["read.sep"] == f"TOML file {toml}"
    assert "read.mode" not in job.origins


def test_a_repeated_command_line_option_keeps_its_last_value() -> None:
    given = parse_command_line(
        ["--group", "a", "--group", "b", "--read-option", "x=1", "--read-option", "X=2"]
    )
    assert given == {"group": "b", "read_options": {"X": "2"}}


def test_source_and_resources_are_one_choice_made_by_the_highest_layer(tmp_path: Path) -> None:
    toml = _toml(tmp_path, 'group = "g"\nsource = "file:///data/landing/"\n')
    job = _resolve(["--resources", "a, b,c", "--config", toml])
    assert (job.source, job.resources) == (None, ("a", "b", "c"))
    assert job.origins["resources"] == "command line"
    assert _resolve([], toml_path=toml).source == "file:///data/landing/"
    from_list = _toml(tmp_path, 'group = "g"\nresources = ["x/1", "x/2"]\n', "list.toml")
    assert _resolve([], toml_path=from_list).resources == ("x/1", "x/2")


@pytest.mark.parametrize("layer", ["command line", "spark conf", "TOML file"])
def test_source_and_resources_in_one_layer_are_refused(tmp_path: Path, layer: str) -> None:
    argv, conf, toml = ["--group", "g"], {}, None
    if layer == "command line":
        argv += ["--source", "s3://b/p/", "--resources", "a"]
    elif layer == "spark conf":
        conf = {f"{CONF}source": "s3://b/p/", f"{CONF}resources": "a"}
    else:
        toml = _toml(tmp_path, 'source = "s3://b/p/"\nresources = ["a"]\n')
    with pytest.raises(ConfigurationError, match=f"{layer}.* gives both source and resources"):
        _resolve(argv, conf, toml)


def test_job_config_checks_itself() -> None:
    member = MemberConfig(group="g", backend=SQLITE)
    with pytest.raises(ConfigurationError, match="both given"):
        JobConfig(member=member, source="s3://b/p/", resources=("a",))
    with pytest.raises(ConfigurationError, match="'data/landing' is not a URL"):
        JobConfig(member=member, source="data/landing")
    with pytest.raises(ConfigurationError, match="did you mean 'parquet'"):
        JobConfig(member=member, format="parket")
    with pytest.raises(ConfigurationError, match="'a' more than once"):
        JobConfig(member=member, resources=("a", "b", "a"))
    with pytest.raises(ConfigurationError, match="empty entry"):
        JobConfig(member=member, resources=("a", ""))
    with pytest.raises(ConfigurationError, match="whole number of 1 or more"):
        JobConfig(member=member, max_files_per_batch=0)
    with pytest.raises(ConfigurationError, match="poll_interval = 0 s is out of range"):
        JobConfig(member=member, poll_interval=0)
    with pytest.raises(ConfigurationError, match="schema = ' ' is not a non-empty string"):
        JobConfig(member=member, schema=" ")
    as_text: dict[str, Any] = {"resources": "a,b", "format": " JSON ", "poll_interval": "250ms"}
    job = JobConfig(member=member, **as_text)  # strings, as the command line gives them
    assert (job.resources, job.format, job.poll_interval) == (("a", "b"), "json", 0.25)
    with pytest.raises(AttributeError):
        job.format = "csv"  # type: ignore[misc]


def test_value_errors_name_the_layer_the_value_came_from(tmp_path: Path) -> None:
    toml = _toml(tmp_path, 'group = "g"\nheartbeat-interval = "9s"\n')
    with pytest.raises(ConfigurationError, match="heartbeat_interval from TOML file") as caught:
        _resolve([], {f"{CONF}session-timeout": "10s"}, toml)
    assert "session_timeout from spark conf" in str(caught.value)
    with pytest.raises(ConfigurationError, match="max_files_per_batch from command line"):
        _resolve(["--group", "g", "--max-files-per-batch", "many"])
    with pytest.raises(ConfigurationError, match="no group is given"):
        _resolve([])


# --- unknown keys, in every layer ---------------------------------------------------------------


def test_unknown_command_line_option_exits_2_with_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_command_line(["--group", "g", "--sesion-timeout", "2s"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --sesion-timeout (did you mean --session-timeout?) 2s" in err


def test_abbreviated_and_malformed_command_line_options_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["--gro", "g"], ["--read-option", "header"], ["--read-option", "=x"]):
        with pytest.raises(SystemExit) as caught:
            parse_command_line(argv)
        assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "--read-option 'header' is not KEY=VALUE" in err
    assert "reader option name ''" in err


def test_unknown_spark_conf_key_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigurationError) as caught:
        spark_conf_options([("spark.app.name", "x"), (f"{CONF}sesion-timeout", "2s")])
    message = str(caught.value)
    assert message.startswith("unknown spark conf key spark.rebalancer.sesion-timeout")
    assert "did you mean spark.rebalancer.session-timeout?" in message
    with pytest.raises(ConfigurationError, match=r"reader options \(.*spark.rebalancer.read.KEY"):
        spark_conf_options([(f"{CONF}read_option", "x")])


def test_spark_conf_keeps_only_its_prefix_and_refuses_doubles() -> None:
    pairs = [
        ("spark.master", "local[2]"),
        (f"{CONF}group", "g"),
        (f"{CONF}max-files-per-batch", "5"),
        (f"{CONF}read.inferSchema", "true"),
        ("spark.rebalancerx.group", "ignored"),
    ]
    assert spark_conf_options(pairs) == {
        "group": "g",
        "max_files_per_batch": "5",
        "read_options": {"inferSchema": "true"},
    }
    with pytest.raises(ConfigurationError, match="given twice"):
        spark_conf_options([(f"{CONF}session-timeout", "1"), (f"{CONF}session_timeout", "2")])
    with pytest.raises(ConfigurationError, match="given twice"):
        spark_conf_options([(f"{CONF}read.header", "true"), (f"{CONF}read.Header", "false")])


def test_unknown_toml_key_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'group = "g"\nsesion-timeout = "2s"\n')
    with pytest.raises(ConfigurationError) as caught:
        load_toml(path)
    message = str(caught.value)
    assert message.startswith(f"unknown TOML file {path} key 'sesion-timeout'")
    assert "did you mean session-timeout?" in message
    with pytest.raises(ConfigurationError, match="cannot name another"):
        load_toml(_toml(tmp_path, 'config = "other.toml"\n', "nested.toml"))


@pytest.mark.parametrize(
    ("layer", "start"),
    [
        ("command line", "unknown command line option --sesion-timeout"),
        ("spark conf", "unknown spark conf key spark.rebalancer.sesion-timeout"),
    ],
)
def test_resolve_checks_the_keys_of_the_mappings_it_is_given(layer: str, start: str) -> None:
    bad = {"sesion-timeout": "2s", "group": "g"}
    cli, conf = (bad, {}) if layer == "command line" else ({}, bad)
    with pytest.raises(ConfigurationError, match=re.escape(start)):
        resolve(cli, conf, default_backend=SQLITE)


# --- the TOML file ------------------------------------------------------------------------------


def test_missing_explicit_toml_file_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match="named by --config on the command line"):
        _resolve(["--group", "g", "--config", "nope.toml"])
    with pytest.raises(
        ConfigurationError, match=r"named by spark conf key spark\.rebalancer\.config"
    ):
        _resolve(["--group", "g"], {f"{CONF}config": "nope.toml"})
    with pytest.raises(ConfigurationError, match="named by the job's default TOML file"):
        _resolve(["--group", "g"], toml_path="nope.toml")
    with pytest.raises(ConfigurationError, match=r"does not exist \(looked for /"):
        load_toml("nope.toml")
    _toml(tmp_path, "group = \n", "conf/rebalancer.toml")  # a broken default file is an error
    with pytest.raises(
        ConfigurationError, match=re.escape("named by the default, conf/rebalancer.toml")
    ):
        _resolve(["--group", "g"])
    with pytest.raises(ConfigurationError, match="is a directory"):
        load_toml(str(tmp_path))


def test_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'group = "g"\n\nsession-timeout = 10s\n')
    with pytest.raises(ConfigurationError, match=r"is not valid TOML: .*line 3") as caught:
        load_toml(path)
    assert path in str(caught.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('group = ["a", "b"]', "key 'group' is an array, but group takes a string"),
        ("backend = 3", "key 'backend' is an integer, but backend takes a string"),
        ("session-timeout = true", "key 'session-timeout' is a boolean, but session_timeout"),
        ("max-files-per-batch = 1.5", "is a float, but max_files_per_batch takes a whole"),
        ("resources = [1, 2]", "is an array holding an integer, but resources takes an array"),
        ("source = 2026-01-01", "is a date or time"),
        ("read = 1", "key 'read' is an integer: reader options go in a table"),
        ("[read]\nheader = [1]", "key 'read.header' is an array: reader options are"),
        ("[group]\nx = 1", "key 'group' is a table"),
        ('read.header = "x"\nread.Header = "y"', "reader option Header is given twice"),
        ('group = "a"\n"group" = "b"', "Cannot overwrite a value"),
        ('session-timeout = "1s"\nsession_timeout = "2s"', "option session_timeout is given"),
    ],
)
def test_toml_values_of_the_wrong_type_are_refused(
    tmp_path: Path, text: str, expected: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        load_toml(_toml(tmp_path, text + "\n"))


def test_toml_values_become_what_the_other_layers_give(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        'group = "g"\nsession-timeout = 2.5\nresources = ["a", "b"]\nmax_files_per_batch = 3\n'
        "[read]\nheader = true\nsamplingRatio = 0.1\n",
    )
    assert load_toml(path) == {
        "group": "g",
        "session_timeout": 2.5,
        "resources": ("a", "b"),
        "max_files_per_batch": 3,
        "read_options": {"header": "true", "samplingRatio": "0.1"},
    }


# --- secrets ------------------------------------------------------------------------------------


def _everything_shown(password: str, tmp_path: Path) -> list[str]:
    """What a user or a log sees of a job whose backend URL holds ``password``."""
    url = f"redis://user:{quote(password, safe='')}@redis-host:6379/0"
    seen: list[str] = []
    job = _resolve(
        ["--group", "g", "--backend", url, "--source", f"rabbitmq://u:{quote(password)}@mq/"],
        {f"{CONF}read.password": password},
    )
    seen += [job.describe(), repr(job), repr(job.member)]
    failing = [
        (["--group", "g", "--backend", url, "--session-timeout", "0.1s"], {}),
        (["--group", "g"], {f"{CONF}backend": url, f"{CONF}heartbeat-interval": "99s"}),
        (["--group", "g", "--backend", url.replace("redis-host", "bad host")], {}),
        (["--group", "g", "--backend", url, "--source", url, "--resources", "a"], {}),
        (["--group", "g", "--source", url.replace("://", ":")], {}),
    ]
    for argv, conf in failing:
        with pytest.raises(ConfigurationError) as caught:
            _resolve(argv, conf)
        seen.append(str(caught.value))
    toml = _toml(tmp_path, f"backend = [{url!r}]\n", "secret.toml")
    with pytest.raises(ConfigurationError) as caught:
        load_toml(toml)
    seen.append(str(caught.value).replace(toml, "PATH"))
    return seen


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(password=st.text(st.characters(codec="utf-8"), min_size=1, max_size=30))
def test_passwords_never_show_in_descriptions_or_errors(password: str, tmp_path: Path) -> None:
    assume("'" not in password)  # the TOML literal string above is written with repr()
    reference = _everything_shown("Reference", tmp_path)
    assume(not any(password in text or quote(password) in text for text in reference))
    seen = _everything_shown(password, tmp_path)
    assert seen == reference  # nothing a user sees depends on the password


def test_passwords_in_unknown_command_line_arguments_are_hidden(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_command_line(["--group", "g", "--backnd", "redis://:hunter2-secret@h:6379/0"])
    err = capsys.readouterr().err
    assert "hunter2" not in err
    assert "--backnd (did you mean --backend?) redis://:***@h:6379/0" in err


# --- help and the example files -----------------------------------------------------------------


def test_help_exits_0_and_mentions_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_command_line(["--help"])
    assert caught.value.code == 0
    assert capsys.readouterr().out == build_parser().format_help()
    text = " ".join(build_parser("ingest_files.py").format_help().split())
    assert text.startswith("usage: ingest_files.py")
    for name in (*OPTION_KEYS, "config", "read_option"):
        assert f"--{name.replace('_', '-')} " in text, name
    for section in ("group membership:", "source and output:", "timing:"):
        assert section in text
    assert "(default: 10s)" in text and "(default: cooperative)" in text
    assert "spark.rebalancer.NAME" in text


def test_describe_shows_values_and_origins() -> None:
    job = _resolve(
        ["--group", "orders", "--resources", ",".join(f"r{i}" for i in range(12))],
        {f"{CONF}session-timeout": "5s", f"{CONF}read.token": "abc"},
    )
    text = job.describe()
    lines = text.splitlines()
    assert lines[0] == "rebalancer job options (no TOML file):" or lines[0].startswith(
        "rebalancer job options (TOML file"
    )
    assert re.search(r"\n {4}group +command line +orders\n", text)
    assert re.search(r"\n {4}session_timeout +spark conf +5s\n", text)
    assert re.search(r"heartbeat_interval +default +1s \(session_timeout / 5\)\n", text)
    assert "r9, ... (12 in all)" in text
    assert re.search(r"read\.token +spark conf +\*\*\*$", text)
    assert "abc" not in text and "abc" not in repr(job)


def test_the_example_toml_file_loads_and_resolves() -> None:
    path = CONF_DIR / "rebalancer.example.toml"
    text = path.read_text(encoding="utf-8")
    for name in OPTION_KEYS:  # every option is shown, set or commented out
        assert re.search(rf"^#? ?{name.replace('_', '-')} = ", text, re.M), name
    job = _resolve([], toml_path=str(path))
    assert job.member.group == "orders"
    assert job.source == "file:///data/landing/orders/"
    assert dict(job.read_options)["header"] == "true"
    in_file = load_toml(str(path))
    assert {job.origins[k] for k in in_file if k != "read_options"} == {f"TOML file {path}"}
    assert job.origins["member_id"] == "default"
    overridden = _resolve(
        ["--group", "other", "--backend", SQLITE, "--member-id", "m-1", "--rejoin-grace", "5s"],
        toml_path=str(path),
    )
    assert (overridden.member.group, overridden.member.rejoin_grace) == ("other", 5.0)


def test_the_spark_defaults_example_holds_every_option_and_only_known_keys() -> None:
    path = CONF_DIR / "spark-defaults.conf.example"
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"#\s*(spark\.rebalancer\.[a-z][\w.-]*)\s+(.+)", line)
        if match:
            pairs.append((match[1], match[2].strip()))
    given = spark_conf_options(pairs)  # refuses any unknown key
    assert set(given) == {*OPTION_KEYS, "config", "read_options"}
    usable = {k: v for k, v in given.items() if k not in ("resources", "config")}
    job = resolve({}, usable, default_backend=SQLITE)
    assert job.member.group == "orders"
    assert all(job.origins[k] == "spark conf" for k in usable if k != "read_options")


def test_metrics_port_and_log_format_from_every_layer(tmp_path: Path) -> None:
    job = _resolve(["--group", "g", "--metrics-port", "9464", "--log-format", "JSON"])
    assert (job.member.metrics_port, job.log_format) == (9464, "json")
    toml = _toml(tmp_path, 'group = "g"\nmetrics-port = 9100\nlog-format = "text"\n')
    from_toml = _resolve([], toml_path=toml)
    assert (from_toml.member.metrics_port, from_toml.log_format) == (9100, "text")
    assert _resolve(["--group", "g"]).member.metrics_port == 0
    with pytest.raises(ConfigurationError, match="log_format = 'xml' is not a log format"):
        _resolve(["--group", "g"], {f"{CONF}log-format": "xml"})
    with pytest.raises(ConfigurationError, match="metrics_port = '70000' is not a TCP port"):
        _resolve(["--group", "g", "--metrics-port", "70000"])


# -- multi-host safety ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "master", ["spark://10.0.0.1:7077", "yarn", "k8s://https://api:6443", "mesos://m:5050"]
)
def test_a_multi_host_master_without_backend_is_refused_naming_the_fix(master: str) -> None:
    from rebalancer_spark.spark.session import require_shared_store

    job = resolve({"group": "g"}, {}, default_backend="sqlite:///home/u/.state/groups.db")
    with pytest.raises(ConfigurationError) as refused:
        require_shared_store(job, master)
    message = str(refused.value)
    assert f"no --backend given on Spark master {master!r}" in message
    for fix in ("--backend zookeeper://", "--backend redis://", "--backend sqlite:///"):
        assert fix in message
    assert "sqlite:///home/u/.state/groups.db" in message


@pytest.mark.parametrize(
    "master", ["local", "local[*]", "local[2]", "local[2,3]", "local-cluster[2,1,1024]"]
)
def test_a_single_host_master_keeps_the_default_store(master: str) -> None:
    from rebalancer_spark.spark.session import require_shared_store

    job = resolve({"group": "g"}, {}, default_backend=SQLITE)
    require_shared_store(job, master)


@pytest.mark.parametrize(
    ("layer", "backend"),
    [
        ("command line", "zookeeper://zk1:2181/rebalancer"),
        ("spark conf", "redis://h:6379/0"),
        ("command line", SQLITE),  # a host-local store, asked for explicitly
    ],
)
def test_an_explicit_backend_is_taken_on_a_multi_host_master(
    layer: str, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    from rebalancer_spark.spark.session import require_shared_store

    cli: dict[str, object] = {"group": "g"}
    conf: dict[str, object] = {}
    (cli if layer == "command line" else conf)["backend"] = backend
    job = resolve(cli, conf, default_backend="sqlite:///elsewhere/groups.db")
    with caplog.at_level("WARNING", logger="rebalancer_spark.spark"):
        require_shared_store(job, "yarn")
    warned = [r.getMessage() for r in caplog.records]
    if backend.startswith("sqlite"):
        assert any("host-local store" in w and "only drivers on this host" in w for w in warned)
    else:
        assert warned == []
