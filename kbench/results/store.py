"""The results store: one SQLite file (WAL) in the output folder, written as grading goes.

Every run and every submission's result is committed the moment it is known, so a kill at
any point loses at most the submission in flight; reports are rendered from here, `--resume`
finishes an interrupted run with its own seed, and unchanged files graded before on the same
device and software are reused. Several kbench processes may share one store.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from kbench.results import store_schema
from kbench.results.modes import DEFAULT_PROFILE, DEFAULT_RULES, DEFAULT_TIMING
from kbench.results.presence import Presence
from kbench.results.run_record import ProblemRun, RunResult, SubmissionResult
from kbench.results.verdict import Status

FILENAME = "kbench.sqlite3"
_BUSY_TIMEOUT_MS = 60_000
OPENING_LOCK = ".kbench-store.lock"


class StoreError(Exception):
    """The store cannot be used; the message names the file and what to do."""


@dataclass(frozen=True)
class RunInfo:
    """What ``--resume`` needs of an unfinished run."""

    id: int
    task_hash: str
    seed: int
    options: dict


def _sql(value: object) -> object:
    """An option's stored value as json_extract gives it back (true: 1, a list: its JSON)."""
    if isinstance(value, bool):
        return int(value)
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list | dict) else value


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Store:
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / FILENAME
        self._check_is_ours()
        self.presence = Presence(folder)  # other kbench processes see this one
        self._claims: dict[int, int] = {}  # run id -> descriptor of its lock, held here
        with self._opening():
            self.db = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_MS / 1000,
                                      isolation_level=None)
            try:
                self.db.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
                self.db.execute("PRAGMA journal_mode = WAL")
                with self._write():
                    self._create_or_upgrade()
            except sqlite3.DatabaseError as exc:
                self.db.close()
                raise StoreError(f"{self.path}: cannot use this results store ({exc})") from None

    @contextmanager
    def _opening(self) -> Iterator[None]:
        """Hold the store's opening lock (a BSD lock on a side file). SQLite answers "database
        is locked" at once, without waiting the busy timeout, when two processes switch a new
        store to WAL together (seen on CI); so kbench processes open their store one at a time,
        and close it so too, as the last connection out folds the log back into the file."""
        lock = self.path.with_name(OPENING_LOCK)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StoreError(f"{lock}: another process has held it for "
                                         f"{_BUSY_TIMEOUT_MS // 1000} s; is a kbench process "
                                         "stuck? (see `fuser` on it)") from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _create_or_upgrade(self) -> None:
        if self.db.execute("PRAGMA application_id").fetchone()[0] != store_schema.APPLICATION_ID:
            for statement in store_schema.TABLES.split(";"):
                self.db.execute(statement)
            self.db.execute(f"PRAGMA application_id = {store_schema.APPLICATION_ID}")
            self.db.execute(f"PRAGMA user_version = {store_schema.SCHEMA_VERSION}")
        elif self.db.execute("PRAGMA user_version").fetchone()[0] == 2:
            for statement in (store_schema.TABLES + ";" + store_schema.FROM_V2).split(";"):
                self.db.execute(statement)
            self.db.execute(f"PRAGMA user_version = {store_schema.SCHEMA_VERSION}")

    def _check_is_ours(self) -> None:
        """Refuse, without touching it, a file that is not an empty or kbench store."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        hint = "move it away, or grade with --out pointing elsewhere"
        try:
            probe = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
            try:
                app_id = probe.execute("PRAGMA application_id").fetchone()[0]
                version = probe.execute("PRAGMA user_version").fetchone()[0]
                tables = probe.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            finally:
                probe.close()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a kbench results store ({exc}); {hint}") from None
        if tables and app_id != store_schema.APPLICATION_ID:
            raise StoreError(f"{self.path}: an SQLite file that kbench did not write; {hint}")
        if app_id == store_schema.APPLICATION_ID and \
                version not in (2, store_schema.SCHEMA_VERSION):
            raise StoreError(f"{self.path}: written by a kbench with store version {version}, "
                             f"this one reads {store_schema.SCHEMA_VERSION}; {hint}")

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One transaction that takes the write lock up front (waits up to the busy timeout).
        Once committed, the write-ahead log is emptied where no reader holds it, so that what
        is committed lives in the store's file, which the file guard watches and can restore."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            with self._opening():
                self.db.close()
        finally:
            self.presence.close()
            for fd in self._claims.values():
                os.close(fd)
            self._claims.clear()

    def _run_lock(self, run_id: int) -> Path:
        return self.path.with_name(f".kbench-run-{run_id}.lock")

    def claim(self, run_id: int) -> None:
        """Mark run ``run_id`` as being graded by this process, until it exits (an exclusive
        lock the kernel drops even on kill -9); StoreError if another process has it, so
        two ``--resume`` of one run never grade the same submissions twice. A BSD lock
        (flock): a POSIX one would go whenever this process closed any descriptor of the file,
        as kbench.grading.building.guard's snapshot does when it reads the output folder."""
        if run_id in self._claims:
            return
        path = self._run_lock(run_id)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StoreError(f"run {run_id} in {self.path} is being graded by another kbench "
                             f"process (pid {holder}); wait for it to end, or grade anew "
                             "without --resume") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._claims[run_id] = fd

    def claimed(self, run_id: int) -> bool:
        """Is another process grading run ``run_id`` now?"""
        try:
            fd = os.open(self._run_lock(run_id), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)  # closing drops a lock this process took
        return False

    # -- runs --------------------------------------------------------------------------------

    def start_run(self, *, kbench_version: str, task: str, task_hash: str, seed: int,
                  device: str, fingerprint: str, options: dict, environment: dict) -> int:
        with self._write():
            cursor = self.db.execute(
                "INSERT INTO runs (started, kbench_version, task, task_hash, seed, device, "
                "fingerprint, options, environment) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (_now(), kbench_version, task, task_hash, seed, device, fingerprint,
                 json.dumps(options), json.dumps(environment)))
        return int(cursor.lastrowid)

    def unfinished_run(self, task: str) -> RunInfo | None:
        """The newest run of ``task`` that never finished (killed, or still going elsewhere)."""
        row = self.db.execute(
            "SELECT id, task_hash, seed, options FROM runs "
            "WHERE task = ? AND finished IS NULL ORDER BY id DESC LIMIT 1", (task,)).fetchone()
        return RunInfo(row[0], row[1], row[2], json.loads(row[3])) if row else None

    def set_problem(self, run_id: int, problem: ProblemRun) -> None:
        """A problem of the run as screened, or with its reference table (the latest wins)."""
        with self._write():
            self.db.execute("INSERT OR REPLACE INTO problems (run_id, name, digest, data) "
                            "VALUES (?, ?, ?, ?)", (run_id, problem.name, problem.digest,
                                                    json.dumps(problem.to_dict())))

    def finish_run(self, run_id: int) -> None:
        with self._write():
            self.db.execute("UPDATE runs SET finished = ? WHERE id = ?", (_now(), run_id))

    def latest_run_id(self) -> int | None:
        row = self.db.execute("SELECT max(id) FROM runs").fetchone()
        return row[0]

    # -- results -----------------------------------------------------------------------------

    def add_result(self, run_id: int, result: SubmissionResult) -> None:
        with self._write():
            self.db.execute(
                "INSERT OR REPLACE INTO results (run_id, name, problem, sha256, status, speedup, "
                "graded, reused_from, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, result.name, result.problem, result.sha256, result.status.value,
                 result.speedup, _now(), result.reused_from_run, json.dumps(result.to_dict())))

    def graded_names(self, run_id: int) -> set[str]:
        """Submissions of the run that need no grading again: all but those the machine could
        not grade (environment_error, infrastructure_error) or whose problem failed
        (task_error), which a resume on a mended machine, or with a mended problem, grades
        again."""
        rows = self.db.execute("SELECT name FROM results WHERE run_id = ? AND status NOT IN "
                               "(?, ?, ?)", (run_id, Status.ENVIRONMENT_ERROR.value,
                                             Status.INFRASTRUCTURE_ERROR.value,
                                             Status.TASK_ERROR.value))
        return {r[0] for r in rows}

    def add_notes(self, run_id: int, notes: list[str]) -> None:
        """Notes on how the run was graded, shown at the top of its reports."""
        if not notes:
            return
        with self._write():
            row = self.db.execute("SELECT notes FROM runs WHERE id = ?", (run_id,)).fetchone()
            self.db.execute("UPDATE runs SET notes = ? WHERE id = ?",
                            (json.dumps(json.loads(row[0]) + notes), run_id))

    def set_problems(self, run_id: int, problems: list[str]) -> None:
        """The environment problems seen by the latest process to grade the run."""
        with self._write():
            self.db.execute("UPDATE runs SET environment = json_set(environment, '$.problems', "
                            "json(?)) WHERE id = ?", (json.dumps(problems), run_id))

    def reusable(self, sha256: str, task_hash: str, kbench_version: str, fingerprint: str,
                 key: dict, unrecorded: dict) -> tuple[int, SubmissionResult] | None:
        """The newest result for the same file, problem (its digest), kbench and machine
        software, graded under the same ``key`` (option name: value, as stored with the run);
        a run stored with no value for an option counts as graded under ``unrecorded``'s.

        Results that kbench, the machine or the problem failed to produce (internal_error,
        environment_error, infrastructure_error, task_error) are never reused, nor correct ones
        left without a speedup (the reference could not be timed alongside).
        """
        same, values = "", []
        for name, value in key.items():
            same += "AND coalesce(json_extract(u.options, ?), ?) IS ? "
            values += [f"$.{name}", _sql(unrecorded.get(name)), _sql(value)]
        row = self.db.execute(
            "SELECT r.run_id, r.data FROM results r JOIN runs u ON u.id = r.run_id "
            "JOIN problems p ON p.run_id = r.run_id AND p.name = r.problem "
            "WHERE r.sha256 = ? AND p.digest = ? AND u.kbench_version = ? "
            "AND u.fingerprint = ? AND r.status NOT IN (?, ?, ?, ?) AND r.reused_from IS NULL "
            "AND NOT (r.status = 'ok' AND r.speedup IS NULL) " + same +
            "ORDER BY r.run_id DESC LIMIT 1",
            (sha256, task_hash, kbench_version, fingerprint, Status.INTERNAL_ERROR.value,
             Status.ENVIRONMENT_ERROR.value, Status.INFRASTRUCTURE_ERROR.value,
             Status.TASK_ERROR.value, *values)
        ).fetchone()
        return (row[0], SubmissionResult.from_dict(json.loads(row[1]))) if row else None

    # -- reading -----------------------------------------------------------------------------

    def load_run(self, run_id: int) -> RunResult:
        row = self.db.execute(
            "SELECT kbench_version, task, seed, started, environment, notes, options "
            "FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise StoreError(f"{self.path}: no run {run_id}")
        subs = [SubmissionResult.from_dict(json.loads(r[0])) for r in self.db.execute(
            "SELECT data FROM results WHERE run_id = ? ORDER BY problem, name", (run_id,))]
        problems = [ProblemRun.from_dict(json.loads(r[0])) for r in self.db.execute(
            "SELECT data FROM problems WHERE run_id = ? ORDER BY name", (run_id,))]
        return RunResult(kbench_version=row[0], task=row[1], seed=row[2], started=row[3],
                         environment=json.loads(row[4]), problems=problems, submissions=subs,
                         notes=json.loads(row[5]), run_id=run_id,
                         timing_mode=json.loads(row[6]).get("timing", DEFAULT_TIMING.value),
                         profile=json.loads(row[6]).get("profile", DEFAULT_PROFILE.value),
                         rules=json.loads(row[6]).get("rules", DEFAULT_RULES.value),
                         include_degenerate=json.loads(row[6]).get("include_degenerate",
                                                                   False))

    def latest_problems(self) -> dict[str, tuple[int, ProblemRun]]:
        """Each problem's newest stored record, by name, with its run's id."""
        rows = self.db.execute(
            "SELECT p.name, p.run_id, p.data FROM problems p WHERE p.run_id = "
            "(SELECT max(q.run_id) FROM problems q WHERE q.name = p.name)")
        return {r[0]: (r[1], ProblemRun.from_dict(json.loads(r[2]))) for r in rows}

    def problem(self, run_id: int, name: str) -> ProblemRun | None:
        row = self.db.execute("SELECT data FROM problems WHERE run_id = ? AND name = ?",
                              (run_id, name)).fetchone()
        return ProblemRun.from_dict(json.loads(row[0])) if row else None

    def prune(self, keep: int) -> tuple[list[int], str | None]:
        """Delete every run but the newest ``keep`` (and runs another process is grading) with
        their results; return the ids deleted and when the oldest run kept started (None if
        none is kept)."""
        ids = [r[0] for r in self.db.execute("SELECT id FROM runs ORDER BY id DESC")]
        gone = [i for i in ids[keep:] if not self.claimed(i)]
        with self._write():
            for run_id in gone:
                self.db.execute("DELETE FROM results WHERE run_id = ?", (run_id,))
                self.db.execute("DELETE FROM problems WHERE run_id = ?", (run_id,))
                self.db.execute("DELETE FROM runs WHERE id = ?", (run_id,))
        for run_id in gone:
            self._run_lock(run_id).unlink(missing_ok=True)
        return gone, self.db.execute("SELECT min(started) FROM runs").fetchone()[0]

    def logs_in_use(self) -> set[str]:
        """Every log path a stored result names."""
        return {path for (data,) in self.db.execute("SELECT data FROM results")
                for path in json.loads(data).get("logs", [])}

    def history(self, name: str) -> list[dict]:
        """Every stored result of submission ``name``, oldest first."""
        rows = self.db.execute(
            "SELECT r.run_id, r.graded, u.environment, u.kbench_version, r.sha256, r.status, "
            "r.speedup, r.reused_from, r.problem FROM results r JOIN runs u ON u.id = r.run_id "
            "WHERE r.name = ? ORDER BY r.run_id", (name,))
        return [{"run": r[0], "when": r[1],
                 "where": json.loads(r[2]).get("device_name", "?"), "kbench": r[3],
                 "sha256": r[4], "status": r[5], "speedup": r[6], "reused_from": r[7],
                 "task": r[8]} for r in rows]

