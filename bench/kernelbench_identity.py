"""Grade ModelNew = Model against every problem of a KernelBench checkout: how many problems
kbench takes as they are. Writes one candidate per problem (the problem's own source plus
`ModelNew = Model`) in the `<level>/<problem>/identity.py` layout outside the repository,
grades them with `kbench grade` in batches, and prints which problems did not pass and why.

    python bench/kernelbench_identity.py /path/to/KernelBench --levels 1 2 3 --device cpu
    python bench/kernelbench_identity.py KB --levels 1 2 3 --device cuda --own-sizes \
        --shards 4 --results /tmp/kbid/identity.json --deadline-s 470

Batches of ``--batch`` problems go to ``--shards`` kbench runs side by side, each on its own
share of the cores (its grading pinned there by kbench's host split); with ``--gpus`` the runs
are spread over those GPUs, each GPU's runs on its share of the cores. On a GPU a batch starts
only where its problems' device memory, as kbench's screening estimates it (three times the
reference's peak on the meta device: float32 and float64) and twice that for what kbench's
processes hold beside it, fits beside the batches running on that GPU;
the largest go first. A problem that failed on a resource (memory, a CUDA error, a timeout, a
crash) while other batches shared its GPU (or its cores, on a CPU) is graded again alone at
the end: one batch on each GPU at a time. Every verdict is kept in
``--results``: run again with the same file and only what is missing is graded, so
``--deadline-s`` (no batch starts that would not end by then; running ones are stopped at it)
lets several device calls finish a long set.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from identity_lanes import Scheduler

# Failures another batch on the same GPU or cores can cause: graded again alone.
_RESOURCE = {"out_of_memory", "cuda_error", "timeout", "crashed", "internal_error",
             "infrastructure_error"}
_RESOURCE_WORDS = ("out of memory", "GiB of device memory", "CUDA", "CUBLAS", "CUDNN",
                   "timed out", "not enough memory")


def list_problems(root: Path, levels: list[int], only: list[str]) -> dict[str, Path]:
    """``level1/19_ReLU`` -> its file, for the levels asked (``only``: names holding a word)."""
    found = {}
    for level in levels:
        for path in sorted((root / f"level{level}").glob("*.py")):
            if not only or any(word in path.stem for word in only):
                found[f"level{level}/{path.stem}"] = path
    return found


def _need(path: str) -> float | None:
    """GiB kbench's screening counts for the reference at the file's own sizes, or None."""
    try:
        from kbench.problems.trial import on_meta
        from kbench.shared import inputs

        module = inputs.load_file(path, f"kbid_{abs(hash(path))}")
        return 3 * on_meta(module, inputs.own_sizes(module)).peak_bytes / 2**30
    except Exception:  # the reference's own failure shows when it is graded
        return None


def estimate_needs(paths: dict[str, Path], known: dict[str, float | None]) -> None:
    """Fill ``known`` with each problem's estimate, on every core at once."""
    todo = [name for name in paths if name not in known]
    if not todo:
        return
    start = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(min(len(todo), os.cpu_count() or 1)) as pool:
        for name, need in zip(todo, pool.map(_need, [str(paths[n]) for n in todo], chunksize=1),
                              strict=True):
            known[name] = need
    print(f"memory estimates of {len(todo)} problem(s) in {time.monotonic() - start:.0f} s",
          flush=True)


def needs_alone(record: dict) -> bool:
    """A failure that another batch beside it could have caused, not yet seen alone."""
    if record["status"] == "ok" or record.get("alone"):
        return False
    text = f"{record.get('reason', '')} {record.get('error') or ''}"
    return record["status"] in _RESOURCE or any(w.lower() in text.lower()
                                                for w in _RESOURCE_WORDS)


def summary(names: list[str], state: dict) -> list[str]:
    """What the results file says of ``names``: the share of non-degenerate problems ok, and
    every problem that is degenerate, failed, or has no verdict yet."""
    results = {n: state["results"][n] for n in names if n in state["results"]}
    degenerate = {n for n, r in results.items() if r.get("degenerate")}
    plain = [n for n in results if n not in degenerate]
    ok = sum(results[n]["status"] == "ok" for n in plain)
    missing = [n for n in names if n not in results]
    envs = {json.dumps(r.get("environment"), sort_keys=True) for r in results.values()}
    lines = [f"{len(results)} of {len(names)} problem(s) have a verdict "
             f"({dict(Counter(r['status'] for r in results.values()))}); "
             f"{len(degenerate)} degenerate; non-degenerate ok: {ok} of {len(plain)} "
             f"({100 * ok / max(1, len(plain)):.1f} %)", *sorted(envs)]
    for name in sorted(degenerate):
        lines.append(f"- {name}: degenerate ({results[name]['status']}): "
                     f"{results[name]['degenerate'][:300]}")
    for name in sorted(n for n in plain if results[n]["status"] != "ok"):
        record = results[name]
        alone = "" if record.get("alone") else " (graded beside others)"
        lines.append(f"- {name}: {record['status']}{alone}: {record['reason'][:400]}")
    lines += [f"- {name}: no verdict yet" for name in missing]
    return lines


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
    parser.add_argument("--shards", type=int, default=1, help="kbench runs side by side, each "
                        "on its share of the cores (on a GPU, within its memory)")
    parser.add_argument("--batch", type=int, default=10, help="problems per kbench run")
    parser.add_argument("--gpus", help="GPUs to spread the runs over, e.g. 0,1,2 (physical "
                        "indices; default: the first visible GPU)")
    parser.add_argument("--deadline-s", type=float, help="start no batch that would not end "
                        "within this many seconds of the start; stop the running ones then")
    parser.add_argument("--results", type=Path, help="the verdicts so far (JSON), read and "
                        "added to (default: OUT/identity.json)")
    parser.add_argument("--out", type=Path, default=Path("kernelbench-identity"))
    begun = time.monotonic()
    args = parser.parse_args()
    args.begun = begun
    problems = args.checkout / "KernelBench"
    if not problems.is_dir():
        problems = args.checkout
    paths = list_problems(problems, args.levels, args.only)
    results_path = args.results or args.out / "identity.json"
    state = json.loads(results_path.read_text()) if results_path.exists() else {}
    state.setdefault("results", {})
    state.setdefault("needs", {})
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(state, indent=1, sort_keys=True))

    if args.device == "cuda":
        estimate_needs(paths, state["needs"])
        save()
    todo = [n for n in paths if n not in state["results"]]
    print(f"{len(paths)} problem(s), {len(todo)} without a verdict", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        scheduler = Scheduler(args, paths, problems, Path(tmp), state, save)
        scheduler.run(scheduler.batches(todo), scheduler.lanes)
        again = [n for n in paths if n in state["results"] and needs_alone(state["results"][n])]
        if again:
            print(f"grading {len(again)} problem(s) again alone: {', '.join(again)}", flush=True)
            scheduler.run(scheduler.batches(again), scheduler.alone_lanes())
    print("\n" + "\n".join(summary(list(paths), state)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
