"""Evidence that kbench's stopwatch can be trusted (issue 3); results go in docs/timing.md.

    python bench/studies/timing_evidence.py --out DIR [--runs 5] [--parts repeat,agree,flush]
        [--timing eager|graph] [--shapes N]

Parts (each prints a Markdown table; all are saved in DIR/evidence.json and DIR/evidence.md):
- repeat: grade a torch-only submission, l2norm_v1 and l2norm_v3 ``--runs`` times, each a fresh
  ``kbench grade --force`` process with a fresh seed, and report each shape's speedup spread
  (max - min) / median, the verdicts, the copy bandwidth and the reference's GB/s per run.
  Runs already in DIR/repeat/runN/results.json are kept, so the runs can span several calls;
- agree: the reference and l2norm_v3 timed by kbench's stopwatch, by Nsight Compute's
  ``gpu__time_duration`` (``--clock-control none``; where ``ncu`` is on PATH) and by
  torch.profiler's kernel durations (CUPTI), cold cache every way, per shape. The target is
  judged on ncu where it ran, else on the profiler;
- flush: the reference at the smallest and largest shape, with and without the cache flush.

Needs a CUDA GPU; the torch.compile baseline is left out of the repeated grades to save time.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from l2norm_dev import load  # noqa: E402  (bench/l2norm_dev.py: kbench's build folder)

from kbench.problems.load import load_task  # noqa: E402
from kbench.reference.l2norm import Model, make_inputs  # noqa: E402
from kbench.shared import stats  # noqa: E402
from kbench.worker.timing import measure  # noqa: E402

SUBMISSIONS = [ROOT / "bench" / "submissions" / "l2norm_torch_only.py",
               ROOT / "kbench" / "submissions" / "l2norm_v1.py",
               ROOT / "kbench" / "submissions" / "l2norm_v3.py"]
LAUNCH_BOUND_MS = 0.1  # the line between launch-bound shapes and the rest


def table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# -- repeat ------------------------------------------------------------------------------------

def repeat(out: Path, runs: int, save, timing: str, shapes: int | None) -> tuple[dict, str]:
    raw = yaml.safe_load((ROOT / "tasks" / "l2norm.yaml").read_text())
    raw["timing"]["compile_reference"] = False
    if shapes:
        raw["benchmarks"]["cuda"] = raw["benchmarks"]["cuda"][:shapes]
    task_dir = Path(tempfile.mkdtemp())
    (task_dir / "l2norm.yaml").write_text(yaml.safe_dump(raw))
    results = []
    for i in range(runs):
        folder = out / "repeat" / f"run{i + 1}"
        if (folder / "results.json").exists():  # from an earlier call with the same --out
            results.append(json.loads((folder / "results.json").read_text()))
            continue
        cmd = [sys.executable, "-m", "kbench", "grade", *map(str, SUBMISSIONS), "--force",
               "--task", str(task_dir / "l2norm.yaml"), "--out", str(folder), "--timing", timing]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "grade.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise SystemExit(f"run {i + 1} failed ({done.returncode}); see {folder}/grade.log")
        results.append(json.loads((folder / "results.json").read_text()))
        print(f"repeat: run {i + 1}/{runs} done", flush=True)
        save(*repeat_table(results))  # partial evidence survives a cut-off
    return repeat_table(results)


def repeat_table(results: list[dict]) -> tuple[dict, str]:
    runs = len(results)
    ref_ms = {tuple(b["params"].values()): b["reference"]["ms"] for b in results[0]["reference"]
              if b["reference"]}
    rows, data = [], {"runs": runs, "device": results[0]["environment"]["device_name"],
                      "submissions": {}, "copy_gbps": [], "reference_gbps": {}, "drift": []}
    for r in results:
        data["copy_gbps"].append(r["copy_gbps"])
        data["drift"] += r["notes"]
        for b in r["reference"]:
            if b["reference"]:
                name = "x".join(map(str, b["params"].values()))
                data["reference_gbps"].setdefault(name, []).append(b["reference"]["gbps"])
    for path in SUBMISSIONS:
        name = path.stem
        subs = [next(s for s in r["submissions"] if s["name"] == name) for r in results]
        verdicts = sorted({s["status"] for s in subs})
        entry = data["submissions"][name] = {"verdicts": [s["status"] for s in subs],
                                             "shapes": {}}
        if verdicts != ["ok"]:
            rows.append([name, "/".join(verdicts), "-", "not timed (not correct)", "-", "-"])
            continue
        for k, bench in enumerate(subs[0]["benchmarks"]):
            shape = tuple(bench["params"].values())
            speedups = [s["benchmarks"][k]["speedup"] for s in subs]
            if None in speedups:
                continue
            spread = (max(speedups) - min(speedups)) / statistics.median(speedups)
            limit = 0.03 if ref_ms[shape] < LAUNCH_BOUND_MS else 0.01
            entry["shapes"]["x".join(map(str, shape))] = {"speedups": speedups,
                                                          "spread": spread, "limit": limit}
            rows.append([name, "ok", "x".join(map(str, shape)),
                         " ".join(f"{v:.4f}" for v in speedups), f"{100 * spread:.2f}%",
                         f"{'pass' if spread <= limit else 'FAIL'} (<= {100 * limit:.0f}%)"])
    text = table(["submission", "verdicts", "shape", "speedup per run", "spread", "target"],
                 rows)
    copy = data["copy_gbps"]
    text += (f"\n\nCopy bandwidth per run (GB/s): {', '.join(f'{c:.0f}' for c in copy)}\n\n"
             + table(["shape", "reference GB/s per run", "% of copy (run 1)"],
                     [[s, ", ".join(f"{g:.0f}" for g in gs), f"{100 * gs[0] / copy[0]:.0f}%"]
                      for s, gs in data["reference_gbps"].items()]))
    if data["drift"]:
        text += "\n\nNotes from the runs:\n" + "\n".join(f"- {n}" for n in data["drift"])
    return data, text


# -- agree -------------------------------------------------------------------------------------

def cold_calls(model, x: torch.Tensor, calls: int, mark=contextlib.nullcontext) -> None:
    """``calls`` calls of ``model(x)``, each after an L2 flush as kbench does and inside
    ``mark()``, with the device idle before and after each."""
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size,
                        dtype=torch.uint8, device="cuda")
    for _ in range(calls):
        flush.zero_()
        torch.cuda.synchronize()
        with mark():
            model(x)
            torch.cuda.synchronize()


def profiled_ms(model, x: torch.Tensor, calls: int) -> float:
    """Mean GPU time per call of ``model(x)``'s own kernels, from torch.profiler (CUPTI),
    cold as kbench times them."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    model(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(x)
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == DeviceType.CUDA}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        cold_calls(model, x, calls)
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA and e.name in names]
    return sum(e.time_range.elapsed_us() for e in kernels) / calls / 1e3


