"""The trusted side of grading: build, check, time, decide. It never imports a submission.

One submission's path through this file: ``_build`` (its own process and build folder, in
parallel with the others) -> ``_evaluate``: a fresh process imports it, ``_check`` feeds it each
case and compares its output with the reference computed here afterwards, ``_time`` times it
shape by shape -> a Verdict and a SubmissionResult, stored at once. ``_time_reference`` puts
the reference through the same checks and stopwatch in a process that never saw a candidate.
"""

from __future__ import annotations

import math
import random
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from kbench import __version__, environment, scan, stats
from kbench import verdict as verdicts
from kbench.build import build_dir, find_toolchain
from kbench.cases import Case, plan_cases, select
from kbench.compare import compare
from kbench.discovery import Submission
from kbench.results import Benchmark, SubmissionResult
from kbench.sandbox import Sandbox, SandboxFailure, child_env, remove_stale_logs
from kbench.store import Store
from kbench.task import Task
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

    def resumable(self) -> dict:
        """What ``--resume`` must repeat besides the seed."""
        return {"device": self.device, "case_indices": self.case_indices,
                "cuda_arch": self.cuda_arch}


# Copy-bandwidth buffers (each of source and destination): far past any cache.
_COPY_BYTES = {"cuda": 1 << 30, "cpu": 256 << 20}


