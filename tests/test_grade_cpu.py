"""End to end on the CPU: every verdict from a small fixture, in one run, plus the build cache."""

import os
import shutil
import sys

import pytest
from conftest import FIXTURES, assert_forgery_not_believed, by_name, fresh_cache, grade, quick_task

from kbench.host.build_dirs import build_dir
from kbench.host.toolchain import find_toolchain

EXPECTED = {
    "l2norm_torch_ok": "ok",
    "l2norm_cpp_ok": "ok",
    "l2norm_build_error": "build_error",
    "l2norm_import_error": "import_error",
    "l2norm_no_modelnew": "import_error",
    "l2norm_exit_at_import": "import_error",
    "l2norm_runtime_error": "runtime_error",
    "l2norm_hang": "timeout",
    "l2norm_segfault": "crashed",
    "l2norm_exit_mid_call": "crashed",
    "l2norm_flood": "crashed",
    "l2norm_huge_alloc": "out_of_memory",
    "l2norm_memory_hog": "out_of_memory",
    "l2norm_identity": "wrong_output",
    "l2norm_kernelbench": "wrong_output",
    "l2norm_half_math": "wrong_output",
    "l2norm_returns_tuple": "wrong_output",
    "l2norm_needs_cuda": "skipped",
    "l2norm_inplace": "flagged",
    "l2norm_scribbles_input": "flagged",
    "l2norm_late_write": "flagged",
    "l2norm_channel_garbage": "runtime_error",
    "l2norm_replay_after_calls": "wrong_output",
    "l2norm_repeat_differs": "flagged",
    "l2norm_writes_store": "flagged",
    "l2norm_writes_cache": "flagged",
    "l2norm_patches_timer": "ok",
    "l2norm_slows_reference": "ok",
    "l2norm_stops_reference": "ok",
    "l2norm_caches_by_shape": "wrong_output",
}
# Tricks that stay correct, with the honest submission doing the same math: never faster.
TWINS = {"l2norm_patches_timer": "l2norm_torch_ok", "l2norm_slows_reference": "l2norm_torch_ok",
         "l2norm_stops_reference": "l2norm_torch_ok"}


@pytest.fixture(scope="module")
def run(tmp_path_factory, cache_dir):
    tmp = tmp_path_factory.mktemp("grade")
    task = quick_task(tmp)
    out = tmp / "reports"
    # The fixture folder with a build error that fails before any header is parsed: a compile
    # of torch's headers less.
    subs = tmp / "cpu"
    shutil.copytree(FIXTURES / "cpu", subs)
    shutil.copy(FIXTURES / "build_error_at_once.py", subs / "l2norm_build_error.py")
    code, results = grade([str(subs), "--task", str(task), "--device", "cpu",
                           "--jobs", "2", "--seed", "1234"], out, cache_dir)
    return code, results, out, task


def test_exit_zero_and_reports_written(run):
    code, results, out, _ = run
    assert code == 0
    assert (out / "leaderboard.md").exists() and (out / "logs").is_dir()
    assert (out / "index.html").exists() and (out / "results.csv").exists()
    assert results["task"] == "l2norm" and results["seed"] == 1234
    assert results["environment"]["device"] == "cpu" and results["environment"]["torch"]
    assert not list((out / "logs").glob("*round*"))  # every round in one process on a CPU


@pytest.mark.parametrize("name, status", sorted(EXPECTED.items()))
def test_fixture_gets_its_verdict(run, name, status):
    sub = by_name(run[1])[name]
    assert sub["status"] == status, sub["reason"]
    assert status == "ok" or sub["reason"]


