"""Spark's Delta and S3 jars: Maven coordinates matching the installed pyspark, fetched once
into a cache.

pyspark from PyPI carries neither Delta Lake's Spark classes nor hadoop-aws (``s3a://``). A
cluster provides them (``--packages`` or its own image); on a laptop, a build machine and in
the tests, ``scripts/setup.sh`` runs ``python -m rebalancer_spark.spark.packages fetch`` once,
which lets Spark's own Ivy resolve :data:`PACKAGES` into :func:`ivy_dir` and records the local
jar files in a manifest there (one per Spark line). Every Spark session and ``spark-submit`` of
the project then gets those jars by path (:func:`spark_conf`, :func:`spark_submit_args`): no
resolution, no network at start-up.

The coordinates follow the installed pyspark (:func:`spark_line`), read from its metadata and
its jars without importing it:

* Delta: :data:`DELTA_FOR_SPARK`, Delta's compatibility table (Delta 4.0 breaks on Spark 4.1;
  from Delta 4.1 on the artifact names its Spark line, ``delta-spark_4.2_2.13``);
* ``org.apache.hadoop:hadoop-aws`` at the Hadoop version inside that pyspark
  (``pyspark/jars/hadoop-client-api-X.jar``: another version does not load); it pulls the AWS
  SDK v2 bundle, ~550 MB.

===========  ==========================================  =================================
pyspark      Delta                                       hadoop-aws
===========  ==========================================  =================================
4.0.x        ``io.delta:delta-spark_2.13:4.0.0``         3.4.1 (lowest pair, pinned in CI)
4.1.x        ``io.delta:delta-spark_4.1_2.13:4.3.1``     pyspark's Hadoop (not run in CI)
4.2.0        ``io.delta:delta-spark_4.2_2.13:4.4.0``     pyspark's Hadoop (newest pair, CI
                                                         smoke subset)
===========  ==========================================  =================================

The cache is ``~/.cache/rebalancer-spark/ivy`` unless ``REBALANCER_SPARK_IVY_DIR`` names
another directory (keep it outside the work tree). This module needs only the standard
library; ``fetch`` starts ``spark-submit`` (no SparkContext: Ivy runs before the application).

::

    python -m rebalancer_spark.spark.packages fetch     # resolve once (fast when cached)
    python -m rebalancer_spark.spark.packages jars      # the local jar files, one a line
    python -m rebalancer_spark.spark.packages args      # spark-submit arguments, one a line
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from importlib.util import find_spec
from pathlib import Path

from rebalancer_spark.core.errors import ConfigurationError

__all__ = [
    "DELTA_CATALOG",
    "DELTA_EXTENSION",
    "DELTA_FOR_SPARK",
    "DELTA_SPARK",
    "EXCLUDES",
    "HADOOP_AWS",
    "IVY_DIR_ENV",
    "LOWEST_SPARK",
    "PACKAGES",
    "fetch",
    "ivy_dir",
    "jar_paths",
    "jars_present",
    "main",
    "spark_conf",
    "spark_line",
    "spark_submit_args",
    "spark_submit_command",
]

DELTA_FOR_SPARK = {
    "4.0": "io.delta:delta-spark_2.13:4.0.0",
    "4.1": "io.delta:delta-spark_4.1_2.13:4.3.1",
    "4.2": "io.delta:delta-spark_4.2_2.13:4.4.0",
}
"""Spark line (major.minor) -> the Delta Lake jar for it (Scala 2.13), after Delta's
compatibility table; each coordinate resolved from Maven Central here."""
LOWEST_SPARK = "4.0"
"""The line shown when pyspark is not installed, and pinned in CI (pyspark 4.0.1)."""
_HADOOP_OF_LOWEST = "3.4.1"


def spark_line() -> str | None:
    """The installed pyspark's ``major.minor`` (from its metadata, not imported), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return ".".join(version("pyspark").split(".")[:2])
    except PackageNotFoundError:
        return None


def _hadoop_version() -> str:
    """The Hadoop version inside the installed pyspark (its ``hadoop-client-api`` jar)."""
    spec = find_spec("pyspark")
    if spec is not None and spec.origin is not None:
        jars = sorted(Path(spec.origin).parent.glob("jars/hadoop-client-api-*.jar"))
        if jars:
            return jars[-1].name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    return _HADOOP_OF_LOWEST