NCU_RANGE = "kbench_call"  # the NVTX range around each call ncu profiles


def model_for(side: str):
    return Model().cuda() if side == "reference" else load(side).ModelNew().cuda()


def calls_for(shape: tuple[int, int]) -> int:
    return 20 if math.prod(shape) < 1 << 28 else 5


def ncu_child(side: str, shape: tuple[int, int]) -> None:
    """The program ncu runs: ``side``'s calls at ``shape``, each after an L2 flush and inside
    the NVTX range ncu is told to profile."""
    model = model_for(side)
    (x,) = make_inputs(shape, "float32", "normal", 7, "cuda")
    with torch.no_grad():
        model(x)
        cold_calls(model, x, calls_for(shape), lambda: torch.cuda.nvtx.range(NCU_RANGE))


def ncu_ms(side: str, shape: tuple[int, int]) -> float | None:
    """Mean GPU time per call of ``side``'s kernels at ``shape`` by Nsight Compute
    (``gpu__time_duration``, clocks and caches left as they are, the L2 flushed before each
    call as kbench does); None where ``ncu`` is not installed."""
    ncu = shutil.which("ncu")
    if ncu is None:
        return None
    cmd = [ncu, "--clock-control", "none", "--cache-control", "none", "--nvtx",
           "--nvtx-include", f"{NCU_RANGE}/", "--metrics", "gpu__time_duration.sum",
           "--print-units", "base", "--csv", sys.executable, __file__, "--ncu-child", side,
           "x".join(map(str, shape))]
    done = subprocess.run(cmd, capture_output=True, text=True)
    rows = list(csv.reader(line for line in done.stdout.splitlines() if line.startswith('"')))
    if done.returncode != 0 or len(rows) < 2:
        raise SystemExit(f"ncu failed ({done.returncode}):\n{done.stdout[-2000:]}"
                         f"{done.stderr[-2000:]}")
    value = rows[0].index("Metric Value")
    return sum(float(r[value].replace(",", "")) for r in rows[1:]) / calls_for(shape) / 1e6


