"""Durable job and directive state in SQLite (WAL), keyed by (job id, directive index), and
the attempts of each directive's transfer on transfer nodes (``[movers] executor = "dask"``)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple, Self, TypeVar

from bbstage.daemon import schema
from bbstage.modes import private_database
from bbstage.protocol import bounded, printable


class _Machine(StrEnum):
    """A kind of state, whose legal moves are in ``MOVES``; its values are what the database
    holds (the strings of every earlier version)."""

    def to(self, new: str, what: str = "") -> Self:
        """``new`` as a state of this kind, if ``self -> new`` is in ``MOVES``; else
        ``IllegalTransition`` (``what`` names the record in its message)."""
        kind = type(self)
        try:
            state = kind(new)
        except ValueError:
            raise IllegalTransition(kind, self, str(new), what) from None
        if state not in MOVES[kind][self]:
            raise IllegalTransition(kind, self, state, what)
        return state


class JobState(_Machine):
    """A job's state, in lifecycle order; its value is what the database holds."""

    SETUP = "setup"  # recorded, its scratch made (setup hook)
    STAGING_IN = "staging_in"
    STAGED_IN = "staged_in"
    RUNNING = "running"  # the job runs (pre_run hook); its in-job copies may run
    STAGING_OUT = "staging_out"
    STAGED_OUT = "staged_out"
    DONE = "done"  # torn down, its scratch removed
    FAILED = "failed"
    CANCELLED = "cancelled"  # torn down in a hurry (scancel) before its stage-out ended


class DirectiveState(_Machine):
    """The state of a directive's transfer (or an in-job copy's)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class AttemptState(_Machine):
    """The state of one attempt of a transfer on a transfer node (Dask)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"  # running when the daemon stopped


State = TypeVar("State", bound=_Machine)

# A directive not ended: waiting for its transfer, or moving.
UNFINISHED = (DirectiveState.PENDING, DirectiveState.RUNNING)

FINISHED = (JobState.DONE, JobState.FAILED, JobState.CANCELLED)
# The states a job record is made in: by setup (which starts staging in at once where
# data_in blocks, before 24.05), or made again after a lost state (``origin="recovered"``).
CREATED = (JobState.SETUP, JobState.STAGING_IN, JobState.RUNNING)


class Phase(NamedTuple):
    """A step of a job's lifecycle: the state it is ``entered`` in and the one it has
    ``reached`` at its end (the same for a step that is one state: setup, the run)."""

    name: str  # for a staging phase, the directive verb it moves (``stage_in``, ``stage_out``)
    entered: JobState
    reached: JobState


# The job's lifecycle, in order: written here once. ``MOVES[JobState]`` is derived from it
# (each state moves on to the next; the last phase, staging out, may be entered from any
# earlier state), and the engine's decisions read it (``bbstage/daemon/lifecycle.py``).
LIFECYCLE = (
    Phase("setup", JobState.SETUP, JobState.SETUP),
    Phase("stage_in", JobState.STAGING_IN, JobState.STAGED_IN),
    Phase("run", JobState.RUNNING, JobState.RUNNING),
    Phase("stage_out", JobState.STAGING_OUT, JobState.STAGED_OUT),
)
# The states a job passes through before its end, in order.
ORDER = tuple(dict.fromkeys(s for p in LIFECYCLE for s in (p.entered, p.reached)))
ACTIVE = ORDER
PHASES = {p.name: p for p in LIFECYCLE if p.entered != p.reached}  # the staging phases

_J, _D, _A = JobState, DirectiveState, AttemptState
_ENDS = frozenset((_J.DONE, _J.FAILED, _J.CANCELLED))  # a teardown's verdicts


def _job_moves() -> dict[JobState, frozenset[JobState]]:
    """The legal moves of a job, from ``LIFECYCLE``: each state on to the next; the last
    phase from any earlier state (Slurm runs data_out for a job whatever became of it, and
    the outputs in scratch are what the user wants); every state not ended to an end."""
    last = LIFECYCLE[-1].entered
    moves: dict[JobState, frozenset[JobState]] = {}
    for i, state in enumerate(ORDER):
        later = ORDER[i + 1 : i + 2] + ((last,) if i < ORDER.index(last) else ())
        moves[state] = frozenset(later) | _ENDS
    return moves | {
        _J.DONE: frozenset(),
        _J.FAILED: frozenset(),
        # Cancelled here, but Slurm kept waiting for its stage-in: bbstage.daemon.reconcile ends it.
        _J.CANCELLED: frozenset((_J.FAILED,)),
    }