_LINE = spark_line() or LOWEST_SPARK
DELTA_SPARK = DELTA_FOR_SPARK.get(_LINE, DELTA_FOR_SPARK[LOWEST_SPARK])
"""The Delta jar for the installed pyspark (the lowest line's when none is installed)."""
HADOOP_AWS = f"org.apache.hadoop:hadoop-aws:{_hadoop_version()}"
"""hadoop-aws at the installed pyspark's Hadoop version."""
PACKAGES = (DELTA_SPARK, HADOOP_AWS)
EXCLUDES = ("org.apache.hadoop:hadoop-client-api", "org.apache.hadoop:hadoop-client-runtime")
"""Left out of the resolution: pyspark carries its own Hadoop client (Delta 4.4 would bring an
older one onto the classpath)."""
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
IVY_DIR_ENV = "REBALANCER_SPARK_IVY_DIR"
MANIFEST = f"rebalancer-spark-jars-spark{_LINE}.json"
"""The manifest of the installed Spark line's jars (venvs of two lines share one cache)."""

# Run by spark-submit after Ivy resolved the packages: SparkSubmit put the local jar files into
# ``spark.jars``; the Py4J gateway is up, no SparkContext is started.
_RECORD = """\
import json, sys
from pyspark import SparkConf, SparkContext
SparkContext._ensure_initialized()
jars = [j for j in SparkConf().get("spark.jars", "").split(",") if j]
with open(sys.argv[1], "w") as out:
    json.dump(jars, out)
"""


