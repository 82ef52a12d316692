"""The Ray build tier on one GPU host, against the local slots (issue 41).

Lays out leaderboard samples as bench/real_batch.py does, grades them once with the local
slots, then starts a Ray head on this host that owns its GPUs (and, with ``--build-node-cpus
N``, a CPU-only Ray node beside it that alone offers ``kbench_build``, each node with a build
cache of its own), grades the same samples through ``--executor ray``, and prints where each
build ran, the wall times, and every verdict that differs.

    python bench/ray_tier.py --leaderboard LB --work W --levels 1 --first 40 \
        [--build-node-cpus 48 --head-cpus 16] [--timeout 240] -- --no-timing --seed 20261126
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_batch import ROOT, execute, lay_out, read_leaderboard  # noqa: E402

WHERE = re.compile(r"^\S+: (\S+) (built in \d+ s|not built.*|left to its grading node.*) "
                   r"on (\S+) \(node ([0-9a-f]{8})")


def ray_start(args: list[str], cache: Path, temp: Path) -> None:
    """``ray start ARGS`` with this node's own build cache (its workers inherit it), in a Ray
    folder of the run's own: a plain ``ray.init()`` elsewhere on the host never finds it."""
    env = {**os.environ, "KBENCH_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", *args, "--temp-dir",
               str(temp), "--disable-usage-stats"]
    print("$ " + " ".join(command), flush=True)
    subprocess.run(command, env=env, check=True)


def stop(session: str) -> None:
    """This run's Ray processes ended (those naming its session), no other Ray's."""
    import psutil

    mine = [p for p in psutil.process_iter(["cmdline"])
            if any(session in part for part in p.info["cmdline"] or [])]
    for process in mine:
        process.terminate()
    _, alive = psutil.wait_procs(mine, timeout=10)
    for process in alive:
        process.kill()


def grade(name: str, work: Path, options: list[str], timeout: float | None,
          extra_env: dict[str, str]) -> tuple[dict, float, list[str]]:
    """One ``kbench grade`` of the laid-out samples: its results.json, wall time and lines."""
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    lines: list[str] = []
    start = time.monotonic()
    execute([sys.executable, "-m", "kbench", "grade", str(work / "subs"), "--task",
             str(work / "problems"), "--out", str(out), *options], ROOT,
            {**os.environ, "PYTHONUNBUFFERED": "1", **extra_env}, work / f"{name}.log", timeout,
            lambda t, line: lines.append(line))
    wall = time.monotonic() - start
    if not (out / "results.json").exists():
        subprocess.run([sys.executable, "-m", "kbench", "report", "--out", str(out)], cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report = out / "results.json"
    return (json.loads(report.read_text()) if report.exists() else {}), wall, lines


def verdicts(run: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in run.get("submissions", [])}


def summary(name: str, run: dict, wall: float) -> str:
    counts = Counter(verdicts(run).values())
    return f"{name}: {len(verdicts(run))} graded in {wall:.0f} s; " + \
        ", ".join(f"{k} {v}" for k, v in counts.most_common())


def placements(lines: list[str]) -> list[str]:
    """Where each build ran, counted by node, and one line per build."""
    found = [m.groups() for line in lines if (m := WHERE.match(line.strip()))]
    per_node = Counter(f"{host} node {node}" for _, _, host, node in found)
    return ["builds per node: " + ", ".join(f"{k}: {v}" for k, v in per_node.items())] + \
        [f"  {sub}: {what} on {host} (node {node})" for sub, what, host, node in found]


def compare(local: dict, other: dict, name: str) -> list[str]:
    mine, theirs = verdicts(local), verdicts(other)
    differ = [f"  {s}: local {mine.get(s)}, {name} {theirs.get(s)}"
              for s in sorted(set(mine) | set(theirs)) if mine.get(s) != theirs.get(s)]
    return [f"verdicts, local slots against {name}: {len(mine) - len(differ)} of {len(mine)} "
            "the same"] + differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaderboard", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--levels", type=lambda s: {int(v) for v in s.split(",")})
    parser.add_argument("--first", type=int)
    parser.add_argument("--build-node-cpus", type=int, help="start a CPU-only build node too")
    parser.add_argument("--head-cpus", type=int, help="the head's Ray CPUs (default: all)")
    parser.add_argument("--timeout", type=float, help="stop each kbench run after S seconds")
    parser.add_argument("--skip-local", action="store_true", help="grade through Ray only")
    args, options = parser.parse_known_args()
    # One host, one user: Ray's token authentication would have each node fetch the head's.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    options = [o for o in options if o != "--"]
    work = args.work.resolve()
    samples, _ = read_leaderboard(args.leaderboard, args.levels, args.first)
    lay_out(samples, args.leaderboard, work)
    print(f"{len(samples)} samples laid out in {work}", flush=True)
    report: list[str] = []
    local: dict = {}
    if not args.skip_local:
        local, wall, _ = grade("local", work, [*options, "--cache-dir",
                                               str(work / "cache-local")], args.timeout, {})
        report.append(summary("local slots", local, wall))
    for folder in ("cache-head", "cache-build", "cache-driver"):
        shutil.rmtree(work / folder, ignore_errors=True)
    import torch
    from ray._private.services import get_node_ip_address

    gpus, address = torch.cuda.device_count(), f"{get_node_ip_address()}:6390"
    temp = work / "ray"
    head = ["--head", "--port", "6390", "--num-gpus", str(gpus), "--include-dashboard", "false",
            "--resources", json.dumps({"kbench_grade": max(1, gpus)})]
    ray_start(head + (["--num-cpus", str(args.head_cpus)] if args.head_cpus else []),
              work / "cache-head", temp)
    session = Path(os.path.realpath(temp / "session_latest")).name
    try:
        if args.build_node_cpus:
            ray_start(["--address", address, "--num-gpus", "0", "--num-cpus",
                       str(args.build_node_cpus), "--resources", json.dumps({"kbench_build": 1})],
                      work / "cache-build", temp)
        name = "ray-build-node" if args.build_node_cpus else "ray-head"
        run, wall, lines = grade(name, work, [*options, "--executor", "ray", "--address",
                                              address, "--cache-dir",
                                              str(work / "cache-driver")], args.timeout, {})
        report += [summary(name, run, wall), *placements(lines)]
        if local:
            report += compare(local, run, name)
        report.append(f"run notes: {run.get('notes')}")
    finally:
        stop(session)
    print("\n" + "\n".join(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
