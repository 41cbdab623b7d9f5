"""The package built as a user builds it (``python -m build``), for the packaging and
deployment tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "build_dist", "run"]

ROOT = Path(__file__).resolve().parents[2]


def run(*cmd: str | Path, timeout: float = 600, **kwargs: object) -> str:
    """Run ``cmd``; its standard output, or an assertion error with all it printed."""
    done = subprocess.run(
        [str(c) for c in cmd],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,  # type: ignore[call-overload]
    )
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return str(done.stdout)


def build_dist(out: Path, work: Path) -> Path:
    """The wheel and sdist of this checkout in ``out`` (setuptools from this venv: nothing
    downloaded), built from a copy in ``work``: setuptools writes build/ and *.egg-info next
    to the sources. Returns the wheel."""
    shutil.copytree(
        ROOT,
        work / "tree",
        ignore=shutil.ignore_patterns(".venv*", ".git", "*cache*", "build", "dist", "demo-output"),
    )
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, work / "tree")
    (wheel,) = out.glob("rebalancer_spark-*-py3-none-any.whl")
    return wheel
