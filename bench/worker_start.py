"""What one worker process's start costs: from asking for it to its first answer, started plainly
(``python -m kbench.worker``: torch's import) and forked from a zygote (kbench.host.spawn), one
at a time and several at once, on every core and on the two cores a GPU slot's grading keeps.

    python bench/worker_start.py [--device cuda] [--count 8] [--json FILE]

On a GPU the worker makes its CUDA context before answering (as a worker started ahead of need
does), so the figure is what a fresh-process round waits for."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kbench import sandbox  # noqa: E402
from kbench.host import spawn  # noqa: E402
from kbench.shared import protocol  # noqa: E402


def _one(folder: Path, k: int, device: str) -> float:
    """Seconds from asking for a worker (ahead of need, as kbench does: on a GPU it makes its
    CUDA context) to its first answer."""
    log, env = folder / f"w{k}.log", sandbox.child_env({})
    start = time.perf_counter()
    spawn.prestart(log, env, device)
    with sandbox.Sandbox(log, env, 8 << 30, 1 << 20) as box:
        box.request(protocol.Release(), 300)
        return time.perf_counter() - start


def measure(device: str, count: int, forked: bool, cores: list[int]) -> dict:
    """One at a time, then ``count`` at once, on ``cores``."""
    os.sched_setaffinity(0, cores)
    spawn.FORK = forked
    spawn.close_zygotes()
    env = sandbox.child_env({})
    with tempfile.TemporaryDirectory() as folder:
        if forked:  # its zygote ready first: its own start is paid once per run
            spawn.warm(env)
            deadline = time.monotonic() + 120
            while not spawn.ready(env) and time.monotonic() < deadline:
                time.sleep(0.1)
        alone = [_one(Path(folder), k, device) for k in range(3)]
        with ThreadPoolExecutor(count) as pool:
            together = list(pool.map(lambda k: _one(Path(folder), 100 + k, device),
                                     range(count)))
    return {"forked": forked, "cores": len(cores), "device": device or "cpu",
            "alone_s": round(statistics.median(alone), 3),
            f"{count}_at_once_s": round(max(together), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    every = sorted(os.sched_getaffinity(0))
    rows = [measure(args.device if args.device == "cuda" else "", args.count, forked, cores)
            for cores in (every, every[:2]) for forked in (False, True)]
    for row in rows:
        print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
