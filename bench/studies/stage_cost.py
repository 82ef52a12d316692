"""Where a timing stage's seconds go, on this machine's GPU, part by part:

- ``stopwatch``: one round of kbench's stopwatch (kbench.worker.timing) at each of a task's CUDA
  benchmark sizes on its reference, as the full profile asks for it, and then the same steps
  one by one: what a sample costs beside the call it times (fresh inputs, the cache flush,
  the hold and events, the idle probe, the clocks, the fingerprint);
- ``profiler``: what the custom-kernel share's profiled call costs (kbench.worker.kernels), the
  first in a process and the next;
- ``compile``: torch.compile of the reference, its first call at the first size, on two cores
  and on every core.

    python bench/studies/stage_cost.py [--task l2norm] [--parts stopwatch profiler compile] \
        [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from kbench.grading.options import RIGOUR, Profile  # noqa: E402
from kbench.problems.load import load_task  # noqa: E402
from kbench.shared import inputs  # noqa: E402
from kbench.shared.fingerprint import fingerprint  # noqa: E402
from kbench.worker import timing  # noqa: E402
from kbench.worker.hold import Hold, idle_probe, timed_cuda  # noqa: E402
from kbench.worker.kernels import kernels_of  # noqa: E402


def _model_and_draw(task_name: str, params: dict):
    task = load_task(task_name, task_name)
    module = task.reference_module()
    dtype = task.benchmark_dtype
    device = torch.device("cuda")
    init = inputs.init_inputs(module, params, 0)
    model = inputs.build(module.Model, init, 0, device, dtype, task.mode == "eval")
    distribution = task.correctness.distributions[0]
    seeds = iter(range(1, 10**9))
    return task, model, lambda: inputs.draw(module, params, dtype, distribution, next(seeds),
                                            device)


def stopwatch(task_name: str) -> list[dict]:
    task = load_task(task_name, task_name)
    t, rigour = task.timing["cuda"], RIGOUR[Profile.FULL]
    rows = []
    for params in task.benchmarks["cuda"]:
        _, model, draw = _model_and_draw(task_name, dict(params))
        share = rigour.share / rigour.rounds
        settings = dict(warmup_ms=t.warmup_ms, min_samples=max(1, round(t.min_samples * share)),
                        max_samples=round(t.max_samples * share), budget_ms=t.budget_ms * share,
                        target_ci=t.target_ci)
        with torch.no_grad():
            start = time.perf_counter()
            samples, kept = timing.measure(lambda args, m=model: m(*args),
                                           lambda i, d=draw: d(), torch.device("cuda"),
                                           **settings)
            round_s = time.perf_counter() - start
            del kept
            torch.cuda.empty_cache()
            steps = _steps(model, draw)
        rows.append({"size": dict(params), "round_s": round(round_s, 3),
                     "samples": len(samples.ms), "call_ms": round(statistics.median(samples.ms), 4),
                     "per_sample_ms": round((round_s - settings["warmup_ms"] / 1e3)
                                            / len(samples.ms) * 1e3, 3), "steps_ms": steps})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _steps(model, draw, n: int = 30) -> dict[str, float]:
    """The mean ms of each step of a sample, taken one at a time."""
    device = torch.device("cuda")
    cache = timing._ColdCache(device, True)
    clocks = timing._clocks(device)
    hold = Hold(device, clocks.max_sm_mhz)
    spent: dict[str, list[float]] = {}

    def step(name, fn):
        start = time.perf_counter()
        value = fn()
        torch.cuda.synchronize()
        spent.setdefault(name, []).append((time.perf_counter() - start) * 1e3)
        return value

    model(*draw())
    for _ in range(n):
        args = step("fresh inputs", draw)
        step("flush", cache.cool)
        timed = step("hold + call + busy after",
                     lambda a=args: timed_cuda(lambda: model(*a), hold))
        if timed is not None:
            step("idle probe", lambda t=timed: idle_probe(hold.ms + t[0] - t[2],
                                                          hold.cycles_per_ms))
        out = model(*args)
        torch.cuda.synchronize()  # its output for the fingerprint, not timed
        step("clocks", clocks.read)
        step("fingerprint", lambda o=out: fingerprint(o))
    return {k: round(statistics.fmean(v), 4) for k, v in spent.items()}


def profiler(task_name: str) -> dict:
    task = load_task(task_name, task_name)
    _, model, draw = _model_and_draw(task_name, dict(task.benchmarks["cuda"][0]))
    costs = []
    with torch.no_grad():
        for _ in range(3):
            start = time.perf_counter()
            kernels_of(model, draw())
            costs.append(round(time.perf_counter() - start, 3))
    row = {"profiled_call_s": costs}
    print(json.dumps(row), flush=True)
    return row


_COMPILE = """import sys, time, torch
sys.path.insert(0, sys.argv[1])
from bench.studies.stage_cost import _model_and_draw
from kbench.problems.load import load_task
task = load_task(sys.argv[2], sys.argv[2])
_, model, draw = _model_and_draw(sys.argv[2], dict(task.benchmarks["cuda"][0]))
compiled = torch.compile(model)
start = time.perf_counter()
with torch.no_grad():
    compiled(*draw())
torch.cuda.synchronize()
print(round(time.perf_counter() - start, 2))
"""


def compile_cost(task_name: str) -> dict:
    root = str(Path(__file__).resolve().parents[2])
    every = sorted(os.sched_getaffinity(0))
    row = {}
    for cores in (every[:2], every):
        env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
        out = subprocess.run(["taskset", "-c", ",".join(map(str, cores)), sys.executable, "-c",
                              _COMPILE, root, task_name], capture_output=True, text=True,
                             env=env, timeout=300)
        row[f"first_call_s_on_{len(cores)}_cores"] = out.stdout.strip().splitlines()[-1:] \
            or out.stderr[-300:]
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="l2norm")
    parser.add_argument("--parts", nargs="+", default=["stopwatch", "profiler", "compile"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    parts = {"stopwatch": stopwatch, "profiler": profiler, "compile": compile_cost}
    found = {part: parts[part](args.task) for part in args.parts}
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
