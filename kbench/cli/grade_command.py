"""`kbench grade`: find the submissions and their problems, grade them into the results store
with progress as it goes, and render the reports. Also the two pieces every command shares:
``fail`` (exit status 2 with a message) and ``render`` (the reports of a stored run)."""

from __future__ import annotations

import argparse
import secrets
import shlex
import shutil
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kbench import __version__
from kbench.host import paths

if TYPE_CHECKING:  # imported lazily at run time: `kbench --help` stays fast
    from kbench.grader import Placement
    from kbench.grading.options import Options
    from kbench.results.store import Store


def fail(message: str) -> int:
    """Say why kbench could not do what was asked; the exit status for it."""
    print(f"kbench: {message}", file=sys.stderr)
    return 2


def grade(args: argparse.Namespace) -> int:
    from kbench.problems.discovery import DiscoveryError, assign, find_files, find_problems
    from kbench.problems.task import TaskError
    from kbench.results.store import Store, StoreError

    if args.jobs is not None and args.jobs < 1:
        return fail(f"--build-jobs {args.jobs}: expected at least 1")
    out_dir = (args.out or paths.default_reports_dir()).resolve()
    try:
        label, problems = find_problems(args.task)
        assigned, unmatched = assign(find_files(args.paths), problems, args.paths,
                                     named=args.task is not None)
        for line in unmatched:
            print(f"note: {line}", flush=True)
        if not assigned:
            raise DiscoveryError("no submission goes with a problem: " + "; ".join(unmatched))
        plan = _plan(assigned)
        store = Store(out_dir)
    except (DiscoveryError, TaskError, StoreError) as exc:
        return fail(str(exc))
    label = plan[0].name if len(plan) == 1 else label
    from kbench.host import interrupt

    interrupt.reset()
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    interrupt.install()  # Ctrl-C and SIGTERM: stop, keep what is stored, say how to resume
    try:
        return _grade_into(store, label, plan, out_dir, args)
    except interrupt.Interrupted as stopped:
        return _interrupted(store, stopped, out_dir, args)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        store.close()  # and with it this process's claim on the run


def _interrupted(store: Store, stopped: BaseException, out_dir: Path,
                 args: argparse.Namespace) -> int:
    """After kbench's own stop: the reports of what is stored, and the command that grades
    the rest; the exit status says which signal stopped it (128 + its number)."""
    from kbench.host import interrupt

    interrupt.wait_children()
    if stopped.run_id is None:
        print("kbench: stopped before grading began; nothing was stored", file=sys.stderr)
    else:
        render(store, stopped.run_id, out_dir, logs=True)
        again = [a for a in args.argv if a != "--resume"] + ["--resume"]
        print(f"kbench: stopped ({stopped}); run {stopped.run_id} keeps "
              f"{len(store.graded_names(stopped.run_id))} result(s). To grade the rest:\n"
              f"  kbench {shlex.join(again)}", flush=True)
    return 128 + stopped.signum


def _plan(assigned: dict) -> list:
    """Each problem loaded once here (its analysis is kept for the run); a problem that
    cannot be loaded stays in the plan to be reported, unless it is the only one: then
    TaskError."""
    from kbench.grading.running.driver import Entry
    from kbench.problems.load import load_task
    from kbench.problems.task import TaskError

    plan = []
    for problem, subs in assigned.items():
        try:
            task = load_task(str(problem.path), problem.name)
        except TaskError:
            if len(assigned) == 1:
                raise
            task = None
        plan.append(Entry(problem.name, problem.path, task, subs))
    return plan


