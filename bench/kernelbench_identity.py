"""Grade ModelNew = Model against every problem of a KernelBench checkout: how many problems
kbench takes as they are. Writes one candidate per problem (the problem's own source plus
`ModelNew = Model`) in the `<level>/<problem>/identity.py` layout outside the repository,
runs `kbench grade` on them, and prints which problems did not pass and why.

    python bench/kernelbench_identity.py /path/to/KernelBench --levels 1 2 3 --device cpu
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def write_candidates(problems: Path, levels: list[int], folder: Path, only: list[str]) -> int:
    count = 0
    for level in levels:
        for problem in sorted((problems / f"level{level}").glob("*.py")):
            if only and not any(word in problem.stem for word in only):
                continue
            target = folder / f"level{level}" / problem.stem / "identity.py"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(problem.read_text() + "\n\nModelNew = Model\n")
            count += 1
    return count


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
    parser.add_argument("--out", type=Path, default=Path("kernelbench-identity"))
    args = parser.parse_args()
    problems = args.checkout / "KernelBench"
    if not problems.is_dir():
        problems = args.checkout
    with tempfile.TemporaryDirectory() as tmp:
        subs = Path(tmp) / "identity"
        count = write_candidates(problems, args.levels, subs, args.only)
        command = [sys.executable, "-m", "kbench", "grade", str(subs), "--task", str(problems),
                   "--device", args.device, "--out", str(args.out), "--jobs", "2"]
        command += [] if args.timing else ["--no-timing"]
        print(f"{count} problem(s): {' '.join(command)}", flush=True)
        start = time.monotonic()
        subprocess.run(command, check=False)
        wall = time.monotonic() - start
    results = json.loads((args.out / "results.json").read_text())
    subs_ = results["submissions"]
    passed = [s for s in subs_ if s["status"] == "ok"]
    share = 100 * len(passed) / max(1, len(subs_))
    print(f"\n{len(passed)} of {len(subs_)} problems passed ({share:.1f} %) in "
          f"{wall / 60:.1f} min on {args.device}; verdicts: "
          f"{dict(Counter(s['status'] for s in subs_))}")
    for s in sorted(subs_, key=lambda s: s["problem"]):
        if s["status"] != "ok":
            print(f"- {s['problem']}: {s['status']}: {s['reason'][:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
