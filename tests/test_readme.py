"""The README's Python examples are executed, so they stay true."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_the_readme_has_python_examples() -> None:
    assert BLOCKS, "README.md lost its Python examples"


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"REBALANCER_HOME": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "queue-" in done.stdout


CLI_LINES = [
    line.split("#")[0].strip()
    for line in README.read_text().splitlines()
    if line.startswith("rebalancer-spark ")
]


def test_the_readme_shows_cli_commands() -> None:
    assert len(CLI_LINES) >= 5, "README.md lost its operator commands"


@pytest.mark.parametrize("line", CLI_LINES)
def test_readme_cli_command_parses(line: str) -> None:
    from rebalancer_spark.cli import _parser

    args = _parser().parse_args(shlex.split(line)[1:])  # SystemExit(2) on a wrong command line
    assert callable(args.func)
