"""``sqlite:///path/to/file.db``: the embedded backend. No server; the processes of one host
share a database file.

Use it for a handful of Spark jobs on one machine, for development, and as the reference
implementation of the contract in :mod:`rebalancer_spark.backends.base`.

How it keeps the contract:

* **Atomic checks.** Every write is one ``BEGIN IMMEDIATE`` transaction that re-reads what it
  depends on (coordinator epoch, claim epoch, lease) before changing anything. A claim first
  finds what it may grant in a snapshot, without the write lock; its write transaction then
  re-reads those rows alone, by key, so the lock is held for what is claimed, not for the
  member's whole part (a walk of thousands of rows that kept every release waiting).
* **Leases.** A lease deadline is ``CLOCK_BOOTTIME`` + ttl, a clock every process of the host
  shares and that never jumps. The boot id is kept in the file, per host: after a reboot every
  session of the host's previous boot is dead. The file is one host's store: a session records
  its host (:mod:`.host`), and a member of another host is refused at join.
  ``synchronous=FULL`` keeps epochs from going backwards across a power cut.
* **A paused writer stalls the file.** SQLite has one write lock per file. A member process
  paused *inside* a write transaction (SIGSTOP, a debugger) holds it until it resumes: other
  members can then neither renew nor claim, so they stop their work when their leases run out
  (safety holds: nobody can be granted anything while the file is locked) and rejoin once the
  paused process resumes. ``kill -9`` releases the lock at once. Where processes may be paused
  for long, use the ZooKeeper or Redis backend. Opening an initialised file takes no write lock.
* **Notifications.** There are none across processes in SQLite, so a :class:`SqliteWatch` polls
  ``PRAGMA data_version`` (a read of shared memory, no disk I/O) every ``poll`` seconds (default
  0.02), reads the group's change counter only when the file changed, and also wakes when the
  earliest lease of the group runs out. Lease renewals do not bump the change counter, so they
  wake nobody.

URL options: ``poll`` (seconds between change checks, default 0.02) and ``busy_timeout``
(seconds to wait for the write lock, default 10; it is tried again every 0.2 to 2 ms,
:func:`.store.connection.begin_write`).

The modules: :mod:`.backend` (:class:`SqliteBackend`: transactions and the protected methods
behind the shared front of :mod:`rebalancer_spark.backends.base`), :mod:`.url` (the URL grammar
and options, whether the file exists), :mod:`.connection` (opening the file, error
translation), :mod:`.schema` (tables, schema version, boot id), :mod:`.groups` (a group's row,
change counter and resource set),
:mod:`.sessions` (joins and leases), :mod:`.coordinator` (election and targets),
:mod:`.ownership` (claims and commits), :mod:`.reads` (snapshots) and :mod:`.watch`.
"""

from __future__ import annotations

from rebalancer_spark.backends.sqlite.backend import SqliteBackend
from rebalancer_spark.backends.sqlite.store.connection import OPTIONS
from rebalancer_spark.backends.sqlite.watch import SqliteWatch

__all__ = ["OPTIONS", "SqliteBackend", "SqliteWatch"]
