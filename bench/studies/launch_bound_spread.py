"""Where does the process-to-process spread of launch-bound timings come from?

    PYTHONPATH=. python bench/studies/launch_bound_spread.py --out DIR [--processes 8] \
        [--shape 16x16384] [--parts variants,calls]

variants: times the reference (F.normalize) with kbench's stopwatch in fresh processes, one
median per process, under variants of the stopwatch that each switch one thing off:

- kbench: as kbench times it (L2 flush, hold filling every SM, rotating input sets);
- no-flush: without the L2 flush;
- thin-hold: with a one-thread spin (torch.cuda._sleep) as the hold;
- no-rotation: one input set remade in place of the last, as kbench did before rotation;
- graph: `--timing graph`'s replay of many calls.

calls: the stock stopwatch in fresh processes, each timing four calls one after the other:
- events: a call that launches nothing (the start and end events alone);
- neg: one elementwise kernel (torch.neg of x);
- sum: one row reduction (x.sum(1));
- reference: F.normalize, three dependent kernels (norm, clamp, divide).

Prints each process's median and the spread (max - min) / median: the variant or call whose
spread shrinks or grows names the source. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ["kbench", "no-flush", "thin-hold", "no-rotation", "graph"]
CALLS = ["events", "neg", "sum", "reference"]


def child(variant: str, shape: tuple[int, int]) -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    from kbench.problems.load import load_task
    from kbench.reference.l2norm import Model, make_inputs
    from kbench.worker import timing

    if variant == "thin-hold":
        timing._spin_all_sms = lambda device: None
    if variant == "no-rotation":
        timing.rotation = lambda nbytes, device: 1
    settings = load_task("l2norm").timing["cuda"].stopwatch()
    model = Model().cuda()
    calls = {"events": lambda args: None, "neg": lambda args: torch.neg(args[0]),
             "sum": lambda args: args[0].sum(1), "reference": lambda args: model(*args)}
    medians = {}
    for name in CALLS if variant == "calls" else ["reference"]:
        with torch.no_grad():
            samples, _ = timing.measure(
                calls[name], lambda i: make_inputs(shape, "float32", "normal", 1000 + i, "cuda"),
                torch.device("cuda"), flush=variant != "no-flush",
                mode="graph" if variant == "graph" else "eager", **settings)
        medians[name] = statistics.median(samples.ms)
    print(json.dumps(medians))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--shape", default="16x16384")
    parser.add_argument("--parts", default="variants,calls")
    parser.add_argument("--child", choices=[*VARIANTS, "calls"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = tuple(int(v) for v in args.shape.split("x"))
    if args.child:
        child(args.child, shape)
        return
    parts = args.parts.split(",")
    runs = (VARIANTS if "variants" in parts else []) + (["calls"] if "calls" in parts else [])
    results = {}
    for variant in runs:
        medians: dict[str, list[float]] = {}
        for _ in range(args.processes):
            done = subprocess.run([sys.executable, __file__, "--child", variant,
                                   "--shape", args.shape], capture_output=True, text=True,
                                  check=True)
            for name, ms in json.loads(done.stdout.strip().splitlines()[-1]).items():
                medians.setdefault(name, []).append(ms)
        for name, ms in medians.items():
            label = name if variant == "calls" else variant
            spread = (max(ms) - min(ms)) / statistics.median(ms)
            results[label] = {"medians_ms": ms, "spread": spread}
            width = 1e3 * (max(ms) - min(ms))
            print(f"{label:12s} spread {100 * spread:5.2f}%  range {width:.3f} us  medians (us): "
                  + " ".join(f"{1e3 * m:.3f}" for m in ms), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"launch_bound_spread_{args.shape}.json").write_text(json.dumps(
            {"shape": args.shape, "results": results}, indent=1))


if __name__ == "__main__":
    main()