def test_reasons_say_what_happened(run):
    subs = by_name(run[1])
    assert subs["l2norm_caches_by_shape"]["reason"].startswith("case ")  # not a timed call
    assert "expected ';'" in subs["l2norm_build_error"]["reason"] \
        or "error" in subs["l2norm_build_error"]["reason"]
    assert "kbench_no_such_module" in subs["l2norm_import_error"]["reason"]
    assert "defines no class ModelNew" in subs["l2norm_no_modelnew"]["reason"]
    assert "SystemExit" in subs["l2norm_exit_at_import"]["reason"]
    assert "not implemented yet" in subs["l2norm_runtime_error"]["reason"]
    assert "no answer within 15 s" in subs["l2norm_hang"]["reason"]
    assert "SIGSEGV" in subs["l2norm_segfault"]["reason"]
    assert "exited with status 0" in subs["l2norm_exit_mid_call"]["reason"]
    assert "MiB to stdout/stderr" in subs["l2norm_flood"]["reason"]
    assert "GiB limit" in subs["l2norm_memory_hog"]["reason"]
    assert "NaN where the reference is finite" in subs["l2norm_kernelbench"]["reason"]
    assert "returned tuple(tensor), expected exactly" in subs["l2norm_returns_tuple"]["reason"]
    assert "CUDA" in subs["l2norm_needs_cuda"]["reason"]
    assert "returned a view of its input" in subs["l2norm_inplace"]["reason"]
    assert "changed its input" in subs["l2norm_scribbles_input"]["reason"]
    assert "output changed after it was returned" in subs["l2norm_late_write"]["reason"]
    assert "answer kbench does not accept" in subs["l2norm_channel_garbage"]["reason"]
    assert "wrong output" in subs["l2norm_replay_after_calls"]["reason"]
    assert "the same input twice gave different outputs" in subs["l2norm_repeat_differs"]["reason"]
    store = subs["l2norm_writes_store"]["reason"]
    assert "while graded, wrote to files kbench owns" in store and "kbench.sqlite3" in store
    assert "(changed, restored)" in store
    cache = subs["l2norm_writes_cache"]["reason"]
    assert "while building" in cache and "planted_by_a_submission.so (new," in cache


def test_a_submission_that_wrote_kbench_s_files_cost_nothing_else(run, cache_dir):
    _, results, _, _ = run
    assert len(results["submissions"]) == len(EXPECTED)  # the store came back whole
    assert not list(cache_dir.glob("extensions/planted_by_a_submission.so"))


@pytest.mark.parametrize("cheat, twin", sorted(TWINS.items()))
def test_no_trick_gains_beyond_noise_over_its_honest_twin(run, cheat, twin):
    """The tricks do the twin's math and aimed at 2x-5x (KernelBench reported 4.9x for one).
    CPU timings of the same math at 16x1024 (microseconds a call) differ by noise from run
    to run, so a trick's point estimate may land above its twin's by chance (once 1.43x
    against an interval up to 1.10x, on this 2-core VM mid-suite): what must not happen is a
    gain its own interval is sure of."""
    subs = by_name(run[1])
    honest, tricked = subs[twin], subs[cheat]
    assert tricked["speedup_ci"][0] <= 1.25 * honest["speedup_ci"][1], (tricked, honest)


def test_correct_submissions_are_timed_and_ranked(run):
    _, results, out, _ = run
    for name in ("l2norm_torch_ok", "l2norm_cpp_ok"):
        sub = by_name(results)[name]
        assert sub["cases_passed"] == sub["cases_total"] > 0
        assert sub["speedup"] > 0
        # Speedups divide the reference rounds taken alternately with the submission's.
        bench, ref = (sub["benchmarks"][0][k] for k in ("candidate", "reference"))
        assert bench["ms"] > 0 and ref["ms"] > 0 and bench["samples"] >= 3
        assert sub["benchmarks"][0]["speedup"] == pytest.approx(ref["ms"] / bench["ms"])
        assert bench["ci"][0] <= bench["ms"] <= bench["ci"][1]
        low, high = sub["benchmarks"][0]["speedup_ci"]
        assert low <= sub["benchmarks"][0]["speedup"] <= high
        assert bench["gbps"] == pytest.approx(2 * 16 * 1024 * 4 / bench["ms"] / 1e6)
        assert sub["speedup_ci"][0] <= sub["speedup"] <= sub["speedup_ci"][1]
    assert results["copy_gbps"] > 0 and results["timing_mode"] == "eager"
    # The reference was timed before and after the candidates, and the two are pooled.
    start, end = (results["reference"][0][k] for k in ("reference_start", "reference_end"))
    assert results["reference"][0]["reference"]["samples"] == start["samples"] + end["samples"]
    assert by_name(results)["l2norm_torch_ok"]["flags"] == ["no-custom-kernel", "library-compute"]
    assert by_name(results)["l2norm_cpp_ok"]["flags"] == []
    board = (out / "leaderboard.md").read_text()
    assert "timing eager: one call per sample; calls rotate over input sets and outputs; " \
        "wall clock" in board and "spin kernel" not in board
    ranked, not_ranked = board.split("## Not ranked")
    assert "l2norm_cpp_ok" in ranked and "l2norm_torch_ok" in ranked
    assert "l2norm_segfault" in not_ranked and "l2norm_segfault" not in ranked


