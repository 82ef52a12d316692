"""Degenerate screening under many seeds, without building or grading a submission: each
problem is screened on the CPU (the cases a grade with that seed plans) and the reasons it
was called degenerate, if any, are printed per seed. The bundled l2norm must never be marked;
the fixtures in tests/fixtures/degenerate/problems always.

    python bench/studies/degenerate_seeds.py --seeds 20             # l2norm and the fixtures
    python bench/studies/degenerate_seeds.py --seeds 20 --task path/to/problem.py --task l2norm
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from kbench.grading.checking.screen import ProblemError, screen
from kbench.grading.context import Context
from kbench.grading.options import Options
from kbench.host.toolchain import Toolchain
from kbench.problems.load import load_task

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "degenerate"


def marks(task: str, seeds: int, work: Path) -> list[list[str]]:
    """Per seed, the degenerate reasons screening gave (empty: not degenerate)."""
    out = []
    for seed in range(seeds):
        options = Options(device="cpu", out_dir=work, cache_dir=work, jobs=1, seed=seed)
        ctx = Context.create(load_task(task), options, Toolchain(None, None, "9.0"))
        try:
            screen(ctx)
        except ProblemError as exc:
            out.append([f"problem error: {exc}"])
            continue
        out.append(ctx.degenerate)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--task", action="append",
                        help="a task name or problem file (repeatable; default: l2norm and "
                             "the degenerate fixtures)")
    args = parser.parse_args()
    tasks = args.task or ["l2norm", *map(str, sorted((FIXTURES / "problems").glob("*.py")))]
    with tempfile.TemporaryDirectory() as work:
        for task in tasks:
            start = time.monotonic()
            found = marks(task, args.seeds, Path(work))
            marked = sum(1 for reasons in found if reasons)
            print(f"{task}: degenerate under {marked} of {args.seeds} seeds "
                  f"({time.monotonic() - start:.0f} s)")
            for seed, reasons in enumerate(found):
                if reasons:
                    print(f"  seed {seed}: {'; '.join(reasons)[:200]}")


if __name__ == "__main__":
    main()
