"""The path rules of a job (core.locations, pure) and their start-up check (spark.path_check)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rebalancer_spark.core.config import MemberConfig
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.locations import (
    Location,
    Place,
    audit_directory_problem,
    layout_problem,
    normalise,
    source_location,
)
from rebalancer_spark.spark.job_config import JobConfig
from rebalancer_spark.spark.path_check import check_job_paths


def place(option: str, given: str) -> Place:
    if option == "--source":
        return Place(option, given, source_location(given))
    return Place(option, given, normalise(given, cwd="/work"))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("/lake/out/", Location("file", "/lake/out")),
        ("/lake/./x/../out//", Location("file", "/lake/out")),
        ("file:///lake/out", Location("file", "/lake/out")),
        ("file://localhost/lake/out/", Location("file", "/lake/out")),
        ("out", Location("file", "/work/out")),
        ("../lake", Location("file", "/lake")),
        ("s3://b/p/", Location("s3", "b/p")),
        ("s3a://b/p", Location("s3", "b/p")),
        ("S3N://b/x/../p//", Location("s3", "b/p")),
        ("s3://b", Location("s3", "b")),
        ("abfss://c@acct/p/", Location("abfss", "c@acct/p")),
    ],
)
def test_normalise(given: str, expected: Location) -> None:
    assert normalise(given, cwd="/work") == expected


def test_normalise_uses_the_given_realpath() -> None:
    links = {"/data/link/out": "/mnt/real/out"}
    assert normalise("/data/link/out/", realpath=lambda p: links.get(p, p)) == Location(
        "file", "/mnt/real/out"
    )


def test_source_location_drops_options_and_decodes_like_the_sources() -> None:
    assert source_location("file:///landing/a%20b/?weight=bytes") == Location(
        "file", "/landing/a b"
    )
    assert source_location("s3://bucket/raw/?endpoint_url=http://h:1") == Location(
        "s3", "bucket/raw"
    )
    assert source_location("rabbitmq://u:p@h/vh?queues=a") is None
    assert source_location("sqs://us-east-1/orders-") is None
    assert source_location("static://a,b") is None


def test_contains_is_by_segment_not_by_prefix() -> None:
    assert Location("file", "/lake").contains(Location("file", "/lake/a"))
    assert not Location("file", "/lake").contains(Location("file", "/lakes/a"))
    assert not Location("file", "/lake/a").contains(Location("file", "/lake"))
    assert not Location("s3", "b/lake").contains(Location("file", "/b/lake/x"))
    assert Location("file", "/").contains(Location("file", "/x"))


@pytest.mark.parametrize(
    ("output", "audit", "source", "words"),
    [
        ("/lake/a", "/lake/a/", None, "are the same location (/lake/a)"),
        ("s3a://b/t", "s3://b/t/", None, "are the same location (s3://b/t)"),
        ("/lake/a", "/lake/a/audit", None, "--audit lies inside --output"),
        ("/lake/a/out", "/lake/a", None, "--output lies inside --audit"),
        ("/landing/out", "/lake/audit", "file:///landing/", "--output lies inside --source"),
        ("/lake/out", "/landing/x/../audit", "file:///landing/", "--audit lies inside --source"),
        ("/lake", "/audit", "file:///lake/raw/", "--source lies inside --output"),
        ("s3a://b/raw/out", "/audit", "s3://b/raw/?region=x", "--output lies inside --source"),
    ],
)
def test_overlaps_are_refused_naming_both(
    output: str, audit: str, source: str | None, words: str
) -> None:
    sources = [] if source is None else [place("--source", source)]
    problem = layout_problem(place("--output", output), place("--audit", audit), sources)
    assert problem is not None
    assert words in problem
    assert "\n" not in problem
    given = {"--output": output, "--audit": audit, "--source": (source or "").split("?")[0]}
    named = [o for o in given if o in words] or ["--output", "--audit"]
    for option in named:  # both places, as given
        assert f"{option} {given[option]}" in problem


@pytest.mark.parametrize(
    ("output", "audit", "source"),
    [
        ("/lake/out", "/lake/audit", "file:///landing/"),
        ("/lake/out", "/lake/outs", None),  # a common name prefix is not nesting
        ("s3://b/out", "/lake/out", "s3://b/raw/"),  # another scheme
        ("s3://b/out", "s3://c/out", None),  # another bucket
    ],
)
def test_apart_places_pass(output: str, audit: str, source: str | None) -> None:
    sources = [] if source is None else [place("--source", source)]
    assert layout_problem(place("--output", output), place("--audit", audit), sources) is None


def test_catalog_names_and_queue_sources_are_not_compared() -> None:
    table = Place("--output", "bronze.orders", None)
    queue = Place("--source", "sqs://us-east-1/q", source_location("sqs://us-east-1/q"))
    assert layout_problem(table, place("--audit", "/lake/audit"), [queue]) is None
    assert layout_problem(None, None, [queue]) is None


def test_audit_directory_of_other_files() -> None:
    audit = place("--audit", "/lake/audit")
    assert audit_directory_problem(audit, None) is None  # not there: created
    assert audit_directory_problem(audit, []) is None  # empty
    assert audit_directory_problem(audit, ["_delta_log", "part-0.parquet"]) is None
    problem = audit_directory_problem(audit, ["notes.txt", "a.csv"])
    assert problem is not None
    assert "--audit /lake/audit" in problem and "a.csv, notes.txt" in problem
    assert "not a Delta table" in problem


# --- the start-up check, on this host's file system -------------------------------------


def job(**options: str) -> JobConfig:
    member = MemberConfig.from_mapping({"group": "g"}, default_backend="sqlite:///tmp/x.db")
    return JobConfig(member=member, **options)  # type: ignore[arg-type]


def test_check_job_paths_follows_symlinks(tmp_path: Path) -> None:
    (tmp_path / "landing").mkdir()
    os.symlink(tmp_path / "landing", tmp_path / "alias")
    with pytest.raises(ConfigurationError, match="--output lies inside --source"):
        check_job_paths(
            job(
                source=f"file://{tmp_path}/landing/",
                output=str(tmp_path / "alias" / "out"),
                audit=str(tmp_path / "audit"),
            )
        )


def test_check_job_paths_audit_among_other_files(tmp_path: Path) -> None:
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "report.csv").write_text("a\n")
    with pytest.raises(ConfigurationError, match=r"report\.csv"):
        check_job_paths(job(output=str(tmp_path / "out"), audit=str(audit)))
    (audit / "report.csv").unlink()
    check_job_paths(job(output=str(tmp_path / "out"), audit=str(audit)))  # empty: fine
    (audit / "_delta_log").mkdir()
    (audit / "part-0.parquet").write_text("")
    check_job_paths(job(output=str(tmp_path / "out"), audit=str(audit)))  # a Delta table


def test_check_job_paths_exempts_catalog_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    landing = f"file://{tmp_path}/landing/"
    check_job_paths(job(source=landing, output="bronze.orders", audit=str(tmp_path / "a")))
    (tmp_path / "orders").mkdir()  # a bare name that exists here is a path, compared
    with pytest.raises(ConfigurationError, match="same location"):
        check_job_paths(job(output="orders", audit=str(tmp_path / "orders")))
