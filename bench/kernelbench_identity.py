"""Grade ModelNew = Model against every problem of a KernelBench checkout: how many problems
kbench takes as they are. Writes one candidate per problem (the problem's own source plus
`ModelNew = Model`) in the `<level>/<problem>/identity.py` layout outside the repository,
runs `kbench grade` on them, and prints which problems did not pass and why.

    python bench/kernelbench_identity.py /path/to/KernelBench --levels 1 2 3 --device cpu

``--shards N`` splits the problems over N kbench runs side by side (each with its share of
the cores), for a host with many cores; the summary covers them all.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def write_candidates(problems: Path, levels: list[int], folder: Path, only: list[str],
                     shards: int) -> int:
    """One identity candidate per problem, problem k under shard k mod ``shards``."""
    count = 0
    for level in levels:
        for problem in sorted((problems / f"level{level}").glob("*.py")):
            if only and not any(word in problem.stem for word in only):
                continue
            shard = folder / str(count % shards)
            target = shard / f"level{level}" / problem.stem / "identity.py"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(problem.read_text() + "\n\nModelNew = Model\n")
            count += 1
    return count


def grade(subs: Path, problems: Path, out: Path, args: argparse.Namespace) -> list[dict]:
    """Run one kbench grade per shard side by side; every shard's results."""
    threads = max(1, (os.cpu_count() or 1) // args.shards)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if args.shards > 1 else None
    runs = []
    for shard in sorted(subs.iterdir()):
        command = [sys.executable, "-m", "kbench", "grade", str(shard), "--task",
                   str(problems), "--device", args.device, "--jobs", "2",
                   "--out", str(out if args.shards == 1 else out / shard.name)]
        command += [] if args.timing else ["--no-timing"]
        command += ["--case", "0"] if args.own_sizes else []
        print(" ".join(command), flush=True)
        runs.append(subprocess.Popen(command, env=env))
    for run in runs:
        run.wait()
    folders = [out] if args.shards == 1 else [out / s.name for s in sorted(subs.iterdir())]
    return [s for f in folders if (f / "results.json").exists()
            for s in json.loads((f / "results.json").read_text())["submissions"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a KernelBench clone (its KernelBench/ "
                        "folder holds level1, level2, ...)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--timing", action="store_true", help="time them too (default: "
                        "correctness only)")
    parser.add_argument("--only", nargs="*", default=[], help="problems whose name holds one "
                        "of these words")
    parser.add_argument("--own-sizes", action="store_true", help="only case 0, the problem's "
                        "own sizes (no random cases, no timing)")
    parser.add_argument("--shards", type=int, default=1, help="kbench runs side by side (on "
                        "one GPU they compete for its memory: keep 1 there)")
    parser.add_argument("--out", type=Path, default=Path("kernelbench-identity"))
    args = parser.parse_args()
    problems = args.checkout / "KernelBench"
    if not problems.is_dir():
        problems = args.checkout
    with tempfile.TemporaryDirectory() as tmp:
        subs = Path(tmp) / "identity"
        count = write_candidates(problems, args.levels, subs, args.only, args.shards)
        print(f"{count} problem(s)", flush=True)
        start = time.monotonic()
        subs_ = grade(subs, problems, args.out, args)
        wall = time.monotonic() - start
    passed = [s for s in subs_ if s["status"] == "ok"]
    share = 100 * len(passed) / max(1, count)  # a problem with no result did not pass
    print(f"\n{len(passed)} of {count} problems passed ({share:.1f} %) in "
          f"{wall / 60:.1f} min on {args.device}; verdicts: "
          f"{dict(Counter(s['status'] for s in subs_))}, no result: {count - len(subs_)}")
    for s in sorted(subs_, key=lambda s: s["problem"]):
        if s["status"] != "ok":
            print(f"- {s['problem']}: {s['status']}: {s['reason'][:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
