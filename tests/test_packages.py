"""The pinned Spark jars: where they are looked for, what a missing or stale cache says, and the
conf and spark-submit arguments built from them (no Spark started: the fetch ran in the set-up)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.spark import packages

pytestmark = pytest.mark.spark_smoke  # also run on the newest Spark/Delta pair

_KEY = {"packages": list(packages.PACKAGES), "excludes": list(packages.EXCLUDES)}


def test_the_pins_follow_the_installed_spark() -> None:
    import pyspark

    line = ".".join(pyspark.__version__.split(".")[:2])
    assert packages.spark_line() == line
    assert packages.DELTA_FOR_SPARK[line] == packages.DELTA_SPARK, "Delta must match Spark"
    hadoop = sorted(Path(pyspark.__file__).parent.glob("jars/hadoop-client-api-*.jar"))
    assert len(hadoop) == 1
    version = hadoop[0].name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    assert f"org.apache.hadoop:hadoop-aws:{version}" == packages.HADOOP_AWS
    assert f"rebalancer-spark-jars-spark{line}.json" == packages.MANIFEST
    if line == packages.LOWEST_SPARK:  # the pair pinned in CI
        assert packages.DELTA_SPARK == "io.delta:delta-spark_2.13:4.0.0"
        assert packages.HADOOP_AWS.endswith(":3.4.1")


def test_an_empty_cache_says_what_is_missing_and_what_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(packages.IVY_DIR_ENV, str(tmp_path / "ivy"))
    assert packages.ivy_dir() == tmp_path / "ivy"
    assert not packages.jars_present()
    with pytest.raises(ConfigurationError) as caught:
        packages.spark_conf()
    message = str(caught.value)
    for part in (packages.DELTA_SPARK, packages.HADOOP_AWS, str(tmp_path / "ivy"), "setup.sh"):
        assert part in message


def test_a_manifest_of_other_packages_or_with_a_lost_jar_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(packages.IVY_DIR_ENV, str(tmp_path))
    jar = tmp_path / "a.jar"
    jar.write_bytes(b"PK")
    manifest = tmp_path / packages.MANIFEST
    manifest.write_text(json.dumps({**_KEY, "jars": [str(jar)]}))
    assert packages.jar_paths() == [jar]
    manifest.write_text(
        json.dumps({"packages": ["io.delta:delta-spark_2.13:3.2.0"], "jars": [str(jar)]})
    )
    assert not packages.jars_present()
    manifest.write_text(json.dumps({**_KEY, "jars": [str(jar), "/x.jar"]}))
    assert not packages.jars_present()


def test_the_conf_and_the_command_line_give_the_jars_by_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(packages.IVY_DIR_ENV, str(tmp_path))
    jars = [tmp_path / "a.jar", tmp_path / "b.jar"]
    for jar in jars:
        jar.write_bytes(b"PK")
    (tmp_path / packages.MANIFEST).write_text(json.dumps({**_KEY, "jars": [str(j) for j in jars]}))
    assert packages.spark_conf() == {
        "spark.jars": f"{jars[0]},{jars[1]}",
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }
    command = packages.spark_submit_command(
        "job.py", "--group", "g", master="local[2]", conf={"spark.ui.enabled": "false"}
    )
    assert Path(command[0]).name == "spark-submit"
    assert command[1:] == [
        "--master", "local[2]", "--jars", f"{jars[0]},{jars[1]}",
        "--conf", "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
        "--conf", "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "--conf", "spark.ui.enabled=false", "job.py", "--group", "g",
    ]  # fmt: skip


def test_the_fetch_of_the_set_up_is_done_and_a_second_one_is_instant() -> None:
    # scripts/setup.sh fetched the jars into the default (or configured) cache
    assert packages.jars_present(), f"run scripts/setup.sh: no jars in {packages.ivy_dir()}"
    done = subprocess.run(
        [sys.executable, "-m", "rebalancer_spark.spark.packages", "fetch"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "already fetched" in done.stdout
    names = {Path(j).name for j in map(str, packages.jar_paths())}
    for coordinate in packages.PACKAGES:  # Ivy names a jar org_artifact-version.jar
        group, artifact, version = coordinate.split(":")
        assert f"{group}_{artifact}-{version}.jar" in names
