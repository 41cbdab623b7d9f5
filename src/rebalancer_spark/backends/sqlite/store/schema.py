"""The tables of the database file, its schema version and boot id, and setting a file up.

:func:`is_ready` needs only a read transaction: opening a file that already holds this schema
version for this boot takes no write lock. :func:`initialise` runs in a write transaction and
refuses a file that holds tables of someone else, another schema version, or a damaged set of
tables. The boot id is kept per host (``boot_id:<host>`` in ``rebalancer_meta``): a host whose
last recorded boot is not the current one loses *its own* sessions (lease deadlines of another
boot mean nothing on this boot's clock); another host's sessions are never touched (the file
is one host's store: :mod:`.sessions` refuses a second host's join).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from rebalancer_spark.core.errors import CorruptStateError

__all__ = ["INDEXES", "SCHEMA", "SCHEMA_VERSION", "TABLES", "boot_id", "initialise", "is_ready"]

SCHEMA_VERSION = "6"

_TO_3 = [
    # 3: a session records the host that joined it (see host.py); a group has an identity
    # marker (see floors.py).
    "ALTER TABLE members ADD COLUMN host TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE groups ADD COLUMN incarnation TEXT",
    "UPDATE groups SET incarnation=lower(hex(randomblob(16))) WHERE incarnation IS NULL",
]

_TO_4 = [
    # 4: a target row keeps the generation that wrote it, and the group the generation since
    # which every change of its target is in such rows (see reads.member_view).
    "ALTER TABLE targets ADD COLUMN gen INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE groups ADD COLUMN target_since INTEGER NOT NULL DEFAULT 0",
]

_TO_5 = [
    # 5: each publication logs, per member, the ids it took away from that member
    # (target_away, created with the other tables), and the group the generations the log
    # covers (see coordinator.publish and reads.member_view).
    "ALTER TABLE groups ADD COLUMN away_since INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE groups ADD COLUMN away_upto INTEGER NOT NULL DEFAULT -1",
]

_TO_6 = [
    # 6: each change of the resource set logs its ids (resource_log, created with the other
    # tables), and the group the versions the log covers, after rlog_from up to rlog_upto
    # (see groups.update_resources and reads.resource_changes): nothing is logged yet. A
    # process of version 5 still writing changes the version without logging: rlog_upto
    # then falls behind and readers read the set whole.
    "ALTER TABLE groups ADD COLUMN rlog_from INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE groups ADD COLUMN rlog_upto INTEGER NOT NULL DEFAULT 0",
    "UPDATE groups SET rlog_from=resources_version, rlog_upto=resources_version",
]

_MIGRATIONS = {
    "1": [
        # 2: ownership rows keep the epoch chain (the last holder, how and when it ended).
        "ALTER TABLE ownership ADD COLUMN prev_member TEXT",
        "ALTER TABLE ownership ADD COLUMN prev_session TEXT",
        "ALTER TABLE ownership ADD COLUMN freed TEXT",
        "ALTER TABLE ownership ADD COLUMN freed_at REAL",
        *_TO_3,
        *_TO_4,
        *_TO_5,
        *_TO_6,
    ],
    "2": [*_TO_3, *_TO_4, *_TO_5, *_TO_6],
    "3": [*_TO_4, *_TO_5, *_TO_6],
    "4": [*_TO_5, *_TO_6],
    "5": _TO_6,
}
"""Statements that bring a file of an older schema version to :data:`SCHEMA_VERSION`."""

INDEXES = {
    # A member's part, read whole and walked by every claim: covering, so that neither reads
    # a table row per resource (a claim's walk of 6,250 rows took 18 ms with an index of
    # (grp, member_id), 11 ms with this one).
    "targets_of_member": "targets(grp, member_id, resource_id)",
    # The rows given to a member by the generations after its last view (reads.member_view):
    # covering, and by member first, so that a view reads its own rows, not every moved one.
    "targets_given": "targets(grp, member_id, gen, resource_id)",
    # The away log's old generations, dropped by each publication (coordinator.publish).
    "target_away_by_gen": "target_away(grp, gen)",
    # A session's claims, read by every member view: covering (6,250 claims 4.7 -> 1.8 ms).
    "ownership_of_session": "ownership(session_id, grp, resource_id, epoch)",
}
"""The indexes, by name, that :func:`initialise` creates (once the tables are current, as
some are on columns a migration adds) and :func:`is_ready` requires: a file of this schema
version written before an index was added gains it the next time it is opened."""

_REPLACED_INDEXES = ("targets_by_member", "targets_by_gen", "ownership_by_session", "targets_since")
"""Indexes of earlier releases that :data:`INDEXES` replaced: dropped by :func:`initialise`.
A process of such a release that sets the file up again (after a reboot) creates them again,
which costs writes, not answers."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS rebalancer_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS groups(
    name TEXT PRIMARY KEY,
    coord_member TEXT, coord_session TEXT, coord_epoch INTEGER NOT NULL DEFAULT 0,
    generation INTEGER NOT NULL DEFAULT 0, target_epoch INTEGER NOT NULL DEFAULT 0,
    phase TEXT NOT NULL DEFAULT 'running', has_target INTEGER NOT NULL DEFAULT 0,
    target_resources_version INTEGER NOT NULL DEFAULT 0,
    resources_version INTEGER NOT NULL DEFAULT 0, change_seq INTEGER NOT NULL DEFAULT 0,
    incarnation TEXT, target_since INTEGER NOT NULL DEFAULT 0,
    away_since INTEGER NOT NULL DEFAULT 0, away_upto INTEGER NOT NULL DEFAULT -1,
    rlog_from INTEGER NOT NULL DEFAULT 0, rlog_upto INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS members(
    grp TEXT NOT NULL, member_id TEXT NOT NULL, session_id TEXT NOT NULL UNIQUE,
    info TEXT NOT NULL, expires REAL NOT NULL, acked INTEGER NOT NULL DEFAULT 0,
    leaving INTEGER NOT NULL DEFAULT 0, static INTEGER NOT NULL DEFAULT 0,
    host TEXT NOT NULL DEFAULT '', PRIMARY KEY(grp, member_id));
