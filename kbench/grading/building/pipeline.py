"""The host's build pipeline: every submission of a run that must be built goes to one pool of
build processes that uses the cores the host split gives builds (kbench.grading.building.hostsplit),
in the order the graders will take them, and each build is handed out as soon as it is known to
be clean. Graders start on the first problems while the rest build, so no GPU waits for a
build after the first ones and no build core idles while builds are left.

A build runs the submission's module-level code, which may write kbench's files. The pool
keeps one watch window open over kbench's code and the run's problems and submissions
(kbench.grading.building.watch, ``builds=True``) and checks it as each build ends: a build is handed
out only after a check that found nothing changed since it started. A change cannot be pinned
on one of the builds then running, so they all become suspects: they are built again one at
a time, each watched alone, once the pool and the grading are done (``settle``), and the one
that changes the files again is flagged. While the pool works, grading windows elsewhere that
see a change cannot pin it on their submission either (kbench.grading.building.guard.BuildMark):
those submissions are graded again at the end, too."""

from __future__ import annotations

import collections
import contextlib
import threading
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

from kbench.grading.building import build
from kbench.grading.building.build import Built
from kbench.grading.building.guard import BuildMark
from kbench.grading.building.hostsplit import HostSplit
from kbench.grading.building.watch import Watcher, tampered
from kbench.grading.context import Context, Say
from kbench.grading.jobs import Job
from kbench.grading.options import Options
from kbench.host import activity, build_lock, interrupt, pch
from kbench.host.build_dirs import build_dir
from kbench.host.toolchain import Toolchain
from kbench.problems.load import load_task

_LOCK_WAIT_S = 10.0  # then a build whose folder another kbench process holds waits its turn
# The first builds of a run (this many per grading slot) run at the pool's priority, the rest
# _BEHIND_NICE lower: where builds outnumber the cores, those few take the larger share and
# come out first, so grading starts early, while the others keep every core busy (the pool's
# rate is the cores'). All at one priority, 56 builds started at once on 4 H200s came out
# together, the first after 204 s.
_AHEAD = 2
_BEHIND_NICE = 5