def _grade_into(store: Store, label: str, plan: list, out_dir: Path,
                args: argparse.Namespace) -> int:
    from kbench import grader
    from kbench.cli.progress import Progress
    from kbench.grading.options import OptionsError
    from kbench.grading.running.driver import plan_digest
    from kbench.host import interrupt
    from kbench.problems.cases import CaseError
    from kbench.results.store import StoreError

    settings = asked(args)
    seed, run_id = args.seed, None
    unfinished = store.unfinished_run(label)
    if args.resume:
        if unfinished is None:
            return fail(f"--resume: no interrupted run of {label} in {store.path}")
        if unfinished.task_hash != plan_digest(plan):
            return fail(f"--resume: the problems of {label} changed since run "
                         f"{unfinished.id} started; grade anew without --resume")
        settings, seed, run_id = unfinished.options, unfinished.seed, unfinished.id
        try:
            store.claim(run_id)  # at once: a second --resume is refused before any work
        except StoreError as exc:
            return fail(str(exc))
    elif unfinished is not None and not store.claimed(unfinished.id):
        print(f"note: run {unfinished.id} of {label} in {store.path} did not finish; "
              "`kbench grade ... --resume` continues it", flush=True)
    seed = seed if seed is not None else secrets.randbits(31)
    try:
        options = options_for(args, settings, seed, out_dir)
    except OptionsError as exc:
        return fail(str(exc))
    device = options.device.value
    resuming = f", resuming run {run_id}" if run_id else ""
    count = sum(len(e.submissions) for e in plan)
    timing = f"{options.timing.value}, profile {options.profile.value}" if options.timed \
        else "off"
    print(f"kbench {__version__}: {label}, {count} submission(s) against {len(plan)} "
          f"problem(s), device {device}, seed {seed}, timing {timing}{resuming}", flush=True)
    progress = Progress()
    try:
        run_id = grader.grade(label, plan, options, store, run_id=run_id, force=args.force,
                              on_result=progress.result, say=progress.say,
                              placement=placement(args))
    except (StoreError, CaseError, OptionsError) as exc:
        return fail(str(exc))
    finally:
        progress.close()
    try:
        return render(store, run_id, out_dir, logs=True, full=args.leaderboard)
    except interrupt.Interrupted as stopped:  # the run is whole: only its reports are not
        print(f"kbench: stopped while writing the reports ({stopped}); run {run_id} is "
              f"finished and stored: `kbench report --out {shlex.quote(str(out_dir))}` writes "
              "them", file=sys.stderr)
        return 128 + stopped.signum


def asked(args: argparse.Namespace) -> dict:
    """The grading settings the command line gave (the rest: Options' defaults)."""
    given = {"device": args.device, "case_indices": getattr(args, "cases", None),
             "cuda_arch": args.cuda_arch, "timing": args.timing, "untimed": args.no_timing,
             "profile": args.profile, "require_custom_kernels": args.require_custom_kernels,
             "rules": args.rules, "atol": args.atol, "rtol": args.rtol,
             "include_degenerate": getattr(args, "include_degenerate", False),
             "build_all": args.build_all}
    return {k: v for k, v in given.items() if v is not None}


def options_for(args: argparse.Namespace, settings: dict, seed: int, out_dir: Path
                ) -> Options:
    """The run's options (OptionsError for what cannot be, a CUDA device that is not here
    among them)."""
    import torch

    from kbench.grading.options import Options, OptionsError

    device = settings.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise OptionsError("--device cuda: no CUDA device is visible to torch here")
    return Options.from_dict({
        **settings, "device": device, "out_dir": out_dir, "jobs": args.jobs, "seed": seed,
        "cache_dir": (args.cache_dir or paths.default_cache_dir()).resolve(), "pch": args.pch})


def placement(args: argparse.Namespace) -> Placement:
    from kbench.grader import Placement

    return Placement(args.executor, args.gpus.split(",") if args.gpus else None, args.slots,
                     args.address)


def render(store: Store, run_id: int, out_dir: Path, logs: bool = False,
           full: bool = True) -> int:
    """Write the run's reports; print the whole leaderboard (``full``, or a run of several
    problems), else a line per submission."""
    from kbench.grader import write_reports
    from kbench.reports import markdown

    write_reports(store, run_id, out_dir)
    run = store.load_run(run_id)
    print()
    if full or len(run.problems) > 1:
        print(markdown.leaderboard(run))
    else:
        print(markdown.console(run, shutil.get_terminal_size((120, 24)).columns), end="")
    print(f"wrote {out_dir / 'index.html'} (open it in a browser), and leaderboard.md, "
          f"results.csv and results.json beside it" + ("; logs in logs/" if logs else ""))
    return 0