CREATE TABLE IF NOT EXISTS resources(
    grp TEXT NOT NULL, resource_id TEXT NOT NULL, weight REAL NOT NULL,
    PRIMARY KEY(grp, resource_id));
CREATE TABLE IF NOT EXISTS resource_log(
    grp TEXT NOT NULL, version INTEGER NOT NULL, resource_id TEXT NOT NULL, weight REAL,
    PRIMARY KEY(grp, version, resource_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS target_members(
    grp TEXT NOT NULL, member_id TEXT NOT NULL, PRIMARY KEY(grp, member_id));
CREATE TABLE IF NOT EXISTS targets(
    grp TEXT NOT NULL, resource_id TEXT NOT NULL, member_id TEXT NOT NULL,
    gen INTEGER NOT NULL DEFAULT 0, PRIMARY KEY(grp, resource_id));
CREATE TABLE IF NOT EXISTS target_away(
    grp TEXT NOT NULL, member_id TEXT NOT NULL, gen INTEGER NOT NULL, resource_id TEXT NOT NULL,
    PRIMARY KEY(grp, member_id, gen, resource_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ownership(
    grp TEXT NOT NULL, resource_id TEXT NOT NULL, member_id TEXT, session_id TEXT,
    epoch INTEGER NOT NULL, prev_member TEXT, prev_session TEXT, freed TEXT, freed_at REAL,
    PRIMARY KEY(grp, resource_id));
CREATE TABLE IF NOT EXISTS progress(
    grp TEXT NOT NULL, resource_id TEXT NOT NULL, epoch INTEGER NOT NULL,
    member_id TEXT NOT NULL, value TEXT NOT NULL, committed_at REAL NOT NULL,
    PRIMARY KEY(grp, resource_id));
CREATE TABLE IF NOT EXISTS control(
    grp TEXT PRIMARY KEY, version INTEGER NOT NULL, body TEXT NOT NULL);
"""

TABLES = frozenset(
    {
        "rebalancer_meta",
        "groups",
        "members",
        "resources",
        "resource_log",
        "target_members",
        "targets",
        "target_away",
        "ownership",
        "progress",
        "control",
    }
)
"""Every table :data:`SCHEMA` creates."""


def boot_id() -> str:
    """The id of this boot of the host (``"unknown"`` where the kernel does not tell)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _table_names(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _boot_key(host: str) -> str:
    return f"boot_id:{host}"


def is_ready(db: sqlite3.Connection, host: str) -> bool:
    """True if the file already holds this schema version for this boot of ``host``: then
    opening it takes no write lock (a member paused inside a write must not stop others
    opening)."""
    if not _table_names(db) >= TABLES:
        return False
    indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    if not indexes >= INDEXES.keys():
        return False
    meta = dict(db.execute("SELECT key, value FROM rebalancer_meta").fetchall())
    return meta.get("schema") == SCHEMA_VERSION and meta.get(_boot_key(host)) == boot_id()


def initialise(db: sqlite3.Connection, path: str, host: str) -> None:
    """Create the tables in the file at ``path`` (in a write transaction on ``db``), check its
    schema version, and end the sessions that ``host`` left from a previous boot."""
    names = _table_names(db)
    if names and "rebalancer_meta" not in names:
        raise CorruptStateError(
            f"SQLite database {path!r} already holds tables not written by "
            f"rebalancer-spark ({', '.join(sorted(names)[:5])}); it is left untouched: "
            "point --backend at another file"
        )
    for statement in SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    meta = dict(db.execute("SELECT key, value FROM rebalancer_meta").fetchall())
    version = meta.get("schema")
    if version in _MIGRATIONS:
        for statement in _MIGRATIONS[version]:
            db.execute(statement)
        db.execute("UPDATE rebalancer_meta SET value=? WHERE key='schema'", (SCHEMA_VERSION,))
        version = SCHEMA_VERSION
    if version in (None, SCHEMA_VERSION):
        for name, columns in INDEXES.items():
            db.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {columns}")
        for name in _REPLACED_INDEXES:
            db.execute(f"DROP INDEX IF EXISTS {name}")
    if version is None:
        db.execute("INSERT INTO rebalancer_meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
    elif version != SCHEMA_VERSION:
        raise CorruptStateError(
            f"SQLite database {path!r} has schema version {version!r}, this "
            f"library reads {SCHEMA_VERSION!r}: use the matching rebalancer-spark "
            "version or another file"
        )
    missing = TABLES - _table_names(db)
    if missing:
        raise CorruptStateError(
            f"SQLite database {path!r} lacks the tables {sorted(missing)}: it was "
            "damaged outside rebalancer-spark; move it away"
        )
    boot = boot_id()
    if meta.get(_boot_key(host)) != boot:
        _end_previous_boot(db, host)
        db.execute("INSERT OR REPLACE INTO rebalancer_meta VALUES (?, ?)", (_boot_key(host), boot))


def _end_previous_boot(db: sqlite3.Connection, host: str) -> None:
    """Lease deadlines of another boot of ``host`` are meaningless on this clock: its sessions
    (and those of files from before hosts were recorded, host ``''``) are dead. Another host's
    sessions are left alone."""
    # Their claims ended with that boot, at some time before now: now bounds it.
    db.execute(
        "UPDATE ownership SET prev_member=member_id, prev_session=session_id, "
        "freed='expired', freed_at=?, member_id=NULL, session_id=NULL WHERE session_id IN "
        "(SELECT session_id FROM members WHERE host IN (?, ''))",
        (time.time(), host),
    )
    db.execute(
        "UPDATE groups SET coord_member=NULL, coord_session=NULL WHERE coord_session IN "
        "(SELECT session_id FROM members WHERE host IN (?, ''))",
        (host,),
    )
    db.execute("DELETE FROM members WHERE host IN (?, '')", (host,))
