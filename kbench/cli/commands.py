"""Command line: the parser, and ``report``, ``compare``, ``history``, ``doctor``, ``prune``,
``list`` and ``new`` (``grade`` is kbench.cli.grade_command).

Exit status: 0 when grading ran, whatever the verdicts; 2 when kbench could not grade (bad
arguments, a malformed task, no such files, no CUDA device for --device cuda).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kbench import __version__
from kbench.cli.grade_args import cache_option, grade_parser, out_option, serve_parser
from kbench.cli.grade_command import fail, render
from kbench.host import paths

if TYPE_CHECKING:  # imported lazily at run time: `kbench --help` stays fast
    from kbench.problems.discovery import Problem
    from kbench.results.run_record import ProblemRun
    from kbench.results.store import Store


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the command that resumes
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("kbench: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kbench", description="Grade custom GPU kernels that "
                                     "replace PyTorch modules (KernelBench format).")
    parser.add_argument("--version", action="version", version=f"kbench {__version__}")
    sub = parser.add_subparsers(title="commands")
    grade_parser(sub)
    serve_parser(sub)
    _results_parsers(sub)
    _machine_parsers(sub)
    return parser


def _results_parsers(sub) -> None:
    """Commands that read the results store."""
    show = sub.add_parser("report", help="render leaderboard.md and results.json again from "
                          "the results store, without grading")
    out_option(show)
    show.add_argument("--run", type=int, dest="run_id", help="run id (default: the newest)")
    show.set_defaults(handler=_report)

    compare = sub.add_parser("compare", help="two runs side by side: speedups per size before "
                             "and after, beyond noise or not, and changed verdicts")
    compare.add_argument("before", help="a run id in the store (see --out) or a results.json")
    compare.add_argument("after", help="the same, for the later run")
    compare.add_argument("--fail-on-regression", type=float, metavar="PCT", help="exit 1 if a "
                         "size got slower beyond noise (intervals and floor) by more than PCT "
                         "percent, or a correct submission stopped being correct")
    compare.add_argument("--noise-floor", type=float, metavar="PCT", help="changes within PCT "
                         "percent are noise even where the intervals are disjoint, since runs "
                         "differ more than one run's intervals say (default 3)")
    compare.add_argument("--launch-bound-floor", type=float, metavar="PCT", help="the same for "
                         "launch-bound sizes (default 10)")
    out_option(compare)
    compare.set_defaults(handler=_compare)

    history = sub.add_parser("history", help="a submission's stored results across runs")
    history.add_argument("name", help="submission name, e.g. l2norm_v3")
    out_option(history)
    history.set_defaults(handler=_history)


def _machine_parsers(sub) -> None:
    """Commands about the machine, its files and the problems it sees."""
    check = sub.add_parser("doctor", help="check that this machine can build and run "
                           "submissions: torch, nvcc, compilers, GPUs; each problem with its fix")
    check.add_argument("--device", choices=["cpu", "cuda"],
                       help="the device grading would use (default: cuda when visible)")
    check.add_argument("--cuda-arch", help="TORCH_CUDA_ARCH_LIST to check builds for")
    cache_option(check)
    check.add_argument("--quick", action="store_true", help="only the checks kbench grade runs "
                       "at its start (skips building a CUDA extension with load_inline)")
    check.set_defaults(handler=_doctor)

    prune = sub.add_parser("prune", help="delete old runs from the results store, with the "
                           "logs and build folders no kept run used")
    prune.add_argument("--keep", type=int, required=True, help="how many of the newest runs "
                       "to keep (runs being graded now are always kept)")
    out_option(prune)
    cache_option(prune)
    prune.set_defaults(handler=_prune)

    listing = sub.add_parser("list", help="show the problems kbench sees and the bundled "
                             "submissions")
    listing.add_argument("--task", help="a task, problem file or folder of problems (default: "
                         "the bundled tasks/)")
    out_option(listing)
    listing.set_defaults(handler=_list)

    new = sub.add_parser("new", help="write a load_inline skeleton submission to fill in, "
                         "its constructor the reference Model's (CUDA C++; --cpu: C++ for "
                         "the CPU)")
    new.add_argument("task", help="task name (e.g. l2norm) or problem file")
    new.add_argument("name", help="submission name, e.g. v5 -> l2norm_v5.py")
    new.add_argument("--dir", type=Path, default=None, help="where to write it (default: "
                     "this folder; not kbench/submissions, whose every file the quick start "
                     "grades)")
    new.add_argument("--cpu", action="store_true", help="C++ for the CPU instead of CUDA: "
                     "graded with --device cpu, on a machine without a GPU too")
    new.set_defaults(handler=_new)


def _open_store(out: Path | None) -> tuple[Store, Path]:
    """The results store in ``out``; it must exist already (these commands never grade)."""
    from kbench.results.store import FILENAME, Store

    out_dir = (out or paths.default_reports_dir()).resolve()
    if not (out_dir / FILENAME).exists():
        raise FileNotFoundError(f"no results store in {out_dir}: run kbench grade first")
    return Store(out_dir), out_dir


def _report(args: argparse.Namespace) -> int:
    from kbench.results.store import StoreError

    try:
        store, out_dir = _open_store(args.out)
        run_id = args.run_id or store.latest_run_id()
        if run_id is None:
            return fail(f"{store.path}: no runs stored yet")
        return render(store, run_id, out_dir)
    except (StoreError, FileNotFoundError) as exc:
        return fail(str(exc))


def _compare(args: argparse.Namespace) -> int:
    from kbench.reports.run_diff import DiffError, Floors, compare

    try:
        return compare(args.before, args.after,
                       (args.out or paths.default_reports_dir()).resolve(),
                       args.fail_on_regression, Floors.given(args.noise_floor,
                                                             args.launch_bound_floor))
    except DiffError as exc:
        return fail(str(exc))


def _history(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from kbench.results.store import StoreError

    try:
        store, _ = _open_store(args.out)
    except (StoreError, FileNotFoundError) as exc:
        return fail(str(exc))
    rows = store.history(args.name)
    if not rows:
        return fail(f"no stored results for {args.name} in {store.path}")
    print(tabulate([[r["run"], r["when"], r["where"], r["kbench"], r["sha256"][:12], r["status"],
                     f"{r['speedup']:.3f}x" if r["speedup"] else "-",
                     f"run {r['reused_from']}" if r["reused_from"] else ""] for r in rows],
                   headers=["run", "graded", "device", "kbench", "file sha256", "verdict",
                            "speedup", "reused from"], tablefmt="github"))
    return 0


def _list(args: argparse.Namespace) -> int:
    from kbench.problems.discovery import DiscoveryError, find_problems
    from kbench.problems.task import TaskError

    try:
        _, problems = find_problems(args.task)
    except (DiscoveryError, TaskError) as exc:
        return fail(str(exc))
    where = paths.tasks_dir() if args.task is None else Path(args.task)
    print(f"problems in {where} ({len(problems)}):")
    stored = _stored_problems(args.out)
    for problem in problems:
        print(f"  {problem.name}  ({problem.path.name})" + _degenerate(problem, stored))
    if args.task is None:
        print(f"submissions ({paths.submissions_dir()}):")
        for path in sorted(paths.submissions_dir().glob("*.py")):
            doc = _first_doc_line(path)
            print(f"  {path.stem}" + (f"  - {doc}" if doc else ""))
    return 0


def _stored_problems(out: Path | None) -> dict[str, tuple[int, ProblemRun]]:
    """The newest stored record of each problem in the results store in ``out``, if there
    is one (kbench list does not screen: it says what the latest grading found)."""
    from kbench.results.store import StoreError

    try:
        store, _ = _open_store(out)
        return store.latest_problems()
    except (StoreError, FileNotFoundError):
        return {}


def _degenerate(problem: Problem, stored: dict[str, tuple[int, ProblemRun]]) -> str:
    """What kbench list adds to a problem's line where its newest stored record (of the same
    file) called it degenerate: the run, the reason, and whether the file changed since."""
    from kbench.problems.task import digest

    run_id, record = stored.get(problem.name, (None, None))
    if record is None or not record.degenerate or \
            Path(record.path).with_suffix("") != problem.path.resolve().with_suffix(""):
        return ""
    files = [problem.path, problem.path.with_suffix(".yaml")]
    changed = problem.path.suffix == ".py" and \
        record.digest != digest(*(f for f in files if f.is_file()))
    return (f"  - degenerate in run {run_id}" + (" (the file changed since)" if changed else "")
            + f": {record.degenerate}")


def _first_doc_line(path: Path) -> str:
    """The module docstring's first line, read as text (submissions are never imported)."""
    import ast

    try:
        doc = ast.get_docstring(ast.parse(path.read_text()))
    except (SyntaxError, ValueError, OSError):
        return ""
    return doc.strip().splitlines()[0] if doc else ""


