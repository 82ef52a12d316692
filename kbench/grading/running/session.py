"""A grading session: candidates given as source strings, graded as `kbench grade` grades
files, with what a batch keeps warm kept between them (each problem's screening and
reference figures, the workers' zygotes, the builds, the store's run).

One thread of the session's own does the grading: it takes the waiting candidates in batches
(kbench.grading.running.fair_queue), writes each source to a file (the trusted side never
imports it: a worker does, as in any run), and hands them to the executor `kbench grade` would
pick.
Every result is stored as it comes, in one run of the results store; a session started again
on the same problems and settings takes that run up again, so what was graded before a kill
is kept and answered at once."""

from __future__ import annotations

import ast
import collections
import concurrent.futures
import dataclasses
import hashlib
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kbench.grading.jobs import Job
from kbench.grading.options import Options
from kbench.grading.running import driver
from kbench.grading.running.fair_queue import FairQueue
from kbench.grading.running.local import LocalExecutor
from kbench.grading.running.placement import Placement, executor_for
from kbench.host import interrupt
from kbench.problems.discovery import Problem, Submission, find_problems
from kbench.problems.load import load_task
from kbench.problems.task import Task, TaskError
from kbench.results.run_record import SubmissionResult
from kbench.results.store import Store

SUBMITTED = "submitted"  # the output folder's subfolder the sources are written to


class SessionError(Exception):
    """A candidate the session will not grade, or could not: the message says why."""


class UnknownProblem(SessionError):
    pass


class BadSource(SessionError):
    pass


@dataclass
class Ticket:
    """One candidate's way through the session: queued, grading, then done (its result) or
    failed (kbench could not grade it: ``error``)."""

    id: str  # of the problem and the source: the same candidate twice is one ticket
    problem: str
    source: str = field(repr=False)
    client: str = ""
    state: str = "queued"
    result: SubmissionResult | None = None
    error: str = ""
    submitted: float = field(default_factory=time.monotonic)
    waited_s: float | None = None  # from submitted to its result
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future,
                                              repr=False)

    @property
    def name(self) -> str:
        """Its submission's name in the store and the reports."""
        return f"{self.problem}_{self.id}"

    def to_dict(self) -> dict:
        return {"id": self.id, "problem": self.problem, "state": self.state,
                "error": self.error or None, "waited_s": self.waited_s,
                "result": self.result.to_dict() if self.result else None}


