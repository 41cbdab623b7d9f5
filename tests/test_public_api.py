"""The package's public surface is small and pinned, and importing it needs no plug-in."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import rebalancer_spark

PUBLIC = [
    "BackendError",
    "BackendUnavailable",
    "ConfigurationError",
    "ControlConflict",
    "CorruptStateError",
    "EventKind",
    "FencedError",
    "Member",
    "MemberConfig",
    "MemberFailed",
    "MemberIdInUse",
    "MemberState",
    "OwnedResource",
    "OwnershipEvent",
    "ProtocolName",
    "RebalancerError",
    "Resource",
    "SessionExpired",
    "SourceError",
    "assigned_sources",
    "join",
]
SPARK_PUBLIC = [
    "AssignedSource",
    "Batch",
    "DeltaOutput",
    "JobConfig",
    "JobContext",
    "Output",
    "ParquetOutput",
    "RebalancerNode",
    "assigned_sources",
    "batches",
    "current_node",
    "job_main",
    "open_output",
    "start",
]
HEAVY = ["deltalake", "kazoo", "pandas", "pyarrow", "pyspark", "redis"]


def test_all_is_pinned_and_sorted() -> None:
    assert rebalancer_spark.__all__ == PUBLIC
    assert sorted(rebalancer_spark.__all__) == rebalancer_spark.__all__


def test_the_spark_facade_is_pinned_lazy_and_complete() -> None:
    import rebalancer_spark.spark as spark_glue

    assert spark_glue.__all__ == SPARK_PUBLIC == sorted(SPARK_PUBLIC)
    for name in SPARK_PUBLIC:
        assert getattr(spark_glue, name).__name__ == name
    script = (
        "import json, sys\n"
        "import rebalancer_spark.spark\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pyspark', 'deltalake'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [], "the façade imports its names lazily"


def test_every_public_name_is_importable() -> None:
    namespace: dict[str, object] = {}
    exec("from rebalancer_spark import *", namespace)  # noqa: S102 - a fixed string
    assert sorted(k for k in namespace if k != "__builtins__") == PUBLIC
    for name in PUBLIC:
        assert getattr(rebalancer_spark, name) is namespace[name], name


def test_the_errors_form_one_tree() -> None:
    errors = [getattr(rebalancer_spark, n) for n in PUBLIC if n.endswith(("Error", "Unavailable"))]
    extra = [
        rebalancer_spark.MemberIdInUse,
        rebalancer_spark.SessionExpired,
        rebalancer_spark.MemberFailed,
    ]
    for error in [*errors, *extra]:
        assert issubclass(error, rebalancer_spark.RebalancerError), error
    assert issubclass(rebalancer_spark.ConfigurationError, ValueError)


def test_importing_the_package_imports_no_plug_in_library() -> None:
    # They are installed here, so the check below would see them if they were imported.
    assert [m for m in HEAVY if importlib.util.find_spec(m) is None] == []
    script = (
        "import json, sys\n"
        "import rebalancer_spark\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [], f"imported by `import rebalancer_spark`: {done.stdout}"