def _new(args: argparse.Namespace) -> int:
    from kbench.problems import scaffold
    from kbench.problems.load import load_task
    from kbench.problems.task import TaskError

    try:
        task = load_task(args.task)
        bundled = task.path.resolve().parent == paths.tasks_dir().resolve()
        folder = args.dir or Path.cwd()
        where = "" if bundled else f" --task {args.task}"
        path = scaffold.create(task, args.name, folder, args.cpu, where)
    except (TaskError, ValueError, FileExistsError) as exc:
        return fail(str(exc))
    device = " --device cpu" if args.cpu else ""
    print(f"wrote {path}; fill in the kernel, check it with: kbench grade {path}{where}"
          f"{device} --no-timing; then time it: the same without --no-timing")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    """Exit 0 when nothing is a problem, 1 when something is."""
    import torch

    from kbench.host import doctor
    from kbench.host.toolchain import find_toolchain

    cache = (args.cache_dir or paths.default_cache_dir()).resolve()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tools = find_toolchain(args.cuda_arch, cache / "toolkits")
    print(f"kbench {__version__} doctor: Python {sys.version.split()[0]}, device {device}",
          flush=True)
    found = doctor.checks(device, tools, cache)
    for check in found:
        print(check.line(), flush=True)
    if not args.quick:
        print("building a tiny CUDA extension with load_inline (a minute or more the first "
              "time)...", flush=True)
        found.append(doctor.extension(tools, cache))
        print(found[-1].line())
    problems = [c for c in found if c.level is doctor.Level.PROBLEM]
    print(f"{len(problems)} problem(s)" if problems else "no problems found")
    return 1 if problems else 0


def _prune(args: argparse.Namespace) -> int:
    from kbench.cli import housekeeping
    from kbench.results.store import StoreError

    if args.keep < 0:
        return fail("--keep must be 0 or more")
    try:
        store, out_dir = _open_store(args.out)
    except (StoreError, FileNotFoundError) as exc:
        return fail(str(exc))
    cache = (args.cache_dir or paths.default_cache_dir()).resolve()
    print(housekeeping.prune(store, out_dir, cache, args.keep))
    return 0