def kbench_ms(model, shape: tuple[int, int], flush: bool = True) -> stats.Estimate:
    settings = load_task("l2norm").timing["cuda"].stopwatch()
    with torch.no_grad():
        samples, _ = measure(lambda args: model(*args),
                             lambda i: make_inputs(shape, "float32", "normal", 100 + i, "cuda"),
                             torch.device("cuda"), flush=flush, **settings)
    return stats.estimate(samples.ms)


def agree() -> tuple[dict, str]:
    shapes = [tuple(p.values()) for p in load_task("l2norm").benchmarks["cuda"]]
    rows, data = [], []
    for side in ("reference", "l2norm_v3"):
        model = model_for(side)
        for shape in shapes:
            est = kbench_ms(model, shape)
            (x,) = make_inputs(shape, "float32", "normal", 7, "cuda")
            with torch.no_grad():
                prof = profiled_ms(model, x, calls_for(shape))
            del x
            torch.cuda.empty_cache()
            ncu = ncu_ms(side, shape)
            judged = ncu if ncu is not None else prof
            diff = est.median / judged - 1
            checked = est.median >= LAUNCH_BOUND_MS
            data.append({"side": side, "shape": list(shape), "kbench_ms": est.median,
                         "ncu_ms": ncu, "profiler_ms": prof, "diff": diff,
                         "judged_on": "ncu" if ncu is not None else "profiler"})
            verdict = ("pass" if abs(diff) <= 0.03 else "FAIL") if checked else "launch-bound"
            rows.append([side, "x".join(map(str, shape)), f"{est.median:.4f}",
                         "-" if ncu is None else f"{ncu:.4f}", f"{prof:.4f}",
                         f"{100 * diff:+.2f}%", verdict])
            print(f"agree: {side} {shape} done", flush=True)
        del model
    return {"rows": data}, table(["side", "shape", "kbench median ms", "ncu ms per call",
                                  "profiler ms per call", "kbench vs ncu (else profiler)",
                                  "<= 3% above 0.1 ms"], rows)


# -- flush -------------------------------------------------------------------------------------

def flush_effect() -> tuple[dict, str]:
    shapes = [tuple(p.values()) for p in load_task("l2norm").benchmarks["cuda"]]
    model = Model().cuda()
    rows, data = [], []
    for shape in (shapes[0], shapes[-1]):
        cold, warm = kbench_ms(model, shape), kbench_ms(model, shape, flush=False)
        change = warm.median / cold.median - 1
        data.append({"shape": list(shape), "flushed_ms": cold.median, "unflushed_ms": warm.median,
                     "change": change, "disjoint": stats.disagree(cold, warm)})
        rows.append(["x".join(map(str, shape)),
                     f"{cold.median:.5f} ({cold.low:.5f}-{cold.high:.5f})",
                     f"{warm.median:.5f} ({warm.low:.5f}-{warm.high:.5f})",
                     f"{100 * change:+.2f}%", "yes" if stats.disagree(cold, warm) else "no"])
        torch.cuda.empty_cache()
    return {"rows": data}, table(["shape", "flushed: median ms (95%)", "not flushed", "change",
                                  "beyond noise"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--parts", default="repeat,agree,flush")
    parser.add_argument("--timing", choices=["eager", "graph"], default="eager",
                        help="timing mode of the repeated grades")
    parser.add_argument("--shapes", type=int, help="repeat: only the task's first N shapes")
    parser.add_argument("--ncu-child", nargs=2, metavar=("SIDE", "SHAPE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ncu_child:
        side, shape = args.ncu_child
        ncu_child(side, tuple(int(v) for v in shape.split("x")))
        return
    if args.out is None:
        parser.error("--out is required")
    if not torch.cuda.is_available():
        raise SystemExit("timing_evidence.py needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    evidence: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    text = [f"# kbench timing evidence on {evidence['device']} (torch {torch.__version__})"]
    sections: dict[str, str] = {}

    def save(name: str, data: dict, md: str) -> None:
        evidence[name], sections[name] = data, md
        (args.out / "evidence.json").write_text(json.dumps(evidence, indent=2))
        (args.out / "evidence.md").write_text("\n".join(
            text + [f"\n## {n}\n\n{m}" for n, m in sections.items()]) + "\n")

    parts = {"repeat": lambda: repeat(args.out, args.runs, lambda d, m: save("repeat", d, m),
                                      args.timing, args.shapes),
             "agree": agree, "flush": flush_effect}
    for name in args.parts.split(","):
        data, md = parts[name]()
        save(name, data, md)
        print(f"\n## {name}\n\n{md}\n", flush=True)


if __name__ == "__main__":
    main()
