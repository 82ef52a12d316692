"""The trusted side of grading: build, check, time, decide. It never imports a submission.

One submission's path through this file: ``_build`` (its own process and build folder, in
parallel with the others) -> ``_evaluate``: a fresh process imports it, ``_check`` feeds it each
case and compares its output with the reference computed here afterwards, ``_time`` times it
shape by shape, in rounds alternating with the reference -> a Verdict and a SubmissionResult,
stored at once. The reference lives in its own process for the whole run (_ReferenceWorker),
which never sees a candidate: timed at the start, alongside each candidate, and at the end.
Launch-bound shapes take each round in new processes on both sides (see _time).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from kbench import __version__, doctor, environment, measurement, paths, scan
from kbench import verdict as verdicts
from kbench.build import build_dir
from kbench.cases import Case, plan_cases, select
from kbench.compare import (
    compare,
    compare_in_chunks,
    compare_values,
    fingerprint,
    identical,
    same_fingerprint,
)
from kbench.discovery import Submission
from kbench.guard import Guard, Presence
from kbench.results import Benchmark, SubmissionResult, shape_text
from kbench.sandbox import Sandbox, SandboxFailure, child_env, remove_stale_logs
from kbench.store import Store
from kbench.task import Task, Tolerance
from kbench.toolchain import find_toolchain
from kbench.verdict import Status, Verdict


@dataclass(frozen=True)
class Options:
    device: str
    out_dir: Path
    cache_dir: Path
    jobs: int
    seed: int
    case_indices: list[int] | None = None  # only these cases, and no timing
    cuda_arch: str | None = None
    timing: str = "eager"  # or "graph" (CUDA-graph replays; see kbench.worker.timing)

    def resumable(self) -> dict:
        """What ``--resume`` must repeat besides the seed."""
        return {"device": self.device, "case_indices": self.case_indices,
                "cuda_arch": self.cuda_arch, "timing": self.timing}


# Copy-bandwidth buffers (each of source and destination): far past any cache.
_COPY_BYTES = {"cuda": 1 << 30, "cpu": 256 << 20}


@dataclass(frozen=True)
class _Built:
    verdict: Verdict | None
    seconds: float


# Per benchmark shape, the candidate and the reference (each in its own process) take turns
# this many times, each turn with this share of the time budget: slow drift of the machine
# then weighs on both sides of a speedup alike.
_ROUNDS = 3
# Rounds, each in a process of its own on each side, for shapes under the task's
# fresh_rounds_below_ms (see _time). On an H200, five grades' speedups at 16x16384 spread 6 %
# with every round in one process, 3.8 % with 3 fresh-process rounds and 3.0 % with 8.
_FRESH_ROUNDS = 8

# A submission whose achieved bandwidth (the task's minimum bytes over its median time) beats
# the copy bandwidth measured in the same run by more than this factor did not move those
# bytes: it skipped work while timed (replayed, cached or left out the computation).
_MAX_COPY_SHARE = 1.5

# Outputs of timed calls verified per round: the two latest and others picked at random.
_VERIFIED = 8

# The trusted clock: per shape, kbench times this many passes of calls run back to back on its
# own clock (the best one counts), each pass as many calls as the submission's median says fill
# _CLOCKED_MS (within 1 and _CLOCKED_MAX_CALLS), so the round trip's noise is small beside it.
# The submission's median time plus its host dispatch time must explain that pass's time per
# call, within this share of the median plus this many ms (wider on a CPU, where a pass of warm
# calls and the cold timed ones differ more).
_CLOCKED_PASSES = 3
_CLOCKED_MS = 20.0
_CLOCKED_MAX_CALLS = 2000
_CLOCK_SLACK = {"cuda": (0.15, 0.1), "cpu": (0.5, 1.0)}

_random = random.SystemRandom()  # choices a submission must not be able to predict

Progress = Callable[[SubmissionResult, int, int], None]  # a result, its place, how many
Samples = dict  # one round of a worker's checked timing samples (kbench.worker.timing.Samples)


@dataclass(frozen=True)
class _Returned:
    """An output as the worker returned it (memory the worker can still write), the copy
    that was checked, and when (time.monotonic()) the answer came."""

    shared: torch.Tensor
    copy: torch.Tensor
    case: Case
    at: float


# Outputs are compared with their checked copies this long, at least, after the last case's
# call returned (see Grader._recheck): a case's output written later than this after its call
# goes unseen there (a timed call's, written while kbench looks, is caught by _verify).
_SETTLE_S = 0.5


def _tampered(when: str, lines: list[str]) -> Verdict:
    return Verdict(Status.FLAGGED, f"{when}, wrote to files kbench owns (put right since): "
                   + "; ".join(lines)[:1000])


class _Stop(Exception):
    """Grading of one submission ends here with ``verdict``."""

    def __init__(self, verdict: Verdict, failure: dict | None = None) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict
        self.failure = failure


class Grader:
    def __init__(self, task: Task, options: Options,
                 say: Callable[[str], None] = lambda line: None) -> None:
        self.task = task
        self.opts = options
        self.say = say
        self.device = torch.device(options.device)
        self.reference = task.reference_module()
        self.init_args = list(self.reference.get_init_inputs())
        self.ref_model = self.reference.Model(*self.init_args).to(self.device).eval()
        self.toolchain = find_toolchain(options.cuda_arch, options.cache_dir / "toolkits")
        self.environment_problem: str | None = None  # set by grade (kbench.doctor)
        self.cases = select(plan_cases(task, options.seed), options.case_indices)
        self.timed = options.case_indices is None
        self._skips: list[str | None] = []  # per benchmark shape: why it cannot run here
        self._itemsize = torch.empty(0, dtype=getattr(torch, task.benchmark_dtype)).element_size()
        self._reference_file = Submission("reference", Path(self.reference.__file__))
        self._reference_worker = _ReferenceWorker(self, "reference")
        # Round r of launch-bound shapes divides the reference's round r in worker r (_time).
        self._reference_rounds = [self._reference_worker] + [
            _ReferenceWorker(self, f"reference.round{r + 1}") for r in range(1, _FRESH_ROUNDS)]
        self.logs = options.out_dir / "logs"
        # kbench's own code (every new worker imports it) but not the bundled submissions:
        # those of a run are watched one by one (see _watch).
        code = tuple(p for p in paths.PACKAGE_DIR.iterdir()
                     if p.name not in ("submissions", "__pycache__"))
        cache = options.cache_dir / "extensions"
        self.guard = Guard(restorable=(options.out_dir, task.path, Path(self.reference.__file__),
                                       *code),
                           cache=(cache,), shared=(options.out_dir, cache))
        self._cache_presence = Presence(options.cache_dir)
        self._presences = [self._cache_presence]  # and the store's (see grade)
        self.unwatched = 0  # submissions whose writes to the shared folders went unchecked

    # -- the run ---------------------------------------------------------------------------

    def grade(self, submissions: list[Submission], store: Store, run_id: int | None = None,
              force: bool = False, on_result: Progress = lambda r, i, n: None) -> int:
        """Grade into ``store``: a new run, or the rest of ``run_id``. Each result is stored the
        moment it is known and passed to ``on_result`` with its place among the submissions
        this call grades. Returns the run's id. Raises StoreError if another kbench process is
        grading ``run_id``."""
        self._presences = [self._cache_presence, store.presence]
        env = self._environment()
        fingerprint = environment.fingerprint(env)
        if run_id is None:
            run_id = store.start_run(
                kbench_version=__version__, task=self.task.name, task_hash=self.task.digest,
                seed=self.opts.seed, device=self.device.type, fingerprint=fingerprint,
                options=self.opts.resumable(), environment=env)
        store.claim(run_id)
        store.set_problems(run_id, env["problems"])  # a resume says what it saw
        remove_stale_logs(self.logs)
        graded = store.graded_names(run_id)
        left = [sub for sub in submissions if sub.name not in graded]
        if graded:
            self.say(f"run {run_id} has {len(graded)} result(s) stored; grading the other "
                     f"{len(left)}")
        done = iter(range(1, len(left) + 1))

        def report(result: SubmissionResult) -> None:
            on_result(result, next(done), len(left))

        todo = []
        for sub in left:
            earlier = None if force or not self.timed else store.reusable(
                sub.sha256, self.task.digest, __version__, fingerprint, self.opts.timing)
            if earlier is None:
                todo.append(sub)
                continue
            result = earlier[1]  # the same bytes, perhaps under another name
            result.name, result.path, result.reused_from_run = sub.name, str(sub.path), earlier[0]
            store.add_result(run_id, result)
            report(result)
        if todo:
            self._grade_anew(todo, store, run_id, report)
        store.finish_run(run_id)
        return run_id

    def _environment(self) -> dict:
        """The machine, as recorded with the run, with what kbench.doctor found wrong. A
        problem that stops CUDA builds is said once here and becomes each CUDA submission's
        environment_error (see _build)."""
        env = environment.describe(self.device.type, self.toolchain)
        found = doctor.checks(self.device.type, self.toolchain, self.opts.cache_dir)
        env["problems"] = [f"{c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "")
                           for c in found if c.level is doctor.Level.PROBLEM]
        self.environment_problem = doctor.blocking(found)
        for line in env["problems"]:
            self.say(f"environment problem: {line}")
        return env

    def _grade_anew(self, submissions: list[Submission], store: Store, run_id: int,
                    on_result: Callable[[SubmissionResult], None]) -> None:
        self.say(f"building {len(submissions)} submission(s), {self.opts.jobs} at a time")
        built = self._build_all(submissions)
        shapes = self.task.benchmarks[self.device.type]
        reference: list[Benchmark] = []
        start: list[Samples | None] = []
        compiled: tuple[list[Samples | None], str | None] | None = None
        with contextlib.ExitStack() as workers:
            for worker in self._reference_rounds:
                workers.enter_context(worker)
            if self.timed:
                self._skips = [self._unfit(list(shape)) for shape in shapes]
                self.say(f"timing the reference on {len(shapes)} shape(s) ({self.opts.timing})")
                start = [self._reference_worker.samples(i, list(s))
                         for i, s in enumerate(shapes)]
                if self.task.timing[self.device.type].compile_reference:
                    self.say("timing torch.compile of the reference")
                    compiled = self._time_compiled()
                reference, notes = self._reference_table(start, None, compiled)
                store.set_reference(run_id, reference, self._reference_worker.copy_gbps, notes)
            else:
                store.set_reference(run_id, [], None, ["timing skipped: --case selects "
                                                       "correctness cases only"])
            timed = False
            for sub in submissions:
                result = self._evaluate(sub, built[sub], reference)
                store.add_result(run_id, result)
                on_result(result)
                timed = timed or any(b.candidate for b in result.benchmarks)
            if timed:  # the reference once more: did the machine drift meanwhile?
                self.say("timing the reference again (drift check)")
                end = [self._reference_worker.samples(i, list(s)) if start[i] else None
                       for i, s in enumerate(shapes)]
                reference, notes = self._reference_table(start, end, compiled)
                store.set_reference(run_id, reference, self._reference_worker.copy_gbps, notes)
        if self.unwatched:
            self.say(f"note: other kbench processes used {self.opts.out_dir} or the build cache "
                     f"in {self.unwatched} of this run's watch windows; writes there by the "
                     "submissions then running could not be told from theirs and went unchecked")

    # -- build -----------------------------------------------------------------------------

    def _build_all(self, submissions: list[Submission]) -> dict[Submission, _Built]:
        """Build in parallel, watching kbench's files (see kbench.guard). If a build wrote to
        them, the files are put right and the builds run again one at a time (from the warm
        cache) to find which: that one is flagged."""
        changed = self._watch(submissions)
        with ThreadPoolExecutor(max_workers=self.opts.jobs) as pool:
            built = dict(zip(submissions, pool.map(self._build, submissions), strict=True))
        if not changed():
            return built
        for sub in submissions:
            changed = self._watch([sub])
            built[sub] = self._build(sub)
            if lines := changed():
                built[sub] = _Built(_tampered("while building", lines), built[sub].seconds)
        return built

    def _watch(self, submissions: list[Submission]) -> Callable[[], list[str]]:
        """Start watching kbench's files (kbench.guard) while these submissions' code runs;
        call the result once it has ended: what they changed, put right since. The output
        folder and the build cache count only if no other kbench process used them at the
        start or at the end (their writes there cannot be told from a submission's)."""
        ignore = [self.logs] + [self._build_folder(s) for s in submissions]
        guard = Guard(self.guard.restorable + tuple(s.path for s in submissions),
                      self.guard.cache, self.guard.shared)
        alone = all(p.alone() for p in self._presences)
        before = guard.snapshot(ignore, alone)

        def changed() -> list[str]:
            shared = alone and all(p.alone() for p in self._presences)
            self.unwatched += not shared
            return guard.repair(before, ignore, shared)
        return changed

    def _build_folder(self, sub: Submission) -> Path:
        return build_dir(self.opts.cache_dir, sub.path, self.toolchain)

    def _build(self, sub: Submission) -> _Built:
        """Import the submission once in its own process: this compiles its extensions."""
        if scan.needs_cuda(sub.path.read_text(errors="replace")):
            if self.environment_problem:
                return _Built(Verdict(Status.ENVIRONMENT_ERROR, self.environment_problem), 0.0)
            if not self.toolchain.cuda_home:
                return _Built(Verdict(Status.SKIPPED, "compiles CUDA code and no CUDA toolkit "
                                      "was found here (kbench doctor says how to get one)"), 0.0)
        start = time.monotonic()
        try:
            with self._sandbox(f"{sub.name}.build.log", self._build_env(sub)) as box:
                self._call(box, self._load_request(sub, instantiate=False),
                           self.task.limits.build_s, "build")
        except _Stop as stop:
            return _Built(stop.verdict, time.monotonic() - start)
        return _Built(None, time.monotonic() - start)

    def _build_env(self, sub: Submission) -> dict[str, str]:
        folder = self._build_folder(sub)
        folder.mkdir(parents=True, exist_ok=True)
        os.utime(folder)  # last used now: kbench prune keeps what recent runs used
        cores = max(1, (psutil.cpu_count() or 1) // self.opts.jobs)
        return child_env({**self.toolchain.env(), "TORCH_EXTENSIONS_DIR": str(folder),
                          "MAX_JOBS": str(cores)})

    # -- evaluate --------------------------------------------------------------------------

    def _evaluate(self, sub: Submission, built: _Built,
                  reference: list[Benchmark]) -> SubmissionResult:
        source = sub.path.read_text(errors="replace")
        result = SubmissionResult(
            name=sub.name, path=str(sub.path), sha256=sub.sha256,
            status=Status.OK, cases_total=len(self.cases), flags=scan.flags(source),
            build_s=round(built.seconds, 2), logs=[str(self.logs / f"{sub.name}.build.log")])
        verdict = built.verdict
        changed = self._watch([sub])
        if verdict is None and self.device.type == "cpu" and scan.needs_cuda(source):
            tools = self.toolchain
            verdict = Verdict(Status.SKIPPED, f"built with nvcc {tools.nvcc_version} for CUDA arch "
                              f"{tools.arch_list}; needs a CUDA device to run")
        if verdict is None:
            result.logs.append(str(self.logs / f"{sub.name}.run.log"))
            try:
                with self._sandbox(f"{sub.name}.run.log", self._build_env(sub)) as box:
                    self._call(box, self._load_request(sub, instantiate=True),
                               self.task.limits.load_s, "load")
                    self._recheck(sub, self._check(box, sub, result))
                    if self.timed:
                        self._time(box, sub, result, reference)
                verdict = Verdict(Status.OK)
            except _Stop as stop:
                verdict, result.failure = stop.verdict, stop.failure
            except Exception as exc:  # a kbench bug must not end the run or blame the submission
                traceback.print_exc()
                verdict = Verdict(Status.INTERNAL_ERROR, f"kbench failed: {exc!r}")
        if lines := changed():
            verdict = _tampered("while graded", lines)
        result.status, result.reason = verdict.status, verdict.reason
        return result

    def _check(self, box: Sandbox, sub: Submission,
               result: SubmissionResult | None) -> list[_Returned]:
        """Every case: fresh inputs here, the candidate's output back, the reference after.
        Passed cases are counted in ``result``. The first failure raises _Stop: wrong_output
        for wrong values; flagged for right values from a call that returned a view of its
        input or changed its input. Values are judged on the copy the worker made as the call
        returned (see kbench.worker.serve), never on the output itself, which a thread may
        still be writing. One case, picked at random, is sent twice: the second output must
        match the first (determinism). Returns every output with its checked copy, for
        _recheck."""
        returned: list[_Returned] = []
        first_again = None
        again = [_random.choice(self.cases)] if self.cases else []
        for index, case in enumerate(self.cases + again):
            repeat = index == len(self.cases)
            inputs = self.reference.make_inputs(case.shape, case.dtype, case.distribution,
                                                case.seed, self.device)
            sent = [t.clone() for t in inputs]  # shared with the worker: its writes show here
            try:
                answer = self._call(box, {"op": "run", "inputs": sent},
                                    self.task.limits.case_s, case.describe())
            except _Stop as stop:
                stop.failure = self._failure(sub, case)
                raise
            shared, copy = answer["output"], answer.get("returned")
            if shared is None:
                raise _Stop(Verdict(Status.WRONG_OUTPUT, f"{case.describe()}: returned "
                                    f"{answer.get('output_type')}, expected torch.Tensor"),
                            self._failure(sub, case))
            if type(shared) is not torch.Tensor or type(copy) is not torch.Tensor:
                raise _Stop(Verdict(Status.RUNTIME_ERROR, f"{case.describe()}: the worker "
                                    "sent no output and copy of it (was kbench's worker code "
                                    "changed in the submission's process?)"),
                            self._failure(sub, case))
            out = copy.clone()  # the grader's own: nothing in the worker can write it
            with torch.no_grad():
                expected = self.ref_model(*inputs)
                exact = self.ref_model(*[t.to(torch.float64) for t in inputs])
            outcome = compare(out, expected, exact, self.task.tolerance[case.dtype])
            if not outcome.ok:
                failure = self._failure(sub, case)
                failure.update(max_abs_err=outcome.max_abs_err, max_rel_err=outcome.max_rel_err)
                raise _Stop(Verdict(Status.WRONG_OUTPUT, f"{case.describe()}: {outcome.reason}"),
                            failure)
            caught = None
            if answer.get("aliases_input") is True:
                caught = "returned a view of its input"
            elif not all(identical(s, p) for s, p in zip(sent, inputs, strict=True)):
                caught = "changed its input"
            if caught:
                raise _Stop(Verdict(Status.FLAGGED, f"{case.describe()}: {caught} (the output "
                                    "values were right)"), self._failure(sub, case))
            if repeat:
                self._same_twice(sub, case, first_again, out)
            returned.append(_Returned(shared, out, case, time.monotonic()))
            if again and case is again[0] and not repeat:
                first_again = out
            if result is not None and not repeat:
                result.cases_passed += 1
        return returned

    def _same_twice(self, sub: Submission, case: Case, first: torch.Tensor,
                    second: object) -> None:
        """The same input, sent twice: the outputs, each right, must also agree with each
        other within the task's tolerance."""
        if type(second) is torch.Tensor and second.shape == first.shape:
            outcome = compare_values(second.to(torch.float64), first.to(torch.float64),
                                     self.task.tolerance[case.dtype])
            if outcome.ok:
                return
            why = outcome.reason
        else:
            why = f"the second is {type(second).__qualname__} {tuple(getattr(second, 'shape', ()))}"
        raise _Stop(Verdict(Status.FLAGGED, f"{case.describe()}: the same input twice gave "
                            f"different outputs ({why})"), self._failure(sub, case))

    def _recheck(self, sub: Submission, returned: list[_Returned]) -> None:
        """Every case's output must still hold what it held when its call returned: a thread
        or stream that writes it afterwards makes the check meaningless. Looked at once, after
        the cases and before timing, at least _SETTLE_S after the last call returned, in case
        order: the verdict and the case it names do not depend on how fast this process
        happened to be (timed calls' outputs have checks of their own, see _verify)."""
        if not returned:
            return
        time.sleep(max(0.0, returned[-1].at + _SETTLE_S - time.monotonic()))
        for item in returned:
            if not identical(item.shared, item.copy):
                raise _Stop(Verdict(Status.FLAGGED, f"{item.case.describe()}: the output "
                                    "changed after it was returned"),
                            self._failure(sub, item.case))

    def _failure(self, sub: Submission, case: Case) -> dict:
        return {"case": case.to_dict(),
                "reproduce": f"kbench grade {sub.path} --seed {self.opts.seed} "
                             f"--case {case.index} --device {self.device.type}"}

    # -- time ------------------------------------------------------------------------------

    def _time(self, box: Sandbox, sub: Submission, result: SubmissionResult,
              reference: list[Benchmark]) -> None:
        """Each shape in rounds, alternating with the reference's. Shapes whose reference ran
        under the task's ``fresh_rounds_below_ms`` at the start take _FRESH_ROUNDS rounds,
        every round in a process of its own on each side: each process's launch path
        settles on its own level (some 0.2 us a kernel apart on an H200, docs/timing.md),
        which dominates a speedup of 10 us calls unless the rounds sample many processes.
        Those shapes go first, round by round, so that a round costs one new process per
        side; the first is the submission's own process, where kbench's clock runs later.
        Eager mode only: graph replays launch no kernel one by one."""
        eager = self.opts.timing == "eager"  # graph replay has no per-process launch level
        below = self.task.timing[self.device.type].fresh_rounds_below_ms if eager else 0.0
        mine: dict[int, list[Samples]] = {}  # per timed shape, the submission's rounds
        theirs: dict[int, list[Samples | None]] = {}  # and the reference's
        for i, ref in enumerate(reference):
            result.benchmarks.append(Benchmark(shape=ref.shape, dtype=ref.dtype,
                                               skipped=ref.skipped))
            if ref.reference is not None:
                mine[i], theirs[i] = [], []
        fresh = [i for i in mine if reference[i].reference.ms < below]

        def one_round(i: int, process: Sandbox, worker: _ReferenceWorker, count: int) -> None:
            shape = reference[i].shape
            theirs[i].append(worker.samples(i, shape, count))
            mine[i].append(self._samples(process, shape, count, keep=True))
            self._verify(process, shape, mine[i][-1]["kept"])

        for r in range(_FRESH_ROUNDS if fresh else 0):
            with contextlib.ExitStack() as stack:
                here = box if r == 0 else stack.enter_context(self._round_box(sub, r, result))
                for i in fresh:
                    one_round(i, here, self._reference_rounds[r], _FRESH_ROUNDS)
        for i in mine:
            if i not in fresh:
                for _ in range(_ROUNDS):
                    one_round(i, box, self._reference_worker, _ROUNDS)
            bench, nbytes = result.benchmarks[i], self._traffic(reference[i].shape)
            bench.candidate = measurement.summarise(mine[i], nbytes)
            ref_rounds = [t for t in theirs[i] if t is not None]
            if ref_rounds:
                bench.reference = measurement.summarise(ref_rounds, nbytes)
            else:
                failed = {w.failure for w in self._reference_rounds if w.failure}
                bench.skipped = ("no speedup: the reference could not be timed alongside ("
                                 + ("; ".join(sorted(failed)) or "no reason given") + ")")
            self._within_copy_bandwidth(bench)
            self._ordered(bench)
            self._within_trusted_clock(box, bench)
        measurement.add_speedups(result, reference)

    def _round_box(self, sub: Submission, r: int, result: SubmissionResult) -> Sandbox:
        """A new process for round ``r`` of the submission's launch-bound shapes (see _time),
        its instance loaded from the warm build cache."""
        log = f"{sub.name}.round{r + 1}.log"
        result.logs.append(str(self.logs / log))
        box = self._sandbox(log, self._build_env(sub))
        try:
            self._call(box, self._load_request(sub, instantiate=True), self.task.limits.load_s,
                       f"load (timing round {r + 1})")
        except BaseException:
            box.close()
            raise
        return box

    def _verify(self, box: Sandbox, shape: list[int], kept: object) -> None:
        """Outputs of timed calls, checked like a case's: the two latest and others picked
        here at random among those the worker kept (see kbench.worker.timing._Kept), against
        the reference on the same inputs, drawn again here from the seeds the worker used.
        The comparison is with the reference in the benchmark dtype at twice the task's
        tolerance: it is there to catch outputs not computed from these inputs. An output
        whose fingerprint differs from the one taken as its call returned was still being
        written: flagged."""
        stage = f"benchmark {shape_text(shape)}"
        if not isinstance(kept, list) or not all(type(c) is int for c in kept):
            raise _Stop(Verdict(Status.RUNTIME_ERROR, f"{stage}: the worker sent no valid "
                                "list of kept outputs"))
        kept = sorted(set(kept))
        chosen = kept[-2:] + _random.sample(kept[:-2], min(len(kept) - 2, _VERIFIED - 2)) \
            if len(kept) > 2 else kept
        answer = self._call(box, {"op": "outputs", "calls": chosen}, self.task.limits.case_s,
                            stage)
        items = answer.get("outputs")
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items) or \
                sorted(str(i.get("call")) for i in items) != sorted(map(str, chosen)):
            raise _Stop(Verdict(Status.RUNTIME_ERROR, f"{stage}: the worker did not send the "
                                "kept outputs asked for (was kbench's worker code changed "
                                "in the submission's process?)"))
        dtype = self.task.benchmark_dtype
        tol = self.task.tolerance[dtype]
        loose = Tolerance(rtol=2 * tol.rtol, atol=2 * tol.atol)
        for item in items:
            seed, norm, shared = item.get("seed"), item.get("norm"), item.get("output")
            where = f"{stage}: timed call {item['call']}"
            if type(seed) is not int or not (norm is None or type(norm) is float):
                raise _Stop(Verdict(Status.RUNTIME_ERROR, f"{where}: the worker sent no valid "
                                    "seed or fingerprint"))
            if type(shared) is not torch.Tensor:
                raise _Stop(Verdict(Status.WRONG_OUTPUT, f"{where} returned "
                                    f"{item.get('output_type')}, expected torch.Tensor"))
            inputs = self.reference.make_inputs(tuple(shape), dtype, "normal", seed,
                                                self.device)
            with torch.no_grad():
                expected = self.ref_model(*inputs)
            del inputs
            if norm is not None and not same_fingerprint(fingerprint(shared), norm):
                raise _Stop(Verdict(Status.FLAGGED, f"{where}: the output changed after the "
                                    "call returned (it was still being written)"))
            outcome = compare_in_chunks(shared, expected, loose)
            del expected
            if not outcome.ok:
                raise _Stop(Verdict(Status.WRONG_OUTPUT, f"{where}: wrong output: "
                                    f"{outcome.reason}"))
        del items, answer
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        # The worker holds the outputs until told; the next round, on either side, needs the
        # memory (see _unfit for the plan).
        self._call(box, {"op": "release"}, self.task.limits.case_s, stage)

    def _within_trusted_clock(self, box: Sandbox, bench: Benchmark) -> None:
        """Time calls on kbench's own clock, where the worker cannot reach: passes of calls
        back to back on fresh input sets (see Worker.clocked), each call followed by a
        device-wide synchronisation, no hold, no flush, as one request whose round trip is
        timed here, less that of the same pass with no call in it. The best pass's time per
        call must be explained by the submission's median plus its host dispatch time; work
        hidden from the stopwatch, or a stopwatch tampered with in the worker, shows up as
        the difference: flagged. The passes' outputs are verified too. Eager mode only: a graph
        replay's figures leave out the per-call dispatch that such a pass includes."""
        if self.opts.timing != "eager":
            return
        stage = f"benchmark {shape_text(bench.shape)}"
        limit = self.task.limits.benchmark_s
        mine = bench.candidate
        calls = min(_CLOCKED_MAX_CALLS, max(1, math.ceil(_CLOCKED_MS / mine.ms)))
        best = math.inf
        for _ in range(_CLOCKED_PASSES):
            self._call(box, {"op": "prepare", "shape": bench.shape, "calls": calls,
                             "dtype": self.task.benchmark_dtype}, limit, stage)
            seconds = []
            for empty in (True, False):
                t0 = time.perf_counter()
                answer = self._call(box, {"op": "clocked", "empty": empty}, limit, stage)
                seconds.append(time.perf_counter() - t0)
                if answer.get("calls") != calls:
                    raise _Stop(Verdict(Status.RUNTIME_ERROR, f"{stage}: the worker's clocked "
                                        f"pass did not run the {calls} calls asked for"))
            self._verify(box, bench.shape, answer.get("kept"))
            best = min(best, max(0.0, seconds[1] - seconds[0]) * 1e3 / calls)
        mine.trusted_ms = best
        explained = mine.ms + (mine.host_ms or 0.0 if self.device.type == "cuda" else 0.0)
        share, ms = _CLOCK_SLACK[self.device.type]
        if best - explained > share * mine.ms + ms:
            raise _Stop(Verdict(Status.FLAGGED, f"{stage}: kbench's own clock took {best:.4g} "
                                f"ms per call; the submission's timing explains {explained:.4g} "
                                f"ms ({mine.ms:.4g} ms timed + host dispatch): work was hidden "
                                "from the stopwatch or the stopwatch was tampered with"))

    @staticmethod
    def _ordered(bench: Benchmark) -> None:
        """Work a call left on other streams is charged to its figures (kbench.measurement);
        where it is a large part of the call, the output was handed back before the work
        writing it was ordered before the caller's stream, a race for any real caller:
        flagged."""
        side = bench.candidate.side_work_ms
        if side is not None and side > max(measurement.UNORDERED_MS,
                                           measurement.UNORDERED_SHARE * bench.candidate.ms):
            raise _Stop(Verdict(Status.FLAGGED, f"benchmark {shape_text(bench.shape)}: the "
                                f"device stayed busy {side:.3g} ms after the call's stream was "
                                "done: work left on other streams, not ordered before the "
                                "caller's stream, so the output was returned before it was "
                                "ready"))

    def _within_copy_bandwidth(self, bench: Benchmark) -> None:
        copy, gbps = self._reference_worker.copy_gbps, bench.candidate.gbps
        if copy and gbps and gbps > _MAX_COPY_SHARE * copy:
            raise _Stop(Verdict(Status.FLAGGED, f"benchmark {shape_text(bench.shape)}: "
                                f"{gbps:.0f} GB/s is "
                                f"{gbps / copy:.1f}x the copy bandwidth measured in this run "
                                f"({copy:.0f} GB/s): the timed calls cannot have moved the "
                                "bytes the task needs"))

    def _time_compiled(self) -> tuple[list[Samples | None], str | None]:
        """torch.compile of the reference, shape by shape, in its own process; and why it
        failed, if it did."""
        shapes = self.task.benchmarks[self.device.type]
        timings: list[Samples | None] = [None] * len(shapes)
        try:
            with self._sandbox("reference.compile.run.log", child_env({})) as box:
                self._call(box, self._load_request(self._reference_file, True, "Model",
                                                   compile=True),
                           self.task.limits.load_s, "load")
                for i, shape in enumerate(shapes):
                    if self._skips[i] is None:
                        timings[i] = self._samples(box, list(shape))
        except _Stop as stop:
            return timings, stop.verdict.reason
        return timings, None

    def _reference_table(self, start: list[Samples | None], end: list[Samples | None] | None,
                         compiled: tuple[list[Samples | None], str | None] | None
                         ) -> tuple[list[Benchmark], list[str]]:
        """The run's reference per shape (start and end, each alone and pooled), and notes on
        what failed or drifted."""
        table, notes, drifted = [], [], []
        failure = self._reference_worker.failure
        for i, shape in enumerate(self.task.benchmarks[self.device.type]):
            bench = Benchmark(shape=list(shape), dtype=self.task.benchmark_dtype,
                              skipped=self._skips[i])
            nbytes = self._traffic(bench.shape)
            if start[i] is None:
                bench.skipped = bench.skipped or f"the reference failed: {failure}"
            else:
                bench.reference = bench.reference_start = measurement.summarise([start[i]],
                                                                                nbytes)
                last = end[i] if end else None
                if last is not None:
                    bench.reference_end = measurement.summarise([last], nbytes)
                    bench.reference = measurement.summarise([start[i], last], nbytes)
                    bench.drift = measurement.drift(bench.reference_start, bench.reference_end)
                    if bench.drift:
                        drifted.append(f"{shape_text(shape)} {bench.drift}")
            if compiled and compiled[0][i]:
                bench.compiled = measurement.summarise([compiled[0][i]], nbytes)
            table.append(bench)
        if compiled and compiled[1]:
            notes.append(f"torch.compile of the reference failed, no speedups over it: "
                         f"{compiled[1]}")
        if end:
            notes += [f"the reference's process {w.name} failed during the run ({w.failure}); "
                      "shapes it could not time alongside a submission have no speedup for "
                      "that submission" for w in self._reference_rounds if w.failure]
        if drifted:
            notes.append("the machine drifted: the reference timed at the end of the run "
                         "disagrees with its start beyond noise on " + "; ".join(drifted)
                         + ". Speedups are not affected as much: each divides reference "
                         "rounds taken alternately with the submission's.")
        return table, notes

    def _copy_gbps(self, box: Sandbox) -> float | None:
        """Device-to-device copy bandwidth (bytes read plus written), by the same stopwatch."""
        nbytes = _COPY_BYTES[self.device.type]
        answer = self._call(box, {"op": "copy", "nbytes": nbytes, "timing": self._timing(1)},
                            self.task.limits.benchmark_s, "copy bandwidth")
        return measurement.summarise([self._checked(answer, "copy bandwidth")], 2 * nbytes).gbps

    def _traffic(self, shape: list[int]) -> int:
        """Bytes one call must move at least: the task's minimum traffic for this shape."""
        return self.task.min_traffic * math.prod(shape) * self._itemsize

    def _timing(self, rounds: int) -> dict:
        """The task's timing settings for one of ``rounds`` turns."""
        t = self.task.timing[self.device.type]
        return {"warmup_ms": t.warmup_ms, "min_samples": math.ceil(t.min_samples / rounds),
                "max_samples": math.ceil(t.max_samples / rounds),
                "budget_ms": t.budget_ms / rounds, "target_ci": t.target_ci,
                "mode": self.opts.timing}

    def _samples(self, box: Sandbox, shape: list[int], rounds: int = 1,
                 keep: bool = False) -> Samples:
        """One round of timing of one shape; the worker draws the inputs from secret seeds
        (see kbench.worker.serve) and, with ``keep``, holds some outputs for _verify."""
        stage = f"benchmark {shape_text(shape)}"
        answer = self._call(box, {"op": "time", "shape": shape, "keep": keep,
                                  "dtype": self.task.benchmark_dtype,
                                  "timing": self._timing(rounds)},
                            self.task.limits.benchmark_s, stage)
        return self._checked(answer, stage)

    def _checked(self, answer: dict, stage: str) -> Samples:
        try:
            return measurement.check(answer.get("samples"))
        except measurement.BadSamples as exc:
            raise _Stop(Verdict(Status.RUNTIME_ERROR, f"{stage}: {exc}")) from None

    def _unfit(self, shape: list[int]) -> str | None:
        """Why a benchmark shape cannot run here: an input, an output being made and two kept
        for verification must fit."""
        need = 4 * math.prod(shape) * self._itemsize
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            free, where = torch.cuda.mem_get_info(self.device)[0], "on the device"
        else:
            free = min(psutil.virtual_memory().available,
                       int(self.task.limits.host_memory_gib * 2**30))
            where = "in host memory (within limits.host_memory_gib)"
        if need > 0.9 * free:
            return f"needs about {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free {where}"
        return None

    # -- the boundary ----------------------------------------------------------------------

    def _sandbox(self, log_name: str, env: dict[str, str]) -> Sandbox:
        limits = self.task.limits
        return Sandbox(self.logs / log_name, env, memory_bytes=int(limits.host_memory_gib * 2**30),
                       log_bytes=int(limits.log_mib * 2**20))

    def _load_request(self, sub: Submission, instantiate: bool, class_name: str = "ModelNew",
                      compile: bool = False) -> dict:
        return {"op": "load", "path": str(sub.path.resolve()),
                "module_name": f"kbench_submission_{sub.name}", "class_name": class_name,
                "init_args": self.init_args, "device": self.device.type,
                "reference": self.task.reference, "instantiate": instantiate,
                "compile": compile}

    def _call(self, box: Sandbox, request: dict, timeout: float, stage: str) -> dict:
        """One request; any failure becomes a _Stop carrying the verdict it earns."""
        try:
            answer = box.request(request, timeout)
        except SandboxFailure as failure:
            raise _Stop(Verdict(failure.status, f"{stage}: {failure.message}")) from None
        if not answer["ok"]:
            error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
            raise _Stop(verdicts.from_error(error, stage, self.device.type, box.log_text()))
        return answer


class _ReferenceWorker:
    """An eager reference's process for the whole run: it never loads a candidate. The one
    named "reference" is timed at the start and the end and alongside each candidate; the
    others only in the rounds of launch-bound shapes (see Grader._time). On
    opening it passes the reference's own correctness cases (proof that the tolerances accept
    its arithmetic, and the same process history as a candidate's); "reference" then
    measures the copy bandwidth. If it dies it is opened again, up to _REOPEN times."""

    _REOPEN = 2

    def __init__(self, grader: Grader, name: str) -> None:
        self.grader = grader
        self.name = name  # of its log; the one named "reference" measures the copy bandwidth
        self.box: Sandbox | None = None
        self.copy_gbps: float | None = None
        self.failure: str | None = None
        self.opened = 0

    def __enter__(self) -> _ReferenceWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _close(self) -> None:
        if self.box is not None:
            self.box.close()
            self.box = None

    def samples(self, index: int, shape: list[int], rounds: int = 1) -> Samples | None:
        """One round at benchmark ``index``; None if the reference cannot be timed."""
        g = self.grader
        if g._skips[index] is not None:
            return None
        try:
            return g._samples(self._open(), shape, rounds)
        except _Stop as stop:
            self.failure = stop.verdict.reason
            self._close()
            return None

    def _open(self) -> Sandbox:
        if self.box is not None:
            return self.box
        if self.opened > self._REOPEN:
            raise _Stop(Verdict(Status.INTERNAL_ERROR, self.failure or "no reference"))
        self.opened += 1
        g = self.grader
        box = g._sandbox(f"{self.name}.run.log", child_env({}))
        try:
            g._call(box, g._load_request(g._reference_file, True, "Model"), g.task.limits.load_s,
                    "load")
            g._check(box, g._reference_file, None)
            if self.copy_gbps is None and self.name == "reference":
                self.copy_gbps = g._copy_gbps(box)
        except BaseException:
            box.close()
            raise
        self.box = box
        return box
