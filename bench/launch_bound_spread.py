"""Where does the process-to-process spread of launch-bound timings come from?

    PYTHONPATH=. python bench/launch_bound_spread.py --out DIR [--processes 8] [--shape 16x16384]

Times the reference (F.normalize) with kbench's stopwatch in fresh processes, one median per
process, under variants of the stopwatch that each switch one thing off:

- kbench: as kbench times it (L2 flush, hold filling every SM, rotating input sets);
- no-flush: without the L2 flush;
- thin-hold: with a one-thread spin (torch.cuda._sleep) as the hold;
- no-rotation: one input set remade in place of the last, as kbench did before rotation;
- graph: `--timing graph`'s replay of many calls.

Prints, per variant, each process's median and the spread (max - min) / median: the variant
whose spread shrinks names the source. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ["kbench", "no-flush", "thin-hold", "no-rotation", "graph"]


def child(variant: str, shape: tuple[int, int]) -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    from kbench.reference.l2norm import Model, make_inputs
    from kbench.task import load_task
    from kbench.worker import timing

    if variant == "thin-hold":
        timing._spin_all_sms = lambda device: None
    if variant == "no-rotation":
        timing.rotation = lambda nbytes, device: 1
    settings = vars(load_task("l2norm").timing["cuda"]).copy()
    settings.pop("compile_reference")
    model = Model().cuda()
    with torch.no_grad():
        samples, _ = timing.measure(
            lambda args: model(*args),
            lambda i: make_inputs(shape, "float32", "normal", 1000 + i, "cuda"),
            torch.device("cuda"), flush=variant != "no-flush",
            mode="graph" if variant == "graph" else "eager", **settings)
    print(json.dumps({"median": statistics.median(samples.ms), "samples": len(samples.ms)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--shape", default="16x16384")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = tuple(int(v) for v in args.shape.split("x"))
    if args.child:
        child(args.child, shape)
        return
    results = {}
    for variant in VARIANTS:
        medians = []
        for _ in range(args.processes):
            done = subprocess.run([sys.executable, __file__, "--child", variant,
                                   "--shape", args.shape], capture_output=True, text=True,
                                  check=True)
            medians.append(json.loads(done.stdout.strip().splitlines()[-1])["median"])
        spread = (max(medians) - min(medians)) / statistics.median(medians)
        results[variant] = {"medians_ms": medians, "spread": spread}
        print(f"{variant:12s} spread {100 * spread:5.2f}%  medians (us): "
              + " ".join(f"{1e3 * m:.2f}" for m in medians), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "launch_bound_spread.json").write_text(json.dumps(
            {"shape": args.shape, "results": results}, indent=1))


if __name__ == "__main__":
    main()