def test_failure_is_reproducible_from_its_case(run, tmp_path, cache_dir):
    _, results, out, task = run
    failure = by_name(results)["l2norm_kernelbench"]["failure"]
    case = failure["case"]
    assert f"--seed 1234 --case {case['index']}" in failure["reproduce"]
    # Its task and output folder named: run from anywhere, it grades the same and writes there.
    assert f"--task {task}" in failure["reproduce"] and f"--out {out}" in failure["reproduce"]
    code, again = grade([str(FIXTURES / "cpu" / "l2norm_kernelbench.py"), "--task", str(task),
                         "--seed", "1234", "--case", str(case["index"])], tmp_path, cache_dir)
    sub = again["submissions"][0]
    assert code == 0 and sub["status"] == "wrong_output"
    assert sub["failure"]["case"] == case and sub["cases_total"] == 1
    assert sub["benchmarks"] == [] and "timing skipped" in again["notes"][0]


def test_grader_never_imported_a_submission(run):
    assert not [m for m in sys.modules if m.startswith("kbench_submission")]
    assert "kbench.worker.serve" not in sys.modules


def test_unchanged_file_is_not_rebuilt(run, tmp_path, cache_dir):
    _, _, _, task = run
    folder = build_dir(cache_dir, FIXTURES / "cpu" / "l2norm_cpp_ok.py", find_toolchain())
    libs = {p: p.stat().st_mtime_ns for p in folder.glob("**/*.so")}
    assert libs, "the first run should have built l2norm_cpp_ok"
    code, again = grade([str(FIXTURES / "cpu" / "l2norm_cpp_ok.py"), "--task", str(task),
                         "--case", "0"], tmp_path, cache_dir)
    assert code == 0 and again["submissions"][0]["status"] == "ok"
    assert {p: p.stat().st_mtime_ns for p in libs} == libs
    log = (tmp_path / "logs" / "l2norm_cpp_ok.build.log").read_text()
    assert "no work to do" in log


