"""The package as a user installs it: the wheel and sdist that ``python -m build`` makes, a wheel
installed into a Python that already has a different supported pyspark (which it must keep),
and Python 3.10, which is refused with a clear message."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support.dist import ROOT, build_dist, run

OTHER_PYSPARK = "4.2.0"
"""A supported pyspark other than the one in .venv (scripts/constraints/spark-newest.txt)."""


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel and sdist built from this checkout."""
    out = tmp_path_factory.mktemp("dist")
    build_dist(out, tmp_path_factory.mktemp("src"))
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("rebalancer_spark-*-py3-none-any.whl")
    return wheel


@pytest.mark.slow
def test_the_wheel_and_sdist_hold_the_package_and_ranges_not_pins(dist: Path) -> None:
    wheel = _wheel(dist)
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = whl.read(meta).decode()
    assert "rebalancer_spark/py.typed" in names
    assert "rebalancer_spark/cli/__main__.py" in names
    assert not [n for n in names if n.startswith("tests/")]
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert "Requires-Python: >=3.11" in metadata
    assert any("pyspark<4.3,>=4.0.1" in r for r in requires), requires
    assert not [r for r in requires if "delta-spark" in r], "no code imports delta-spark"
    assert not [r for r in requires if "==" in r.split(";")[0]], "a pin: use a range"
    (sdist,) = dist.glob("rebalancer_spark-*.tar.gz")
    with tarfile.open(sdist) as tar:
        members = tar.getnames()
    top = members[0].split("/")[0]
    for path in ("pyproject.toml", "README.md", "src/rebalancer_spark/__init__.py"):
        assert f"{top}/{path}" in members


@pytest.mark.slow
def test_the_wheel_installs_beside_a_different_supported_pyspark_and_keeps_it(
    dist: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "cluster-python"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not this checkout
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # The cluster's Python: pyspark there first (from pip's cache after the set-up).
    run(python, "-m", "pip", "install", "-q", f"pyspark=={OTHER_PYSPARK}", env=env)
    run(python, "-m", "pip", "install", "-q", f"{_wheel(dist)}[spark]", env=env)
    shown = run(python, "-m", "pip", "show", "pyspark", env=env)
    assert f"Version: {OTHER_PYSPARK}" in shown, "installing the wheel replaced pyspark"
    assert "delta-spark" not in run(python, "-m", "pip", "list", env=env)
    helped = run(venv / "bin" / "rebalancer-spark", "--help", env=env)
    assert "status" in helped and "exit status" in helped
    line = run(
        python,
        "-c",
        "from rebalancer_spark.spark import packages; print(packages.DELTA_SPARK)",
        env=env,
        cwd=tmp_path,
    )
    assert line.strip() == "io.delta:delta-spark_4.2_2.13:4.4.0", "Delta follows the pyspark"


def _python310() -> str | None:
    found = shutil.which("python3.10")
    if found and subprocess.run([found, "-c", ""], check=False).returncode == 0:
        return found
    pyenv = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.10.*/bin/python3.10")))
    return pyenv[-1] if pyenv else None


def test_python_3_10_gets_a_clear_error_not_a_strenum_traceback(tmp_path: Path) -> None:
    python = _python310()
    if python is None:
        pytest.skip("no Python 3.10 on this machine")
    done = subprocess.run(
        [python, "-c", "import rebalancer_spark"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: rebalancer-spark needs Python 3.11 or newer"), last