class Pipeline:
    """Use as a context manager around the run: the pool's mark is held from ``start`` until
    ``finish`` or the end of the block."""

    def __init__(self, options: Options, toolchain: Toolchain, environment_problem: str | None,
                 split: HostSplit, say: Say = lambda line: None) -> None:
        self.options, self.toolchain, self.split, self.say = options, toolchain, split, say
        self.environment_problem = environment_problem
        self.watcher = Watcher(options)
        self.mark = BuildMark(options.cache_dir)
        self.cond = threading.Condition()
        self._todo: collections.deque[Job] = collections.deque()
        self._jobs: dict[str, Job] = {}
        self._folders: dict[str, Path | None] = {}  # each job's build folder
        self._contexts: dict[tuple[str, str], Context | None] = {}
        self._done: dict[str, Built] = {}  # built, not yet checked clean
        self._released: dict[str, Built | None] = {}  # handed out (None: not built here)
        self._suspects: dict[str, Job] = {}
        self._in_flight: set[str] = set()
        # The window's checks and the builds on one clock: ticks of each start and end.
        self._tick = self._checked = 0
        self._started: dict[str, int] = {}
        self._ended: dict[str, int] = {}
        self._check_due = False
        self._tickets: dict[str, int] = {}  # the check each build waits for before it starts
        self._closing = False  # finish: the checker's last check
        self._threads: list[threading.Thread] = []
        self._first: set[str] = set()  # the builds ahead of the rest (see _AHEAD)
        self._window: Callable | None = None
        self._stopping = False
        self._loaded = False  # every job queued (start has returned)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:  # the run is over: no new build starts, the checker ends
            with self.cond:
                self._stopping = self._closing = True
                self._todo.clear()
                self.cond.notify_all()
        else:
            self.finish()
        self.mark.release()

    def start(self, jobs: list[Job]) -> None:
        """Build ``jobs`` in this order, ``split.build_jobs`` at a time. Their problems are
        loaded here, in this thread, before it returns (the first builds start meanwhile):
        a problem's module is the grader's to use from then on."""
        self.watcher.for_run([j.task for j in jobs], [j.path for j in jobs])
        files = [*self.watcher.run_files]
        self.mark.hold()
        if self.options.pch:  # before the window opens: the headers are kbench's own files
            self.say(pch.prepare(self.options.cache_dir, self.toolchain, _texts(jobs),
                                 self.toolchain.env(), self.split.nice))
        self._folders = {j.path: self._folder(j) for j in jobs}
        self._first = {j.path for j in jobs[:_AHEAD * len(self.split.timing)]}
        self._window = self.watcher.watch(files, [self.options.out_dir / "logs"], builds=True)
        self._jobs = {j.path: j for j in jobs}
        count = min(self.split.build_jobs, len(jobs))
        self.say(f"building {len(jobs)} submission(s), {count} at a time: "
                 f"{self.split.describe()}")
        for work in [self._check] + [self._work] * count:
            thread = threading.Thread(target=work, daemon=True)
            thread.start()
            self._threads.append(thread)
        for job in jobs:
            self._load(job)
            with self.cond:
                self._todo.append(job)
                self.cond.notify_all()
        with self.cond:
            self._loaded = True
            self.cond.notify_all()

    def ready(self, jobs: Iterable[Job]) -> bool:
        """Every one of ``jobs`` handed out or a suspect (call with ``cond`` held)."""
        return all(j.path in self._released or j.path in self._suspects for j in jobs)

    def wait(self, jobs: list[Job]) -> dict[str, Built | None]:
        """The builds of ``jobs`` once all are out, by path; suspects are left out (they are
        built again and graded at the end), and None means not built here (its problem did
        not load: the grader reports that)."""
        with self.cond:
            self.cond.wait_for(lambda: self.ready(jobs))
            return {j.path: self._released[j.path] for j in jobs if j.path in self._released}

    def siblings(self, job: Job) -> list[Job]:
        """The run's jobs built in ``job``'s folder (files of the same code share one: a
        grader must not load it while another of them builds there)."""
        folder = self._folders.get(job.path)
        return [j for j in self._jobs.values() if folder is not None and
                self._folders.get(j.path) == folder] or [job]

    def finish(self) -> None:
        """Wait for every build and a last check; then the pool's mark is dropped: grading
        windows from now on see no builds beside them (call once grading beside the builds
        is over: until then the checker puts right what changes)."""
        workers, checker = self._threads[1:], self._threads[:1]
        for thread in workers:
            thread.join()
        with self.cond:
            self._closing = True
            self.cond.notify_all()
        for thread in checker:
            thread.join()
        self.mark.release()

    def built(self) -> dict[str, Built | None]:
        """Every build handed out so far, by path."""
        with self.cond:
            return dict(self._released)

    def suspects(self) -> list[Job]:
        return list(self._suspects.values())

    def settle(self) -> dict[str, Built]:
        """The suspects built again one at a time, each watched alone (call after ``finish``,
        with nothing else running): the one that changes kbench's files is flagged."""
        settled = {}
        for job in self.suspects():
            ctx = self._contexts[(job.task, job.problem)]
            sub = job.submission()
            if ctx is None:
                continue
            self.watcher.for_task(ctx)
            changed = self.watcher.watch([sub.path], [ctx.logs, build.folder(ctx, sub)])
            built = build.build(ctx, sub, self.environment_problem,
                                self.split.cores_per_build(), self.split.build, self.split.nice)
            if lines := changed().lines:
                built = Built(tampered("while building", lines), built.seconds)
            settled[job.path] = built
            self.say(f"{job.problem}: {job.name} built again alone: "
                     f"{build.outcome(built, _text(job))}")
        return settled

    def _work(self) -> None:
        with contextlib.suppress(interrupt.Interrupted):  # kbench's stop: nothing is out
            while self._build_next():
                pass

    def _build_next(self) -> bool:
        """Take the next job and build it; False once there is none (or kbench stops)."""
        with self.cond:
            self.cond.wait_for(lambda: self._todo or self._loaded or self._stopping)
            if self._stopping or not self._todo or interrupt.requested():
                return False
            job = self._todo.popleft()
            self._in_flight.add(job.path)
            # A check first, while its folder is still compared: what an earlier build
            # planted there is found before this build loads it.
            ticket, self._check_due = self._tick, True
            self._tickets[job.path] = ticket
            self.cond.notify_all()
            self.cond.wait_for(lambda t=ticket: self._checked > t or self._stopping)
            if self._stopping:
                return False
            self._tick += 1
            self._started[job.path] = self._tick
        built, out = None, True
        try:
            ctx = self._contexts[(job.task, job.problem)]
            if ctx is not None:
                with activity.Log(self.options.cache_dir).record(
                        "build", f"{job.problem}/{job.name}"):  # timings beside it see it
                    built = build.build(ctx, job.submission(), self.environment_problem,
                                        self.split.cores_per_build(), self.split.build,
                                        self.split.nice + (job.path not in self._first
                                                           and _BEHIND_NICE),
                                        lock_wait_s=_LOCK_WAIT_S)
                self.say(f"{job.problem}: {job.name} {build.outcome(built, _text(job))}")
        except build_lock.Busy as busy:  # another kbench process builds it: not a failure
            self.say(f"{job.problem}: {job.name}: {busy}; tried again after the others")
            out = False
            self._again(job)
        except Exception:  # kbench's own bug: the grader builds this one itself
            traceback.print_exc()
        finally:  # whatever happens, the job is out: no grader waits for it forever
            if out:
                self._finished(job, built)
        return True

    def _again(self, job: Job) -> None:
        """A job whose build folder another process holds, back at the end of the queue."""
        with self.cond:
            self._in_flight.discard(job.path)
            self._started.pop(job.path, None)
            self._tickets.pop(job.path, None)
            self._todo.append(job)
            self.cond.notify_all()

    def _finished(self, job: Job, built: Built | None) -> None:
        with self.cond:
            self._tick += 1
            self._ended[job.path] = self._tick
            self._in_flight.discard(job.path)
            if job.path not in self._suspects:
                self._done[job.path] = built
            self._check_due = True
            self.cond.notify_all()

    def _check(self) -> None:
        """The checker: the window checked (outside the lock) whenever a build has ended or
        is about to start, and once a second while grading goes on beside it, until
        ``finish``. A clean check hands out every build that ended before it started; a
        change, put right to the run's first state, makes a suspect of every build that ran
        since the previous check started (and is counted on the mark, for grading windows)."""
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self._check_due or self._closing, timeout=1.0)
                closing, self._check_due = self._closing, False
                self._tick += 1
                began, previous = self._tick, self._checked
                # A build fills its own folder; the folders of builds not yet started are
                # compared too (one build must not plant files where a later one will load).
                filled = [self._folders[p] for p in self._in_flight | set(self._started)
                          if self._folders.get(p) and (p in self._started or
                                                      self._tickets.get(p, began) < previous)]
            try:
                lines = self._window(filled).lines
            except Exception as exc:  # kbench's own failure: nothing is handed out unchecked
                traceback.print_exc()
                lines = [f"the check failed: {exc!r}"]
            with self.cond:
                if lines:
                    self.mark.repaired()
                    self.say("kbench's files changed while builds ran (put right); each build "
                             "then running will be built again alone at the end: "
                             + "; ".join(lines)[:500])
                    for path, start in self._started.items():
                        if start < began and self._ended.get(path, began) > previous:
                            self._suspects[path] = self._jobs[path]
                            self._done.pop(path, None)
                for path in [p for p in self._done if self._ended[p] < began]:
                    self._released[path] = self._done.pop(path)
                self._checked = began
                self.cond.notify_all()
            if closing:
                return

    def _folder(self, job: Job) -> Path | None:
        """The job's build folder, which its build fills (a file gone: no folder)."""
        try:
            return build_dir(self.options.cache_dir, Path(job.path), self.toolchain)
        except OSError:
            return None

    def _load(self, job: Job) -> None:
        """The problem's context for building, loaded once (no screening: the grader does
        that); None where it does not load (the grader loads it again and says why)."""
        key = (job.task, job.problem)
        if key not in self._contexts:
            try:
                task = load_task(job.task, job.problem)
                self._contexts[key] = Context.for_building(task, self.options, self.toolchain)
            except Exception:
                self._contexts[key] = None


def _text(job: Job) -> str:
    try:
        return Path(job.path).read_text(errors="replace")
    except OSError:
        return ""


def _texts(jobs: list[Job]) -> list[str]:
    """The submissions' sources, for the flag sets of their load_inline calls (kbench.host.pch)."""
    texts = []
    for job in jobs:
        try:
            texts.append(Path(job.path).read_text(errors="replace"))
        except OSError:
            continue
    return texts
