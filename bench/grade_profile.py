"""Where a kbench grade's seconds go, process by process.

py-spy samples every process of the run (the grader, its slots, the workers forked from
zygotes) without stopping them (``--nonblocking``, waiting frames included), and this sums the
samples per role (kbench's own process, workers) and per frame, or as a tree under one frame.
bench/studies/stage_cost.py times the stopwatch's steps alone; this shows a whole grade.

    pip install py-spy
    python bench/grade_profile.py record --out DIR [--rate 100] -- GRADE-ARGS
    python bench/grade_profile.py top DIR/profile.txt [--role worker] [--only serve.py,...]
    python bench/grade_profile.py tree DIR/profile.txt time_submission [--role main] [--depth 4]

``record`` runs ``python -m kbench grade GRADE-ARGS`` under py-spy into DIR/profile.txt (py-spy's
raw collapsed stacks) and prints ``top`` of it. A frame is ``function@file``; seconds are
samples over the rate, summed over a role's processes and threads (a role's threads waiting
side by side count once each).
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

_PROCESS = re.compile(r"process (\d+):")


@dataclass(frozen=True)
class Stack:
    pid: str
    frames: tuple[str, ...]  # outermost first, each "function@file"
    samples: int


def read(path: Path) -> tuple[list[Stack], dict[str, str]]:
    """The stacks of a py-spy raw file, and each process's role: ``worker`` (kbench's worker
    loop ran in it), ``main`` (kbench's command ran in it), else ``other`` (zygotes, tools)."""
    stacks, roles = [], {}
    for line in path.read_text().splitlines():
        text, _, count = line.rpartition(" ")
        parts = text.split(";")
        marks = [i for i, part in enumerate(parts) if _PROCESS.match(part)]
        if not marks or not count.isdigit():
            continue
        pid = _PROCESS.match(parts[marks[-1]]).group(1)
        frames = tuple(_frame(part) for part in parts[marks[-1] + 1:])
        stacks.append(Stack(pid, frames, int(count)))
        if "main@serve.py" in frames:
            roles[pid] = "worker"
        elif "main@commands.py" in frames:
            roles.setdefault(pid, "main")
    for stack in stacks:
        roles.setdefault(stack.pid, "other")
    return stacks, roles


def _frame(part: str) -> str:
    name, _, where = part.partition(" (")
    return f"{name}@{where.split(':')[0].rsplit('/', 1)[-1]}" if where else name


def top(stacks: list[Stack], roles: dict[str, str], rate: float, only: list[str],
        count: int) -> list[str]:
    """Per role: its seconds, then its frames by inclusive seconds (those of files ``only``)."""
    total: collections.Counter[str] = collections.Counter()
    frames: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for stack in stacks:
        role = roles[stack.pid]
        total[role] += stack.samples
        for frame in set(stack.frames):
            if not only or any(frame.endswith("@" + name) for name in only):
                frames[role][frame] += stack.samples
    lines = []
    for role, samples in total.most_common():
        processes = sum(1 for r in roles.values() if r == role)
        lines.append(f"{role}: {samples / rate:.1f} s in {processes} process(es)")
        lines += [f"  {n / rate:8.2f} s  {frame}" for frame, n in frames[role].most_common(count)]
    return lines


def tree(stacks: list[Stack], roles: dict[str, str], rate: float, root: str, role: str,
         depth: int, least_s: float) -> list[str]:
    """Inclusive seconds of the frames under the first frame named like ``root``, ``depth``
    levels down, in ``role``'s processes; branches under ``least_s`` left out."""
    counts: collections.Counter[tuple[str, ...]] = collections.Counter()
    for stack in stacks:
        if roles[stack.pid] != role:
            continue
        at = next((i for i, f in enumerate(stack.frames) if f.startswith(root)), None)
        if at is not None:
            path = stack.frames[at:at + depth + 1]
            for end in range(1, len(path) + 1):
                counts[path[:end]] += stack.samples
    lines: list[str] = []

    def show(prefix: tuple[str, ...]) -> None:
        children = [k for k in counts if len(k) == len(prefix) + 1 and k[:-1] == prefix]
        for key in sorted(children, key=lambda k: -counts[k]):
            if counts[key] / rate >= least_s:
                lines.append(f"{'  ' * (len(key) - 1)}{counts[key] / rate:8.2f}  {key[-1]}")
                show(key)
    show(())
    return lines


def record(out: Path, rate: int, grade_args: list[str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "profile.txt"
    subprocess.run(["py-spy", "record", "--subprocesses", "--idle", "--nonblocking",
                    "--rate", str(rate), "--format", "raw", "-o", str(raw), "--",
                    sys.executable, "-m", "kbench", "grade", *grade_args], check=False)
    return raw


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="py-spy over a kbench grade, then its top frames")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("grade", nargs=argparse.REMAINDER, help="-- then kbench grade's arguments")
    tops = sub.add_parser("top", help="each role's frames by inclusive seconds")
    tops.add_argument("raw", type=Path)
    trees = sub.add_parser("tree", help="the frames under one, as a tree")
    trees.add_argument("raw", type=Path)
    trees.add_argument("root", help="a frame's function name (or its start)")
    trees.add_argument("--depth", type=int, default=4)
    trees.add_argument("--least-s", type=float, default=0.1)
    for each in (rec, tops, trees):
        each.add_argument("--rate", type=int, default=100, help="samples a second")
    for each in (rec, tops):
        each.add_argument("--only", default="", help="files whose frames are listed, "
                          "comma-separated (default: every file)")
        each.add_argument("--count", type=int, default=40)
    for each in (tops, trees):
        each.add_argument("--role", default=None, choices=["main", "worker", "other"])
    args = parser.parse_args(argv)
    if args.command == "record":
        grade = args.grade[1:] if args.grade[:1] == ["--"] else args.grade
        raw = record(args.out, args.rate, grade)
    else:
        raw = args.raw
    stacks, roles = read(raw)
    if args.command == "tree":
        print("\n".join(tree(stacks, roles, args.rate, args.root, args.role or "main",
                             args.depth, args.least_s)))
        return 0
    if getattr(args, "role", None):
        stacks = [s for s in stacks if roles[s.pid] == args.role]
    only = [name for name in args.only.split(",") if name]
    print("\n".join(top(stacks, roles, args.rate, only, args.count)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
