"""Grading at the builds' pace (kbench.grading.running.slots, open_problem): with several
slots a submission is graded as soon as its build is out, before its problem's last build
lands (on one device every build comes first); a problem is screened and its reference timed
once on a device, for all its submissions, however they arrive."""

from __future__ import annotations

import time
from pathlib import Path

from conftest import FIXTURES, grade, quick_task

from kbench.grading.building.build import Built
from kbench.grading.jobs import Job
from kbench.grading.options import Options
from kbench.grading.running.local import LocalExecutor
from kbench.problems.discovery import Submission
from kbench.results.run_record import ProblemRun, SubmissionResult

_SLOW_BUILD = '''"""Correct; its build (its first import) takes a while."""
import time
from pathlib import Path

import torch
import torch.nn as nn

# Only the first import (the build's) sleeps: the graders' imports find the mark and go on.
_MARK = Path({mark!r})
if not _MARK.exists():
    time.sleep({seconds})
    _MARK.touch()


class ModelNew(nn.Module):
    def forward(self, x):
        norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        return x / torch.where(norm == 0, torch.ones_like(norm), norm)
'''


def _slow_build(folder: Path, name: str, seconds: float) -> None:
    """A submission whose build sleeps ``seconds``; its mark (outside the watched build cache)
    is this test's own, so the sleep is the build's in every session."""
    mark = folder.parent / f"{name}.imported"
    (folder / f"{name}.py").write_text(_SLOW_BUILD.format(mark=str(mark), seconds=seconds))


def test_a_submission_is_graded_before_its_problem_s_last_build_lands(tmp_path, cache_dir,
                                                                      capsys):
    folder = tmp_path / "subs"
    folder.mkdir()
    (folder / "l2norm_fast.py").write_text((FIXTURES / "cpu" / "l2norm_torch_ok.py").read_text())
    _slow_build(folder, "l2norm_slow", 12)
    task = quick_task(tmp_path)
    code, results = grade([str(folder), "--task", str(task), "--device", "cpu", "--no-timing",
                           "--build-jobs", "2", "--slots", "2"], tmp_path / "out", cache_dir)
    assert code == 0 and {s["status"] for s in results["submissions"]} == {"ok"}
    lines = capsys.readouterr().out.splitlines()
    fast = next(k for k, line in enumerate(lines) if "l2norm_fast: ok" in line)
    slow_built = next(k for k, line in enumerate(lines) if "l2norm_slow imported in" in line)
    assert fast < slow_built, "\n".join(lines)
    assert sum("screening the reference" in line for line in lines) == 1


class _Sink:
    def __init__(self) -> None:
        self.problems: list[ProblemRun] = []
        self.results: list[SubmissionResult] = []

    def problem(self, problem: ProblemRun) -> None:
        self.problems.append(problem)

    def result(self, result: SubmissionResult) -> None:
        self.results.append(result)

    def revised(self, result: SubmissionResult) -> None:
        self.results.append(result)


def test_a_problem_held_open_over_units_is_screened_and_timed_once(tmp_path, cache_dir):
    # A slot given one problem's submissions in two units (its builds landed apart): the
    # reference is screened and timed once, and timed again for drift once, at the end.
    task = quick_task(tmp_path)
    options = Options(device="cpu", out_dir=tmp_path / "out", cache_dir=cache_dir, jobs=1,
                      seed=3)
    jobs = []
    for name in ("a", "b"):
        path = tmp_path / f"l2norm_{name}.py"
        path.write_text((FIXTURES / "cpu" / "l2norm_torch_ok.py").read_text())
        jobs.append(Job.make(task, "l2norm", Submission(path.stem, path), options))
    lines: list[str] = []
    executor = LocalExecutor(options, lines.append, pin=False)
    sink = _Sink()
    started = time.monotonic()
    for job in jobs:
        executor.run([job], sink, {job.path: Built(None, 0.0)}, close=False)
    executor.finish(sink)
    assert [r.status.value for r in sink.results] == ["ok", "ok"], lines
    assert all(r.benchmarks and r.benchmarks[0].candidate for r in sink.results)
    assert sum("screening the reference" in line for line in lines) == 1
    assert sum("timing the reference on" in line for line in lines) == 1
    assert sum("drift check" in line for line in lines) == 1
    assert sink.problems[-1].reference[0].reference_end is not None  # the drift check's
    assert {"screening", "reference", "drift check"} <= set(sink.problems[-1].stage_s)
    assert time.monotonic() - started < 600


def test_the_build_order_leaves_no_submission_ungraded(tmp_path, cache_dir):
    # Problems of one and of several submissions mixed, every build landing at its own pace:
    # each submission graded exactly once, each problem closed with its record.
    folder = tmp_path / "subs"
    folder.mkdir()
    for name, seconds in (("a", 0), ("b", 4), ("c", 1)):
        _slow_build(folder, f"l2norm_{name}", seconds)
    task = quick_task(tmp_path)
    code, results = grade([str(folder), "--task", str(task), "--device", "cpu", "--no-timing",
                           "--build-jobs", "2"], tmp_path / "out", cache_dir)
    assert code == 0
    assert sorted(s["name"] for s in results["submissions"]) == ["l2norm_a", "l2norm_b",
                                                                 "l2norm_c"]
    assert all(s["status"] == "ok" for s in results["submissions"])
    assert [p["name"] for p in results["problems"]] == ["l2norm"]


def test_a_submission_that_writes_kbench_s_files_beside_the_builds_is_still_flagged(
        tmp_path, cache_dir):
    # Graded by a slot while other builds run: its window cannot pin the change on it there,
    # so it is graded again alone once the builds are done, and flagged then; the others stay
    # ok. (A slot's workers cannot reach the store: the driver alone holds it open.)
    folder = tmp_path / "subs"
    folder.mkdir()
    for name in ("l2norm_writes_cache", "l2norm_torch_ok"):
        (folder / f"{name}.py").write_text((FIXTURES / "cpu" / f"{name}.py").read_text())
    _slow_build(folder, "l2norm_slow", 20)
    task = quick_task(tmp_path)
    code, results = grade([str(folder), "--task", str(task), "--device", "cpu", "--no-timing",
                           "--build-jobs", "2", "--slots", "2"], tmp_path / "out", cache_dir)
    assert code == 0
    verdicts = {s["name"]: s["status"] for s in results["submissions"]}
    assert verdicts == {"l2norm_writes_cache": "flagged", "l2norm_torch_ok": "ok",
                        "l2norm_slow": "ok"}, results["submissions"]