def candidate_id(problem: str, source: str) -> str:
    return hashlib.sha256(f"{problem}\0{source}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Limits:
    """What one session accepts and how it groups its work."""

    source_bytes: int = 256 * 1024  # a candidate's source, UTF-8
    per_client: int = 64  # candidates one client may have waiting
    batch: int = 16  # candidates built and graded together (their builds run side by side)
    # A batch waits for more candidates while they keep coming within this of each other:
    # 8 clients' first candidates, sent at once, went as batches of 1 and 7 without it.
    quiet_s: float = 0.25


class Session:
    """Grade candidates against a set of problems (``task`` as `kbench grade --task` takes
    it: None for the bundled tasks, a name, a file or a folder) under ``options``, on the
    device or devices ``placement`` names. Use as a context manager, or call ``close``.
    ``any_seed``: a run left unfinished under another seed is taken up too, under its seed
    (a server started again without naming one). ``write_reports(store, run_id, out_dir)``
    renders the run as the session ends (kbench.grader's Session passes kbench.reports')."""

    def __init__(self, options: Options, task: str | None = None,
                 placement: Placement | None = None, limits: Limits = Limits(),
                 say: Callable[[str], None] = lambda line: None, any_seed: bool = False,
                 write_reports: Callable[[Store, int, Path], None] | None = None) -> None:
        label, problems = find_problems(task)
        self.label = f"serve {label}"
        self.problems: dict[str, Problem] = {p.name: p for p in problems}
        self.digest = problems_digest(problems)
        self.options, self.limits, self.say = options, limits, say
        self.placement = placement or Placement()
        self.any_seed, self.write_reports = any_seed, write_reports
        self.queue: FairQueue[Ticket] = FairQueue(limits.per_client)
        self.tickets: dict[str, Ticket] = {}
        self.run_id: int | None = None
        self._tasks: dict[str, Task | None] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="kbench-session", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise self._failure

    # -- the caller's side --------------------------------------------------------------------

    def submit(self, problem: str, source: str, client: str = "") -> Ticket:
        """Queue a candidate; its ticket (the one already given, for a candidate met before).
        Raises UnknownProblem, BadSource, QueueFull (``client`` has its share waiting) or
        QueueClosed."""
        if problem not in self.problems:
            known = sorted(self.problems)
            raise UnknownProblem(f"problem {problem!r}: not one of this session's "
                                 f"{len(known)} problems ({', '.join(known[:5])}"
                                 f"{', ...' if len(known) > 5 else ''})")
        check_source(source, self.limits.source_bytes)
        ticket = Ticket(candidate_id(problem, source), problem, source, client)
        with self._lock:
            known_ticket = self.tickets.get(ticket.id)
            if known_ticket is not None and known_ticket.state != "failed":
                return known_ticket
            self.queue.put(client, ticket)
            self.tickets[ticket.id] = ticket
        return ticket

    def grade(self, problem: str, source: str, client: str = "",
              timeout: float | None = None) -> SubmissionResult:
        """A candidate's result, waiting for it; SessionError where it could not be graded."""
        return self.submit(problem, source, client).future.result(timeout)

    def grade_many(self, candidates: list[tuple[str, str]], client: str = ""
                   ) -> list[SubmissionResult]:
        """(problem, source) pairs graded together (their builds side by side)."""
        tickets = [self.submit(problem, source, client) for problem, source in candidates]
        return [t.future.result() for t in tickets]

    def ticket(self, ticket_id: str) -> Ticket | None:
        return self.tickets.get(ticket_id)

    def health(self) -> dict:
        states = collections.Counter(t.state for t in list(self.tickets.values()))
        return {"run": self.run_id, "label": self.label, "problems": len(self.problems),
                "device": self.options.device.value, "waiting": self.queue.depth(),
                "grading": states["grading"], "done": states["done"],
                "failed": states["failed"]}

    def close(self, wait: bool = True) -> None:
        """End the session. ``wait``: grade what waits, close the problems (their drift
        checks) and finish the run; else drop what waits and stop what is being graded, its
        run left unfinished for the next session to take up."""
        if wait:
            self.queue.close()
        else:
            self._stopping = True
            for ticket in self.queue.drop():
                _fail(ticket, "the session was closed before it was graded")
            interrupt.stop(signal.SIGTERM)
        self._thread.join()
        if not wait:
            interrupt.reset()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the session's thread -------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self.store = Store(self.options.out_dir)
            self.executor = executor_for(self.options, self.placement, self.say)
            self.executor.watch_store(self.store.presence)
            run_id = self._resumable()
            self.run_id, self.fingerprint = driver.begin(
                self.label, self.digest, self.options, self.executor, self.store, run_id,
                self.say)
            self._restore()
        except BaseException as exc:  # handed to the constructor, which raises it
            self._failure = exc
            self._ready.set()
            return
        self._ready.set()
        self.sink = _TicketSink(self.store, self.run_id, self.tickets)
        try:
            while batch := self.queue.take(self.limits.batch, quiet_s=self.limits.quiet_s):
                self._grade(batch)
            if not self._stopping:
                if isinstance(self.executor, LocalExecutor):
                    self.executor.finish(self.sink)
                self.store.add_notes(self.run_id, self.executor.notes)
                self.store.finish_run(self.run_id)
        except interrupt.Interrupted:
            pass  # the run stays unfinished: the next session takes it up
        finally:
            self._write_reports()
            self.store.close()

    def _resumable(self) -> int | None:
        """This session's run, where one of the same problems, settings and seed (any seed,
        with ``any_seed``: then taken up under its own) was left unfinished and no other
        process holds it."""
        run = self.store.unfinished_run(self.label)
        if run is None or self.store.claimed(run.id) or run.task_hash != self.digest or \
                run.options != self.options.resumable():
            return None
        if run.seed != self.options.seed:
            if not self.any_seed:
                return None
            self.options = dataclasses.replace(self.options, seed=run.seed)
        self.say(f"taking up run {run.id} (seed {run.seed}), left unfinished")
        return run.id

    def _restore(self) -> None:
        """Tickets for what the run stored before (a session killed and started again), but
        those the machine or the problem kept from being graded (graded again if sent)."""
        graded = self.store.graded_names(self.run_id)
        for result in self.store.load_run(self.run_id).submissions:
            problem, _, ticket_id = result.name.rpartition("_")
            if problem in self.problems and ticket_id and result.name in graded:
                ticket = Ticket(ticket_id, problem, "", state="done", result=result)
                ticket.future.set_result(result)
                self.tickets[ticket_id] = ticket

    def _grade(self, batch: list[Ticket]) -> None:
        """One batch, as `kbench grade` grades a folder: reused where the same source was
        graded under the same conditions, else built, checked and timed."""
        folder = self.options.out_dir / SUBMITTED
        folder.mkdir(parents=True, exist_ok=True)
        entries: dict[str, driver.Entry] = {}
        for ticket in batch:
            ticket.state = "grading"
            problem = self.problems[ticket.problem]
            entry = entries.setdefault(ticket.problem, driver.Entry(
                problem.name, problem.path, self._task(problem), []))
            entry.submissions.append(Submission(ticket.name, _write(folder, ticket)))
        self.sink.pending = {t.name: t for t in batch}
        try:
            left = [(e, sub) for e in entries.values() for sub in e.submissions]
            todo = driver.reuse(left, self.options, self.store, self.fingerprint, False,
                                self.sink)
            if todo:
                self._run(todo)
        except Exception as exc:  # kbench's own failure: said to the caller, the session goes on
            self.say(f"kbench could not grade a batch: {exc!r}")
            for ticket in list(self.sink.pending.values()):
                _fail(ticket, f"kbench could not grade it ({exc!r})")
        finally:
            for ticket in self.sink.pending.values():
                if not ticket.future.done():
                    _fail(ticket, "not graded: the session stopped")

    def _run(self, todo: list[Job]) -> None:
        """The jobs on the executor; one device keeps their problems open between batches
        (the executor closes the least recently used beyond a few)."""
        if isinstance(self.executor, LocalExecutor):
            self.executor.run(todo, self.sink, close=False)
        else:
            self.executor.run(todo, self.sink)

    def _task(self, problem: Problem) -> Task | None:
        """The problem's task, loaded once; None where it cannot be (the executor then says
        why, and its candidates get task_error, as in `kbench grade`)."""
        if problem.name not in self._tasks:
            try:
                self._tasks[problem.name] = load_task(str(problem.path), problem.name)
            except TaskError:
                self._tasks[problem.name] = None
        return self._tasks[problem.name]

    def _write_reports(self) -> None:
        if self.run_id is None or self.write_reports is None:
            return
        try:
            self.write_reports(self.store, self.run_id, self.options.out_dir)
        except Exception as exc:  # the results are stored; `kbench report` writes them again
            self.say(f"the reports could not be written ({exc!r}): `kbench report` writes them")


class _TicketSink(driver.StoreSink):
    """The store's sink, each result also answering its ticket (of ``pending``: the batch's,
    by name); a result revised later (its speedup over torch.compile) updates it."""

    def __init__(self, store: Store, run_id: int, tickets: dict[str, Ticket]) -> None:
        super().__init__(store, run_id, self._answer)
        self.tickets = tickets
        self.pending: dict[str, Ticket] = {}

    def _answer(self, result: SubmissionResult) -> None:
        ticket = self.pending.pop(result.name, None)
        if ticket is not None:
            ticket.result, ticket.state, ticket.source = result, "done", ""  # memory held
            ticket.waited_s = round(time.monotonic() - ticket.submitted, 3)
            ticket.future.set_result(result)

    def revised(self, result: SubmissionResult) -> None:
        super().revised(result)
        ticket = self.tickets.get(result.name.rpartition("_")[2])
        if ticket is not None and ticket.name == result.name:
            ticket.result = result


def _fail(ticket: Ticket, why: str) -> None:
    ticket.state, ticket.error, ticket.source = "failed", why, ""
    if not ticket.future.done():
        ticket.future.set_exception(SessionError(why))


def check_source(source: str, limit: int) -> None:
    """A source a worker may be given: text within the size limit that parses as Python.
    It is parsed here, never run."""
    if not isinstance(source, str) or not source.strip():
        raise BadSource("source: expected the candidate's Python source, got nothing")
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise BadSource(f"source: {size} bytes, more than this session's limit of {limit}")
    try:
        ast.parse(source, "<candidate>")
    except SyntaxError as exc:
        raise BadSource(f"source: not valid Python (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:  # a null byte
        raise BadSource(f"source: not valid Python ({exc})") from None


def _write(folder: Path, ticket: Ticket) -> Path:
    """The source as a file a worker imports: written anew for each batch, from the copy the
    session holds (whatever an earlier candidate did to the folder), read-only."""
    path = folder / f"{ticket.id}.py"
    temp = folder / f".{ticket.id}.{secrets.token_hex(4)}.tmp"
    temp.write_text(ticket.source)
    os.chmod(temp, 0o444)
    os.replace(temp, path)
    return path


def problems_digest(problems: list[Problem]) -> str:
    """What a session's run stands for: its problems' names and files' bytes."""
    h = hashlib.sha256()
    for problem in sorted(problems, key=lambda p: p.name):
        h.update(problem.name.encode() + b"\0" + problem.path.read_bytes() + b"\0")
    return h.hexdigest()

