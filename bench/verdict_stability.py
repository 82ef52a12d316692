"""Grade the same submissions many times, each with a fresh seed, and show any verdict that moved.

A verdict must not depend on a race: how loaded the machine is, how fast the grader looked.
This grades PATH... ``--runs`` times (fresh seed, fresh output folder, one build cache) and
prints one line per submission whose verdict differed between runs, or that none did.

    python bench/verdict_stability.py tests/fixtures/cpu tests/fixtures/cpu_timing \
        --task TASK.yaml --device cpu --runs 20

Exit status 1 when any verdict moved.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--task", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--jobs", default="2")
    args = parser.parse_args()
    seen: dict[str, list[str]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="kbench-stability-") as scratch:
        cache = Path(scratch) / "cache"
        for run in range(args.runs):
            out = Path(scratch) / f"run{run}"
            start = time.monotonic()
            subprocess.run([sys.executable, "-m", "kbench", "grade", *args.paths, "--task",
                            args.task, "--device", args.device, "--jobs", args.jobs, "--out",
                            str(out), "--cache-dir", str(cache)], cwd=ROOT, check=True,
                           stdout=subprocess.DEVNULL)
            results = json.loads((out / "results.json").read_text())
            for sub in results["submissions"]:
                seen[sub["name"]].append(sub["status"])
            moved = sorted(name for name, verdicts in seen.items() if len(set(verdicts)) > 1)
            print(f"run {run + 1}/{args.runs}: seed {results['seed']}, "
                  f"{time.monotonic() - start:.0f} s, {len(seen)} submissions, verdicts moved "
                  f"so far: {', '.join(moved) or 'none'}", flush=True)
            shutil.rmtree(out)
    moved = {name: verdicts for name, verdicts in seen.items() if len(set(verdicts)) > 1}
    for name, verdicts in sorted(moved.items()):
        counts = {v: verdicts.count(v) for v in sorted(set(verdicts))}
        print(f"MOVED {name}: {counts}")
    print(f"{len(seen)} submissions x {args.runs} runs: "
          + (f"{len(moved)} verdict(s) moved" if moved else "no verdict moved"))
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
