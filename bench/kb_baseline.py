"""KernelBench's reference times for a folder of problem files, taken on this host by KernelBench's
own ``kernelbench.timing.measure_ref_program_time`` (what its ``generate_baseline_time.py``
calls for every problem of its levels), in the format that script writes: level -> file name ->
its timing statistics. KernelBench divides these by a sample's runtime for its speedup, and
``bench/real_batch.py --kb-baseline`` reads them, so both tools' speedups come from one host.

    python bench/kb_baseline.py KERNELBENCH_CHECKOUT PROBLEMS_FOLDER --level 1 --out BASE.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernelbench", type=Path, help="a KernelBench checkout (its src/)")
    parser.add_argument("problems", type=Path, help="a folder of KernelBench problem files")
    parser.add_argument("--level", type=int, required=True, help="the level they are filed under")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    # its package imports modal, openai and litellm at module level: the stand-ins
    # bench/real_batch.py gives its evaluator, in a folder of their own
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from real_batch import STUB, STUBS

    shim = Path(tempfile.mkdtemp(prefix="kb_baseline-"))
    for name in STUBS:
        (shim / name).parent.mkdir(parents=True, exist_ok=True)
        (shim / name).write_text(STUB)
    sys.path[:0] = [str(args.kernelbench.resolve() / "src"), str(shim)]
    from kernelbench.timing import measure_ref_program_time

    times: dict[str, dict] = {}
    start = time.monotonic()
    for path in sorted(args.problems.glob("*.py")):
        try:
            times[path.name] = measure_ref_program_time(path.name, path.read_text())
        except Exception as exc:  # one problem's failure is its own: say it, go on
            print(f"{path.name}: not timed ({type(exc).__name__}: {exc})", file=sys.stderr)
        args.out.write_text(json.dumps({f"level{args.level}": times}, indent=1))
    print(f"{len(times)} reference(s) timed in {time.monotonic() - start:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
