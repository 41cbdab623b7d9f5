"""The wall clock of a server process stepped on command, for chaos runs (``clockshift.c``).

Redis measures key expiry (the backend's leases) against its host's wall clock, so an NTP step
or a virtual machine resumed late changes when sessions end; ZooKeeper and SQLite use
monotonic clocks for leases (docs/operations.md, "Clocks"). :class:`ClockShift` starts a
process with a small ``LD_PRELOAD`` library that adds a shift, read from a file, to every
wall-clock reading of that process alone; :meth:`ClockShift.step` moves it. The library is
compiled once per source version with the machine's C compiler (``cc``, installed by
``scripts/setup.sh``) into the temporary directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["ClockShift", "library"]

SOURCE = Path(__file__).with_name("clockshift.c")


def library() -> Path | None:
    """The compiled library, built on first use; None when there is no C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    built = Path(tempfile.gettempdir()) / f"rebalancer-clockshift-{digest}.so"
    if not built.exists():
        partial = built.with_name(f"{built.name}.{os.getpid()}")
        subprocess.run(
            [compiler, "-O2", "-shared", "-fPIC", "-o", str(partial), str(SOURCE)],
            check=True,
            capture_output=True,
        )
        partial.replace(built)  # atomic: concurrent builders each rename a whole file
    return built


class ClockShift:
    """One process's wall-clock shift, kept in ``path`` (milliseconds, 0 at first)."""

    def __init__(self, path: Path, lib: Path) -> None:
        self.path = path
        self.lib = lib
        self.shift_ms = 0
        self._write()

    @classmethod
    def create(cls, path: Path) -> ClockShift | None:
        """A shift file at ``path``; None when the library cannot be built here."""
        lib = library()
        return None if lib is None else cls(path, lib)

    def env(self) -> dict[str, str]:
        """What to add to the process's environment."""
        return {"LD_PRELOAD": str(self.lib), "CLOCKSHIFT_FILE": str(self.path)}

    def step(self, ms: int) -> None:
        """Move the process's wall clock by ``ms`` (negative: back); seen within 20 ms."""
        self.shift_ms += ms
        self._write()

    def _write(self) -> None:
        partial = self.path.with_name(self.path.name + ".new")
        partial.write_text(f"{self.shift_ms}\n")
        partial.replace(self.path)