# Every legal move; a state not a key, or a pair not listed, is refused by ``transition``.
MOVES: dict[type[_Machine], dict[Any, frozenset[Any]]] = {
    JobState: _job_moves(),
    DirectiveState: {
        _D.PENDING: frozenset((_D.RUNNING, _D.CANCELLED)),
        # running -> running: a new attempt (a transient failure, a resume after a restart).
        _D.RUNNING: frozenset((_D.RUNNING, _D.DONE, _D.FAILED, _D.CANCELLED)),
        _D.DONE: frozenset(),
        _D.FAILED: frozenset(),
        _D.CANCELLED: frozenset(),
    },
    AttemptState: {
        _A.RUNNING: frozenset((_A.DONE, _A.FAILED, _A.CANCELLED, _A.LOST)),
        _A.DONE: frozenset(),
        _A.FAILED: frozenset(),
        _A.CANCELLED: frozenset(),
        _A.LOST: frozenset(),
    },
}


class IllegalTransition(Exception):
    """A state change the machine does not allow (``MOVES``): a bug in the daemon, never a
    user's mistake, so not a ``ValueError`` (which a hook answers as a refusal)."""

    def __init__(self, kind: type[_Machine], current: str, new: str, what: str = "") -> None:
        self.kind, self.current, self.new = kind, current, new
        where = f" ({what})" if what else ""
        super().__init__(f"illegal {kind.__name__} move {current} -> {new}{where}")


def transition(current: State, new: State | str, what: str = "") -> State:
    """The one way a state changes: ``new`` (a state of ``current``'s kind, or its value) if
    the move is legal (``MOVES``), else ``IllegalTransition``."""
    return current.to(new, what)


CHECKPOINT_EVERY = 1.0  # seconds
CACHE_JOBS = 10_000  # unfinished jobs kept in memory by Store.job (a bound, never reached)


@dataclass
class DirectiveRow:
    job_id: str
    idx: int
    line: int
    verb: str
    source: str
    destination: str
    spec: dict[str, Any]
    state: DirectiveState = DirectiveState.PENDING
    bytes_done: int = 0
    bytes_total: int = 0
    files_done: int = 0
    files_total: int = 0
    error: str = ""
    started: float | None = None
    finished: float | None = None
    files_skipped: int = 0  # FIFOs, sockets, devices in the source: never copied


@dataclass
class AttemptRow:
    """One run of a directive's transfer, or of one shard of it, on a transfer node."""

    id: str  # JOB:IDX.<hex12>, with /<shard> when the tree is split
    job_id: str
    idx: int
    shard: int
    shards: int
    node: str
    state: AttemptState
    bytes: int  # moved so far; a done attempt's: its manifest
    files: int
    error: str
    started: float
    ended: float | None


@dataclass
class JobRow:
    job_id: str
    uid: int | None
    gid: int | None
    pool: str | None
    size: int
    scratch: str | None
    state: JobState
    error: str
    created: float
    updated: float
    origin: str = "setup"  # "recovered": made again from a hook after the state was lost
    directives: list[DirectiveRow] = field(default_factory=list)