def ivy_dir() -> Path:
    """Where Ivy keeps the fetched jars: ``$REBALANCER_SPARK_IVY_DIR`` or
    ``~/.cache/rebalancer-spark/ivy``."""
    configured = os.environ.get(IVY_DIR_ENV, "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "rebalancer-spark" / "ivy"


def _manifest() -> Path:
    return ivy_dir() / MANIFEST


def _recorded() -> list[Path] | None:
    """The jar files of the manifest when it is for :data:`PACKAGES` and every file exists."""
    try:
        data = json.loads(_manifest().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("packages") != list(PACKAGES):
        return None
    if data.get("excludes") != list(EXCLUDES):
        return None
    jars = [Path(str(j)) for j in data.get("jars", [])]
    if not jars or not all(j.is_file() for j in jars):
        return None
    return jars


def jars_present() -> bool:
    """Whether :func:`fetch` has run for the pinned :data:`PACKAGES` and the jars are there."""
    return _recorded() is not None


def jar_paths() -> list[Path]:
    """The local jar files of :data:`PACKAGES` (with their dependencies), as fetched.

    Raises :class:`ConfigurationError` naming the cache and the command to run when they are
    missing."""
    _require_known_line()
    jars = _recorded()
    if jars is None:
        raise ConfigurationError(
            f"Spark's Delta and S3 jars ({', '.join(PACKAGES)}) are not in {ivy_dir()} "
            f"(no valid {MANIFEST} there): run scripts/setup.sh, or "
            "python -m rebalancer_spark.spark.packages fetch "
            f"(set {IVY_DIR_ENV} to use another cache directory)"
        )
    return jars


def _require_known_line() -> None:
    if _LINE not in DELTA_FOR_SPARK:
        raise ConfigurationError(
            f"pyspark {_LINE} has no Delta Lake jar known to this rebalancer-spark (known Spark "
            f"lines: {', '.join(DELTA_FOR_SPARK)}): install a supported pyspark "
            "('pip install \"pyspark>=4.0.1,<4.3\"'), or give your cluster's own Delta jars "
            "(docs/deployment.md)"
        )


def spark_conf() -> dict[str, str]:
    """The Spark conf of a session with Delta and ``s3a://``: the fetched jars by path
    (``spark.jars``, resolved at no start-up) and Delta's SQL extension and catalog."""
    return {
        "spark.jars": ",".join(str(j) for j in jar_paths()),
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
    }


def spark_submit_args() -> list[str]:
    """The ``spark-submit`` arguments (before the application) giving :func:`spark_conf`."""
    args: list[str] = []
    for key, value in spark_conf().items():
        args += ["--jars", value] if key == "spark.jars" else ["--conf", f"{key}={value}"]
    return args


def spark_submit_command(
    app: str | os.PathLike[str],
    *app_args: str,
    master: str = "local[1]",
    conf: Mapping[str, str] | None = None,
) -> list[str]:
    """A whole ``spark-submit`` command line: the ``spark-submit`` of this Python's pyspark,
    ``--master``, the Delta and S3 jars (:func:`spark_submit_args`), ``--conf`` for each of
    ``conf``, then the application and its arguments. The one place tests, the demo and
    scripts build a spark-submit command."""
    command = [_spark_submit(), "--master", master, *spark_submit_args()]
    for key, value in (conf or {}).items():
        command += ["--conf", f"{key}={value}"]
    return [*command, os.fspath(app), *app_args]


def _spark_submit() -> str:
    beside = Path(sys.executable).parent / "spark-submit"
    if beside.is_file():
        return str(beside)
    spec = find_spec("pyspark")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "spark-submit"
        if bundled.is_file():
            return str(bundled)
    found = shutil.which("spark-submit")
    if found is None:
        raise ConfigurationError(
            "spark-submit was found neither beside this Python nor in pyspark nor on PATH: "
            "install pyspark (scripts/setup.sh does) and run this from its environment"
        )
    return found


def fetch(*, timeout: float = 1800.0) -> list[Path]:
    """Resolves :data:`PACKAGES` with Spark's Ivy into :func:`ivy_dir` once and records the
    local jar files; returns them at once when already fetched. Raises
    :class:`ConfigurationError` with the end of spark-submit's output when resolution fails."""
    _require_known_line()
    jars = _recorded()
    if jars is not None:
        return jars
    home = ivy_dir()
    home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rebalancer-jars-") as tmp:
        script, out = Path(tmp) / "record_jars.py", Path(tmp) / "jars.json"
        script.write_text(_RECORD)
        cmd = [
            _spark_submit(), "--master", "local[1]",
            "--conf", f"spark.jars.ivy={home}", "--packages", ",".join(PACKAGES),
            "--conf", f"spark.jars.excludes={','.join(EXCLUDES)}",
            str(script), str(out),
        ]  # fmt: skip
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        try:
            done = subprocess.run(
                cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env
            )
        except subprocess.TimeoutExpired:
            raise ConfigurationError(
                f"resolving {', '.join(PACKAGES)} into {home} took over {timeout:g} s: check "
                "the network to the Maven repository and run the fetch again"
            ) from None
        if done.returncode != 0 or not out.is_file():
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
            raise ConfigurationError(
                f"resolving {', '.join(PACKAGES)} into {home} failed (spark-submit exited with "
                f"{done.returncode}); check the network to the Maven repository, then run "
                f"python -m rebalancer_spark.spark.packages fetch again. Its output ends:\n{tail}"
            )
        found = [Path(j.removeprefix("file:")) for j in json.loads(out.read_text())]
    manifest = {"packages": list(PACKAGES), "excludes": list(EXCLUDES)}
    manifest["jars"] = [str(j) for j in found]
    staged = _manifest().with_suffix(".tmp")
    staged.write_text(json.dumps(manifest, indent=1) + "\n")
    staged.replace(_manifest())
    return jar_paths()


def main(argv: Sequence[str] | None = None) -> int:
    """``fetch`` | ``jars`` | ``args`` | ``dir``; see the module docstring."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if len(args) == 1 else ""
    try:
        if command == "fetch":
            cached = jars_present()
            started = time.monotonic()
            jars = fetch()
            size = sum(j.stat().st_size for j in jars) / 1e6
            how = "already fetched" if cached else f"fetched in {time.monotonic() - started:.1f} s"
            print(f"{len(jars)} jars ({size:.0f} MB) in {ivy_dir()}: {how}")
        elif command == "jars":
            print("\n".join(str(j) for j in jar_paths()))
        elif command == "args":
            print("\n".join(spark_submit_args()))
        elif command == "dir":
            print(ivy_dir())
        else:
            print(
                "usage: python -m rebalancer_spark.spark.packages fetch|jars|args|dir",
                file=sys.stderr,
            )
            return 2
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