@dataclass(frozen=True)
class _Built:
    verdict: Verdict | None
    seconds: float


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
        self.toolchain = find_toolchain(options.cuda_arch)
        self.cases = select(plan_cases(task, options.seed), options.case_indices)
        self.timed = options.case_indices is None
        self.logs = options.out_dir / "logs"

    # -- the run ---------------------------------------------------------------------------

    def grade(self, submissions: list[Submission], store: Store, run_id: int | None = None,
              force: bool = False,
              on_result: Callable[[SubmissionResult], None] = lambda r: None) -> int:
        """Grade into ``store``: a new run, or the rest of ``run_id``. Each result is stored the
        moment it is known. Returns the run's id."""
        env = environment.describe(self.device.type, self.toolchain)
        fingerprint = environment.fingerprint(env)
        if run_id is None:
            run_id = store.start_run(
                kbench_version=__version__, task=self.task.name, task_hash=self.task.digest,
                seed=self.opts.seed, device=self.device.type, fingerprint=fingerprint,
                options=self.opts.resumable(), environment=env)
        remove_stale_logs(self.logs)
        graded = store.graded_names(run_id)
        todo = []
        for sub in submissions:
            if sub.name in graded:
                continue
            earlier = None if force or not self.timed else store.reusable(
                sub.sha256, self.task.digest, __version__, fingerprint)
            if earlier is None:
                todo.append(sub)
                continue
            result = earlier[1]  # the same bytes, perhaps under another name
            result.name, result.path, result.reused_from_run = sub.name, str(sub.path), earlier[0]
            store.add_result(run_id, result)
            on_result(result)
        if todo:
            self._grade_anew(todo, store, run_id, on_result)
        store.finish_run(run_id)
        return run_id

    def _grade_anew(self, submissions: list[Submission], store: Store, run_id: int,
                    on_result: Callable[[SubmissionResult], None]) -> None:
        self.say(f"building {len(submissions)} submission(s), {self.opts.jobs} at a time")
        with ThreadPoolExecutor(max_workers=self.opts.jobs) as pool:
            built = dict(zip(submissions, pool.map(self._build, submissions), strict=True))
        reference: list[Benchmark] = []
        if self.timed:
            self.say(f"timing the reference on {len(self.task.benchmarks[self.device.type])} "
                     "shape(s)")
            reference, copy_gbps = self._time_reference()
            store.set_reference(run_id, reference, copy_gbps, [])
        else:
            store.set_reference(run_id, [], None, ["timing skipped: --case selects correctness "
                                                   "cases only"])
        for sub in submissions:
            result = self._evaluate(sub, built[sub], reference)
            store.add_result(run_id, result)
            on_result(result)

    # -- build -----------------------------------------------------------------------------

    def _build(self, sub: Submission) -> _Built:
        """Import the submission once in its own process: this compiles its extensions."""
        if scan.needs_cuda(sub.path.read_text(errors="replace")) and not self.toolchain.cuda_home:
            return _Built(Verdict(Status.SKIPPED, "compiles CUDA code and no CUDA toolkit was "
                                  "found here (set CUDA_HOME to one with bin/nvcc)"), 0.0)
        start = time.monotonic()
        try:
            with self._sandbox(f"{sub.name}.build.log", self._build_env(sub)) as box:
                self._call(box, self._load_request(sub, instantiate=False),
                           self.task.limits.build_s, "build")
        except _Stop as stop:
            return _Built(stop.verdict, time.monotonic() - start)
        return _Built(None, time.monotonic() - start)

    def _build_env(self, sub: Submission) -> dict[str, str]:
        folder = build_dir(self.opts.cache_dir, sub.path, self.toolchain)
        folder.mkdir(parents=True, exist_ok=True)
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
                    self._check(box, sub, result)
                    if self.timed:
                        self._time(box, result, reference)
                verdict = Verdict(Status.OK)
            except _Stop as stop:
                verdict, result.failure = stop.verdict, stop.failure
            except Exception as exc:  # a kbench bug must not end the run or blame the submission
                traceback.print_exc()
                verdict = Verdict(Status.INTERNAL_ERROR, f"kbench failed: {exc!r}")
        result.status, result.reason = verdict.status, verdict.reason
        return result

    def _check(self, box: Sandbox, sub: Submission, result: SubmissionResult | None) -> None:
        """Every case: fresh inputs here, the candidate's output back, the reference after.
        Passed cases are counted in ``result``; the first failure raises _Stop."""
        for case in self.cases:
            inputs = self.reference.make_inputs(case.shape, case.dtype, case.distribution,
                                                case.seed, self.device)
            try:
                answer = self._call(box, {"op": "run", "inputs": [t.clone() for t in inputs]},
                                    self.task.limits.case_s, case.describe())
            except _Stop as stop:
                stop.failure = self._failure(sub, case)
                raise
            out = answer["output"]
            if out is None:
                raise _Stop(Verdict(Status.WRONG_OUTPUT, f"{case.describe()}: returned "
                                    f"{answer.get('output_type')}, expected torch.Tensor"),
                            self._failure(sub, case))
            if type(out) is torch.Tensor:
                out = out.clone()  # own copy: the worker's memory is its to change
            del answer
            with torch.no_grad():
                expected = self.ref_model(*inputs)
                exact = self.ref_model(*[t.to(torch.float64) for t in inputs])
            outcome = compare(out, expected, exact, self.task.tolerance[case.dtype])
            if not outcome.ok:
                failure = self._failure(sub, case)
                failure.update(max_abs_err=outcome.max_abs_err, max_rel_err=outcome.max_rel_err)
                raise _Stop(Verdict(Status.WRONG_OUTPUT, f"{case.describe()}: {outcome.reason}"),
                            failure)
            if result is not None:
                result.cases_passed += 1

    def _failure(self, sub: Submission, case: Case) -> dict:
        return {"case": case.to_dict(),
                "reproduce": f"kbench grade {sub.path} --seed {self.opts.seed} "
                             f"--case {case.index} --device {self.device.type}"}

    # -- time ------------------------------------------------------------------------------

    def _time(self, box: Sandbox, result: SubmissionResult, reference: list[Benchmark]) -> None:
        for i, ref in enumerate(reference):
            bench = Benchmark(shape=ref.shape, dtype=ref.dtype, ref_ms=ref.ref_ms,
                              ref_ci=ref.ref_ci, ref_samples=ref.ref_samples,
                              ref_gbps=ref.ref_gbps, skipped=ref.skipped)
            result.benchmarks.append(bench)
            if ref.skipped:
                continue
            est = self._samples(box, i, ref.shape)
            bench.ms, bench.ci, bench.samples = est.median, [est.low, est.high], est.samples
            bench.gbps = self._gbps(ref.shape, est.median)
            ref_est = stats.Estimate(ref.ref_ms, *ref.ref_ci, ref.ref_samples)
            bench.speedup, *bench.speedup_ci = stats.ratio(ref_est, est)
        timed = [b for b in result.benchmarks if b.speedup]
        result.speedup = stats.geomean([b.speedup for b in timed])
        if timed:
            result.speedup_ci = [stats.geomean([b.speedup_ci[k] for b in timed]) for k in (0, 1)]

    def _time_reference(self) -> tuple[list[Benchmark], float | None]:
        """The reference's timings per shape, and the device's copy bandwidth in GB/s."""
        dtype = self.task.benchmark_dtype
        benches = [Benchmark(shape=list(s), dtype=dtype)
                   for s in self.task.benchmarks[self.device.type]]
        reference = Submission("reference", Path(self.reference.__file__))
        copy_gbps = None
        try:
            with self._sandbox("reference.run.log", child_env({})) as box:
                self._call(box, self._load_request(reference, True, "Model"),
                           self.task.limits.load_s, "load")
                # The reference passes its own cases too: proof that the tolerances accept its
                # arithmetic, and the same process history as a candidate's before timing.
                self._check(box, reference, None)
                copy_gbps = self._copy_gbps(box)
                for i, bench in enumerate(benches):
                    bench.skipped = self._unfit(bench.shape)
                    if bench.skipped is None:
                        est = self._samples(box, i, bench.shape)
                        bench.ref_ms, bench.ref_ci = est.median, [est.low, est.high]
                        bench.ref_samples = est.samples
                        bench.ref_gbps = self._gbps(bench.shape, est.median)
        except _Stop as stop:
            for bench in benches:
                if bench.ref_ms is None and bench.skipped is None:
                    bench.skipped = f"the reference failed: {stop.verdict.reason}"
        return benches, copy_gbps

    def _copy_gbps(self, box: Sandbox) -> float:
        """Device-to-device copy bandwidth (bytes read plus written), by the same stopwatch."""
        nbytes = _COPY_BYTES[self.device.type]
        est = self._timed(box, {"op": "copy", "nbytes": nbytes}, "copy bandwidth")
        return 2 * nbytes / (est.median * 1e-3) / 1e9

    def _gbps(self, shape: list[int], ms: float) -> float:
        """Achieved GB/s: the task's minimum traffic for this shape over the median time."""
        return self.task.min_traffic * math.prod(shape) * self._itemsize() / (ms * 1e-3) / 1e9

    def _itemsize(self) -> int:
        return torch.empty(0, dtype=getattr(torch, self.task.benchmark_dtype)).element_size()

    def _samples(self, box: Sandbox, index: int, shape: list[int]) -> stats.Estimate:
        """Timing for benchmark ``index``; same inputs (by seed) for every side."""
        seed = random.Random(f"{self.opts.seed}/benchmark/{index}").getrandbits(62)
        return self._timed(box, {"op": "time", "shape": shape, "seed": seed,
                                 "dtype": self.task.benchmark_dtype},
                           f"benchmark {'x'.join(map(str, shape))}")

    def _timed(self, box: Sandbox, request: dict, stage: str) -> stats.Estimate:
        """Send a timing request with the task's settings; check and summarise the samples."""
        answer = self._call(box, {**request, "timing": vars(self.task.timing[self.device.type])},
                            self.task.limits.benchmark_s, stage)
        samples = answer.get("samples_ms")
        if (not isinstance(samples, list) or not samples
                or not all(isinstance(s, float) and math.isfinite(s) and s > 0 for s in samples)):
            raise _Stop(Verdict(Status.RUNTIME_ERROR, f"{stage}: the worker sent no valid timings"))
        return stats.estimate(samples)

    def _unfit(self, shape: list[int]) -> str | None:
        """Why a benchmark shape cannot run here (input, output and one temporary must fit)."""
        need = 3 * math.prod(shape) * self._itemsize()
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

    def _load_request(self, sub: Submission, instantiate: bool,
                      class_name: str = "ModelNew") -> dict:
        return {"op": "load", "path": str(sub.path.resolve()),
                "module_name": f"kbench_submission_{sub.name}", "class_name": class_name,
                "init_args": self.init_args, "device": self.device.type,
                "reference": self.task.reference, "instantiate": instantiate}

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