class Store:
    """A thread-safe handle on the state database.

    The daemon is its only writer (``daemon.lock``), so ``job`` answers from a copy of each
    unfinished job it has read or written; every write replaces that copy with a new row
    object (never changes one a caller holds). A finished job leaves the copies: the
    daemon's memory follows the jobs in flight, not the jobs it has seen."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        private_database(path)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        self._path = path
        self._reader: sqlite3.Connection | None = None  # jobs_of's own (read) connection
        self._read_lock = threading.Lock()
        self._cache: dict[str, JobRow] = {}
        try:
            schema.check(self._db, path)  # a newer bbstage's database: refused, unchanged
        except schema.NewerSchema:
            self._db.close()
            raise
        self._db.execute("PRAGMA journal_mode=WAL")
        private_database(path)  # -wal, -shm: SQLite gives them the database's mode
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=10000")
        schema.migrate(self._db, path)
        # Checkpoints (which fsync) run in a thread of their own, never inside a commit.
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._closed = threading.Event()
        self._checkpointer = threading.Thread(
            target=self._checkpoint, args=(path,), name="checkpoint", daemon=True
        )
        self._checkpointer.start()

    def _checkpoint(self, path: Path) -> None:
        """Copy committed pages from the WAL into the database, every ``CHECKPOINT_EVERY``."""
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA busy_timeout=10000")
        try:
            while not self._closed.wait(CHECKPOINT_EVERY):
                db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            db.close()

    @contextmanager
    def _tx(self, job_id: str | None) -> Iterator[sqlite3.Connection]:
        """One transaction on ``job_id`` (None: on no job's cached copy); its body also
        updates the cached copy, which is dropped if the transaction does not commit."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if job_id is not None:
                    self._cache.pop(job_id, None)
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _update(self, job_id: str, **values: Any) -> None:
        """Apply a change to the cached copy (inside ``_tx``, with the lock held)."""
        cached = self._cache.get(job_id)
        if cached is not None:
            self._cache[job_id] = replace(cached, **values)

    def close(self) -> None:
        self._closed.set()
        self._checkpointer.join()
        with self._read_lock:
            if self._reader is not None:
                self._reader.close()
        with self._lock:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()

    # -- jobs -------------------------------------------------------------------------------

    def create_job(
        self,
        job_id: str,
        *,
        uid: int | None,
        gid: int | None,
        pool: str | None,
        size: int,
        scratch: str | None,
        directives: list[dict[str, Any]],
        state: JobState = JobState.SETUP,
        origin: str = "setup",
    ) -> JobRow:
        """(Re)create a job and its directives, in one of the ``CREATED`` states; any earlier
        record of the job id is replaced."""
        if state not in CREATED:
            raise IllegalTransition(JobState, "(no record)", state, f"job {job_id}")
        state = JobState(state)
        now = time.time()
        rows = [
            DirectiveRow(job_id, d["index"], d["line"], d["verb"], d["source"], d["destination"], d)
            for d in directives
        ]
        job = JobRow(job_id, uid, gid, pool, size, scratch, state, "", now, now, origin, rows)
        with self._tx(job_id) as db:
            db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            db.execute(
                "INSERT INTO jobs (job_id, uid, gid, pool, size, scratch, state, error, created,"
                " updated, origin) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, uid, gid, pool, size, scratch, state, "", now, now, origin),
            )
            db.executemany(
                "INSERT INTO directives (job_id, idx, line, verb, source, destination, spec)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        job_id,
                        d.idx,
                        d.line,
                        d.verb,
                        _text(d.source),
                        _text(d.destination),
                        json.dumps(d.spec),
                    )
                    for d in rows
                ],
            )
            self._cache[job_id] = job
        return job

    def set_job(self, job_id: str, **values: Any) -> None:
        """Change a job's columns; a new ``state`` only by a legal move (``transition``,
        against the state in the database: else ``IllegalTransition`` and nothing changes)."""
        values = as_stored(values)
        values["updated"] = time.time()
        cols = ", ".join(f"{k} = ?" for k in values)
        with self._tx(job_id) as db:
            if "state" in values:
                row = db.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
                if row is not None:
                    what = f"job {job_id}"
                    values["state"] = transition(JobState(row[0]), values["state"], what)
            db.execute(f"UPDATE jobs SET {cols} WHERE job_id = ?", (*values.values(), job_id))
            if values.get("state") in FINISHED:
                self._cache.pop(job_id, None)
            else:
                self._update(job_id, **values)

    def job(self, job_id: str) -> JobRow | None:
        """The job and its directives (a row object shared with other callers: read only)."""
        with self._lock:
            job = self._cache.get(job_id)
            if job is not None:
                return job
            row = self._db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                return None
            job = _job(row)
            job.directives = [
                _directive(r)
                for r in self._db.execute(
                    "SELECT * FROM directives WHERE job_id = ? ORDER BY idx", (job_id,)
                )
            ]
            if job.state not in FINISHED:
                if len(self._cache) >= CACHE_JOBS:
                    self._cache.clear()
                self._cache[job_id] = job
        return job

    def jobs(
        self, states: tuple[str, ...] | None = None, updated_since: float | None = None
    ) -> list[JobRow]:
        """Jobs (oldest first), only those in ``states`` and last updated at or after
        ``updated_since`` if given: two queries in all (the reconciler asks every few seconds,
        and finished jobs stay for ``retention_days``)."""
        terms: list[str] = []
        args: tuple[Any, ...] = ()
        if states is not None:
            if not states:
                return []
            terms.append(f"state IN ({','.join('?' * len(states))})")
            args += tuple(states)
        if updated_since is not None:
            terms.append("updated >= ?")
            args += (updated_since,)
        where = f" WHERE {' AND '.join(terms)}" if terms else ""
        with self._lock:
            return _jobs(self._db, where, args)

    def jobs_of(self, uid: int | None) -> list[JobRow]:
        """``uid``'s jobs (every job for None), oldest first, for ``bbstage jobs``: through a
        connection of its own, in one read transaction, so a long list (every job kept for
        ``retention_days``) neither waits for the daemon's writes nor holds them up (WAL);
        call it in a thread."""
        where, args = (" WHERE uid = ?", (uid,)) if uid is not None else ("", ())
        with self._read_lock:
            if self._reader is None:
                self._reader = sqlite3.connect(
                    self._path, check_same_thread=False, isolation_level=None
                )
                self._reader.row_factory = sqlite3.Row
                self._reader.execute("PRAGMA busy_timeout=10000")
            self._reader.execute("BEGIN")
            try:
                return _jobs(self._reader, where, args)
            finally:
                self._reader.execute("COMMIT")

    def finished_before(
        self, cutoff: float, states: tuple[str, ...]
    ) -> list[tuple[str, str | None]]:
        """(job id, pool) of the jobs in ``states`` last updated before ``cutoff``."""
        marks = ",".join("?" * len(states))
        with self._lock:
            rows = self._db.execute(
                f"SELECT job_id, pool FROM jobs WHERE state IN ({marks}) AND updated < ?",
                (*states, cutoff),
            ).fetchall()
        return [(job_id, pool) for job_id, pool in rows]

    def counts(self) -> dict[str, int]:
        """Job state → number of jobs in it."""
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {state: int(n) for state, n in rows}

    def reserved(self) -> dict[str, int]:
        """Pool name → capacity held by jobs not yet finished."""
        marks = ",".join("?" * len(ACTIVE))
        with self._lock:
            rows = self._db.execute(
                "SELECT pool, SUM(size) FROM jobs WHERE pool IS NOT NULL"
                f" AND state IN ({marks}) GROUP BY pool",  # by the index on state
                ACTIVE,
            ).fetchall()
        return {pool: int(total) for pool, total in rows}

    def delete_job(self, job_id: str) -> None:
        with self._tx(job_id) as db:
            db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            self._cache.pop(job_id, None)

    # -- directives -------------------------------------------------------------------------

    def add_directive(self, job_id: str, spec: dict[str, Any], limit: int) -> DirectiveRow:
        """Add a directive decided at run time (an in-job copy, ``bbstage copy``) as the job's
        next index; ValueError if the job is gone or already has ``limit`` directives."""
        with self._tx(job_id) as db:
            row = db.execute(
                "SELECT COUNT(*), COALESCE(MAX(idx), -1) FROM directives WHERE job_id = ?",
                (job_id,),
            ).fetchone()
            if row[0] >= limit:
                raise ValueError(
                    f"job {job_id} has {row[0]} directives and copies, the most a job may have"
                )
            idx = int(row[1]) + 1
            spec = {**spec, "index": idx}
            d = DirectiveRow(job_id, idx, spec["line"], spec["verb"], spec["source"],
                             spec["destination"], spec)  # fmt: skip
            db.execute(
                "INSERT INTO directives (job_id, idx, line, verb, source, destination, spec)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (job_id, idx, d.line, d.verb, _text(d.source), _text(d.destination),
                 json.dumps(spec)),
            )  # fmt: skip
            cached = self._cache.get(job_id)
            if cached is not None:
                self._update(job_id, directives=[*cached.directives, d])
        return d

    def set_directive(self, job_id: str, idx: int, **values: Any) -> None:
        """Change a directive's columns; a new ``state`` only by a legal move (``set_job``)."""
        values = as_stored(values)
        cols = ", ".join(f"{k} = ?" for k in values)
        with self._tx(job_id) as db:
            if "state" in values:
                row = db.execute(
                    "SELECT state FROM directives WHERE job_id = ? AND idx = ?", (job_id, idx)
                ).fetchone()
                if row is not None:
                    what = f"job {job_id} directive {idx}"
                    values["state"] = transition(DirectiveState(row[0]), values["state"], what)
            db.execute(
                f"UPDATE directives SET {cols} WHERE job_id = ? AND idx = ?",
                (*values.values(), job_id, idx),
            )
            cached = self._cache.get(job_id)
            if cached is not None:
                rows = [replace(d, **values) if d.idx == idx else d for d in cached.directives]
                self._update(job_id, directives=rows)

    # -- attempts ---------------------------------------------------------------------------

    def add_attempt(self, job_id: str, idx: int, attempt: str, shard: int, shards: int) -> None:
        """Record an attempt as running (before it is handed to a transfer node)."""
        with self._tx(job_id) as db:
            db.execute(
                "INSERT INTO attempts (id, job_id, idx, shard, shards, started)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (attempt, job_id, idx, shard, shards, time.time()),
            )

    def attempt_progress(self, progress: list[tuple[str, str, int, int]]) -> None:
        """Save (attempt, node, bytes, files) of running attempts, in one transaction; an
        attempt that has ended keeps what its end recorded."""
        with self._tx(None) as db:
            db.executemany(
                "UPDATE attempts SET node = ?, bytes = ?, files = ?"
                " WHERE id = ? AND state = 'running'",
                [(_text(node), n, files, attempt) for attempt, node, n, files in progress],
            )

    def end_attempt(
        self, attempt: str, state: str, node: str, nbytes: int, files: int, error: str = ""
    ) -> None:
        """Record an attempt's end: ``state`` (done, failed, cancelled) and its last counts
        (``IllegalTransition`` if it has ended already)."""
        with self._tx(None) as db:
            row = db.execute("SELECT state FROM attempts WHERE id = ?", (attempt,)).fetchone()
            if row is None:
                return  # never recorded (its start could not be): nothing to end
            state = transition(AttemptState(row[0]), state, f"attempt {attempt}")
            db.execute(
                "UPDATE attempts SET state = ?, node = ?, bytes = ?, files = ?, error = ?,"
                " ended = ? WHERE id = ?",
                (state, _text(node), nbytes, files, bounded(error), time.time(), attempt),
            )

    def lose_attempts(self) -> list[str]:
        """Mark the attempts still ``running`` (the daemon stopped under them) ``lost``; their
        ids."""
        running, lost = AttemptState.RUNNING, transition(AttemptState.RUNNING, AttemptState.LOST)
        with self._tx(None) as db:
            ids = [r[0] for r in db.execute("SELECT id FROM attempts WHERE state = ?", (running,))]
            db.execute(
                "UPDATE attempts SET state = ?, ended = ? WHERE state = ?",
                (lost, time.time(), running),
            )
        return ids

    def attempts(self, job_id: str) -> list[AttemptRow]:
        """The job's attempts, by directive, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM attempts WHERE job_id = ? ORDER BY idx, started, id", (job_id,)
            ).fetchall()
        return [AttemptRow(**{**dict(r), "state": AttemptState(r["state"])}) for r in rows]

    def nodes(self) -> dict[str, list[str]]:
        """Job id → the transfer nodes its attempts ran on (jobs with none are left out)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT job_id, node FROM attempts WHERE node != '' ORDER BY job_id, node"
            ).fetchall()
        found: dict[str, list[str]] = {}
        for job_id, node in rows:
            found.setdefault(job_id, []).append(node)
        return found