@pytest.mark.parametrize("ahead", [False, True])
def test_torch_compile_of_the_reference_is_a_second_baseline(tmp_path, cache_dir, monkeypatch,
                                                            ahead):
    made = []
    if ahead:  # compiled on spare cores while the submission is graded (a one-GPU host's)
        from kbench.grading import channel
        from kbench.grading.context import Spare
        from kbench.grading.running.local import LocalExecutor

        init, ahead_init = LocalExecutor.__init__, channel.Ahead.__init__

        def spare(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.spare = Spare(tuple(sorted(os.sched_getaffinity(0))), 5)

        def counted(self, ctx, log_name, *args):
            made.append(log_name)
            ahead_init(self, ctx, log_name, *args)
        monkeypatch.setattr(LocalExecutor, "__init__", spare)
        monkeypatch.setattr(channel.Ahead, "__init__", counted)
    task = quick_task(tmp_path, **{"timing.compile_reference": True})
    code, results = grade([str(FIXTURES / "cpu" / "l2norm_torch_ok.py"), "--task", str(task),
                           "--device", "cpu", "--seed", "5"], tmp_path / "out", cache_dir)
    assert code == 0, results and results["notes"]
    compiled = results["reference"][0]["compiled"]
    assert compiled["ms"] > 0 and compiled["samples"] >= 3
    sub = results["submissions"][0]
    bench = sub["benchmarks"][0]
    assert bench["compile_speedup"] == pytest.approx(compiled["ms"] / bench["candidate"]["ms"])
    assert sub["compile_speedup"] == pytest.approx(bench["compile_speedup"])
    assert "vs compile" in (tmp_path / "out" / "leaderboard.md").read_text()
    assert [name.endswith(".compile.run.log") for name in made] == ([True] if ahead else [])


def test_launch_bound_shapes_take_each_round_in_a_process_of_its_own(tmp_path, cache_dir,
                                                                    monkeypatch):
    # Every CPU shape counts as launch-bound here. The fixture's first call waits until the
    # seven round processes have built its model too: they are readied while it is checked,
    # not when its timing begins (issue 52).
    task = quick_task(tmp_path, **{"timing.fresh_rounds_below_ms": 1e6, "limits.case_s": 60})
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("ROUND_MARKERS", str(markers))
    monkeypatch.setenv("ROUND_PROCESSES", "8")
    out = tmp_path / "out"
    code, results = grade([str(FIXTURES / "ready" / "l2norm_waits_for_peers.py"), "--task",
                           str(task), "--device", "cpu", "--seed", "5"], out, cache_dir)
    sub = results["submissions"][0]
    assert code == 0 and sub["status"] == "ok" and sub["speedup"] > 0, sub["reason"]
    # kbench's own clock still ran, in the first process. Its figure is the full pass less
    # the empty one, floored at 0: for a 0.05 ms call on a loaded 2-core machine the empty
    # pass's noise can exceed the calls (seen in a clean-clone CI run), so only >= 0 holds.
    assert sub["benchmarks"][0]["candidate"]["trusted_ms"] >= 0
    logs = sorted(p.name for p in (out / "logs").glob("*.round*"))
    name = "l2norm_waits_for_peers"
    assert logs == sorted([f"{name}.round{r}.log" for r in range(2, 9)]
                          + [f"l2norm.reference.round{r}.run.log" for r in range(2, 9)])
    assert str(out / "logs" / f"{name}.round8.log") in sub["logs"]
    # Where the slot's time went, stage by stage (no profiling on a CPU); opening the fresh
    # rounds' seven processes a side is part of the timing stage.
    assert list(sub["stage_s"]) == ["load", "correctness", "timing"]
    assert sub["stage_s"]["load"] > 0
    parts = sub["timing_s"]
    assert parts["fresh processes"] > 0 and parts["reference processes"] > 0, parts
    assert sub["stage_s"]["timing"] >= parts["fresh processes"] + parts["reference processes"]


def test_timed_calls_are_checked_and_bounded_by_kbench_s_own_clock(tmp_path, cache_dir):
    # 32 MiB per tensor, so an honest call takes milliseconds, reading and writing it.
    task = quick_task(tmp_path, **{"benchmarks.cpu": [[2048, 4096]]})
    code, results = grade([str(FIXTURES / "cpu_timing"),
                           str(FIXTURES / "cpu" / "l2norm_torch_ok.py"), "--task", str(task),
                           "--device", "cpu"], tmp_path / "out", cache_dir)
    subs = by_name(results)
    forged, padded, lazy, honest = (subs[n] for n in (
        "l2norm_tampers_stopwatch", "l2norm_pads_empty_pass", "l2norm_lazy_when_timed",
        "l2norm_torch_ok"))
    assert code == 0 and honest["status"] == "ok" and honest["speedup"] > 0, honest["reason"]
    # Its stopwatch reads a third of the truth: far beyond the slack of kbench's own clock,
    # also where it pads the clock's empty pass in its own process to cancel the real one
    # (kbench's process times empty passes too, and the shortest counts). Flagged; on a host
    # busy to the end (another test run beside this one), at least not believed.
    for cheat in (forged, padded):
        assert_forgery_not_believed(cheat)
    mine = honest["benchmarks"][0]["candidate"]
    assert 0 < mine["trusted_ms"] <= 1.5 * mine["ms"] + 1.0
    # Right whenever it was not timed; returns at once (uninitialised memory) when timed.
    assert lazy["status"] == "wrong_output", lazy["reason"]
    assert "benchmark 2048x4096: timed call" in lazy["reason"]
    assert lazy["cases_passed"] == lazy["cases_total"]


def test_the_quick_profile_gathers_less_and_says_so(tmp_path, cache_dir):
    # Launch-bound everywhere and a compile baseline asked for: quick takes 3 fresh-process
    # rounds, not 8, and no torch.compile baseline; the correctness cases are the same.
    task = quick_task(tmp_path, **{"timing.fresh_rounds_below_ms": 1e6,
                                   "timing.compile_reference": True})
    out = tmp_path / "out"
    code, results = grade([str(FIXTURES / "cpu" / "l2norm_torch_ok.py"), "--task", str(task),
                           "--device", "cpu", "--seed", "5", "--profile", "quick"], out,
                          cache_dir)
    sub = results["submissions"][0]
    assert code == 0 and sub["status"] == "ok" and sub["speedup"] > 0, sub["reason"]
    assert results["profile"] == "quick" and sub["cases_passed"] == sub["cases_total"] > 0
    low, high = sub["speedup_ci"]
    assert low <= sub["speedup"] <= high
    assert results["reference"][0]["compiled"] is None and sub["compile_speedup"] is None
    logs = sorted(p.name for p in (out / "logs").glob("*round*"))
    assert logs == sorted([f"l2norm_torch_ok.round{r}.log" for r in (2, 3)]
                          + [f"l2norm.reference.round{r}.run.log" for r in (2, 3)])
    assert "profile quick (2 rounds" in (out / "leaderboard.md").read_text()
    assert "\nrun_id,profile," in "\n" + (out / "results.csv").read_text()
    assert ",quick,l2norm," in (out / "results.csv").read_text()


def test_processes_a_submission_leaves_behind_are_killed(tmp_path, cache_dir, monkeypatch):
    # Forked twice into a session of its own, a daemon leaves the worker's process group and
    # tree; kbench adopts such orphans (child subreaper) and kills them with the worker.
    import psutil

    pids = tmp_path / "pids"
    monkeypatch.setenv("STRAY_PIDS", str(pids))
    out = tmp_path / "out"
    code, results = grade([str(FIXTURES / "stray"), "--task", str(quick_task(tmp_path)),
                           "--device", "cpu", "--no-timing"], out, cache_dir)
    sub = by_name(results)["l2norm_leaves_daemon"]
    assert code == 0 and sub["status"] == "ok", sub["reason"]
    left = [int(line) for line in pids.read_text().split()]
    assert len(left) == 2  # one from the build's import, one from the correctness worker's
    assert not [pid for pid in left if psutil.pid_exists(pid)]  # killed and reaped
    logs = " ".join(p.read_text() for p in (out / "logs").glob("l2norm_leaves_daemon.*"))
    assert logs.count("killed what the worker left running after it") == 2


def test_a_problem_whose_submissions_cannot_run_times_no_reference(tmp_path,
                                                                   compile_checked):
    task = quick_task(tmp_path)
    broken = tmp_path / "l2norm_broken.py"
    broken.write_text("class ModelNew(:\n")  # a syntax error: nothing to time
    code, results = grade([str(broken), "--task", str(task), "--device", "cpu", "--seed", "3"],
                          tmp_path / "out", fresh_cache(tmp_path / "cache", compile_checked))
    assert code == 0
    assert results["submissions"][0]["status"] != "ok"
    problem = results["problems"][0]
    assert problem["reference"] == []
    assert any(note.startswith("timing skipped: no submission of this problem can run here")
               for note in problem["notes"])


def test_kbench_running_out_of_device_memory_is_the_device_s_capacity(tmp_path, cache_dir,
                                                                       monkeypatch):
    # kbench's own process out of CUDA memory while it checks (its float64 outputs beside the
    # submission's processes, seen on an H100 at KernelBench's sizes): not "kbench failed",
    # not the submission's fault, and graded again by --resume (environment_error).
    import torch

    from kbench.grading.checking import correctness

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has a total capacity of "
            "79.18 GiB of which 11.17 GiB is free. Including non-PyTorch memory, ...")

    monkeypatch.setattr(correctness, "check", out_of_memory)
    code, results = grade([str(FIXTURES / "cpu" / "l2norm_torch_ok.py"), "--task",
                           str(quick_task(tmp_path)), "--device", "cpu", "--no-timing"],
                          tmp_path / "out", cache_dir)
    sub = results["submissions"][0]
    assert code == 0 and sub["status"] == "environment_error", sub
    assert sub["reason"].startswith("this GPU's memory is too small for kbench's own checks")
    assert "Tried to allocate 12.00 GiB" in sub["reason"] and "Including" not in sub["reason"]
