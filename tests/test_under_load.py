"""Cheats and their honest twin timed on a busy host: twice as many busy processes as cores
(bench/under_load.py's load) from a submission's first timed round to the end of kbench's own
clock. They keep the verdicts they get at idle (tests/test_grade_cpu.py) and no cheat ranks
above its twin. `python bench/under_load.py` compares whole grades, idle and loaded."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
from conftest import FIXTURES, ROOT, by_name, grade, quick_task

from kbench.grading import rounds

spec = importlib.util.spec_from_file_location("under_load", ROOT / "bench" / "under_load.py")
under_load = importlib.util.module_from_spec(spec)
sys.modules["under_load"] = under_load
spec.loader.exec_module(under_load)


@pytest.fixture
def busy_while_timed(monkeypatch):
    """Each submission's timing (its rounds and kbench's own clock) under load; its build and
    correctness at idle, which keeps the test short."""
    timed = rounds.time_submission

    def loaded(*args, **kwargs):
        with under_load.busy(2 * (os.cpu_count() or 1)):
            return timed(*args, **kwargs)

    monkeypatch.setattr(rounds, "time_submission", loaded)


def test_a_forged_stopwatch_is_flagged_on_a_busy_host(tmp_path, cache_dir, busy_while_timed):
    # Calls of a few ms at idle, several times that under load: a stopwatch reading a third
    # of the truth stays outside the slack however the scheduler stretches rounds and passes.
    task = under_load.cpu_task(tmp_path, (512, 4096))
    code, results = grade([str(FIXTURES / "cpu_timing" / "l2norm_tampers_stopwatch.py"),
                           "--task", str(task), "--device", "cpu", "--profile", "quick"],
                          tmp_path / "out", cache_dir)
    forged = by_name(results)["l2norm_tampers_stopwatch"]
    assert forged["status"] == "flagged" and "kbench's own clock" in forged["reason"], \
        (forged["reason"], forged["benchmarks"])


def test_stopping_the_reference_does_not_win_on_a_busy_host(tmp_path, cache_dir,
                                                            busy_while_timed):
    code, results = grade([str(FIXTURES / "cpu" / "l2norm_stops_reference.py"),
                           str(FIXTURES / "cpu" / "l2norm_torch_ok.py"), "--task",
                           str(quick_task(tmp_path)), "--device", "cpu", "--profile", "quick"],
                          tmp_path / "out", cache_dir)
    subs = by_name(results)
    cheat, honest = subs["l2norm_stops_reference"], subs["l2norm_torch_ok"]
    assert cheat["status"] == honest["status"] == "ok", (cheat["reason"], honest["reason"])
    # The margin test_grade_cpu allows for the noise between two runs of the same math.
    assert cheat["speedup"] <= 1.25 * honest["speedup_ci"][1], (cheat, honest)