def as_stored(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as a write stores them (``_text``): what a row read back holds."""
    return {k: _text(v, k) for k, v in values.items()}


def _text(value: Any, column: str = "") -> Any:
    """A value for a TEXT column: SQLite takes only UTF-8, and a path from a script may hold
    bytes that are not (surrogate escapes, docs/protocol.md "Bytes"). Those columns are for
    display and messages (a transfer's exact bytes are in ``spec``): such bytes, and control
    characters, become \\xNN (``printable``); an ``error`` is also bounded in length."""
    if not isinstance(value, str):
        return value
    return bounded(value) if column == "error" else printable(value)


def _jobs(db: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> list[JobRow]:
    """The jobs ``where`` selects, with their directives: two queries."""
    rows = db.execute(f"SELECT * FROM jobs{where} ORDER BY created", args)
    jobs = {r["job_id"]: _job(r) for r in rows}
    if jobs:
        for r in db.execute(
            "SELECT * FROM directives WHERE job_id IN"
            f" (SELECT job_id FROM jobs{where}) ORDER BY job_id, idx",
            args,
        ):
            if r["job_id"] in jobs:
                jobs[r["job_id"]].directives.append(_directive(r))
    return list(jobs.values())


def _job(row: sqlite3.Row) -> JobRow:
    """A job read from the database (without its directives)."""
    return JobRow(**{**dict(row), "state": JobState(row["state"])})


def _directive(row: sqlite3.Row) -> DirectiveRow:
    values = dict(row)
    values["spec"] = json.loads(values["spec"])
    values["state"] = DirectiveState(values["state"])
    return DirectiveRow(**values)
