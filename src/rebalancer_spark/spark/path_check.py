"""A job's paths checked at start-up, before any session, store or table is touched.

:func:`check_job_paths` resolves ``--output``, ``--audit`` and a file ``--source`` on this host
(symlinks of local paths, the working directory, whether a bare name is a catalog table) and
applies the rules of :mod:`rebalancer_spark.core.locations`; a problem is a
:class:`ConfigurationError` with a one-line message, which the job frame turns into exit code 2.
Only a local audit directory is listed (an ``s3://`` audit prefix is not checked for foreign
files).
"""

from __future__ import annotations

import os
import re

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.locations import (
    Place,
    audit_directory_problem,
    layout_problem,
    normalise,
    source_location,
)
from rebalancer_spark.spark.job_config import JobConfig

__all__ = ["check_job_paths"]

_TABLE_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*){0,2}$")
"""What the outputs take for a catalog table name when no such local path exists."""


def check_job_paths(job: JobConfig) -> None:
    """Refuse overlapping output, audit and source locations, and an audit directory of other
    files; see the module docstring."""
    output = None if job.output is None else _table("--output", job.output)
    audit = None if job.audit is None else _table("--audit", job.audit)
    sources = []
    if job.source is not None:
        where = source_location(job.source, realpath=os.path.realpath)
        sources.append(Place("--source", job.source.split("?")[0], where))
    problem = layout_problem(output, audit, sources)
    if problem is None and audit is not None and audit.location is not None:
        problem = audit_directory_problem(audit, _entries(audit))
    if problem is not None:
        raise ConfigurationError(problem)


def _table(option: str, given: str) -> Place:
    if _TABLE_NAME.match(given) and not os.path.exists(given):
        return Place(option, given, None)  # a catalog table name: no path to compare
    return Place(option, given, normalise(given, realpath=os.path.realpath, cwd=os.getcwd()))


def _entries(audit: Place) -> list[str] | None:
    if audit.location is None or audit.location.scheme != "file":
        return None
    try:
        return os.listdir(audit.location.path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ConfigurationError(
            f"{audit.option} {audit.given} cannot be listed ({exc.strerror or exc}): make it "
            "readable by this job, or give another directory"
        ) from None
