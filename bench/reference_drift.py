"""Is the launch-bound reference stable from one fresh process to the next?

Times the l2norm reference at one shape with kbench's stopwatch in several fresh processes,
some after the GPU sat idle and some right after a busy spell, and prints each median with the
SM clock NVML reported just before and just after (where nvidia-ml-py is installed).

    python bench/reference_drift.py [--shape 16 16384] [--runs 6] [--idle-s 5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CHILD = r"""
import json, sys, torch
from kbench.reference.l2norm import Model, make_inputs
from kbench.stats import estimate
from kbench.worker.timing import measure
shape, busy = json.loads(sys.argv[1]), sys.argv[2] == "busy"
if busy:  # a second of large copies first, so clocks are up
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
    end = __import__("time").perf_counter() + 1.0
    while __import__("time").perf_counter() < end: b.copy_(a)
    torch.cuda.synchronize(); del a, b
(x,) = make_inputs(tuple(shape), "float32", "normal", 1, "cuda")
model = Model()
with torch.no_grad():
    s = measure(lambda: model(x), torch.device("cuda"), warmup_ms=100, min_samples=10,
                max_samples=1000, budget_ms=3000, target_ci=0.005)
e = estimate(s)
print(json.dumps({"median_ms": e.median, "low": e.low, "high": e.high, "n": e.samples}))
"""


def sm_clock() -> str:
    try:
        import pynvml
    except ImportError:
        return "-"
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return str(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=2, default=[16, 16384])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--idle-s", type=float, default=5.0)
    args = parser.parse_args()
    print("run  state  median_ms  95%_interval        samples  sm_mhz_before  sm_mhz_after")
    for i in range(args.runs):
        state = "busy" if i % 2 else "idle"
        if state == "idle":
            time.sleep(args.idle_s)
        before = sm_clock()
        out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args.shape), state],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"{i:>3}  {state:5}  {r['median_ms']:.5f}    {r['low']:.5f}-{r['high']:.5f}  "
              f"{r['n']:>7}  {before:>13}  {sm_clock():>12}")


if __name__ == "__main__":
    main()
