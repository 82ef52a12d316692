"""On a CUDA device (the lent GPU): the bundled submissions and the GPU-only faults."""

import importlib.util
import re
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, by_name, grade, has_gpu, quick_task

from kbench.cli import commands as cli

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not has_gpu, reason="needs a CUDA device")]


# The bundled submissions in three parts, each one `kbench grade --profile quick` that ends
# within a 600 s device call (the full profile of all 18 took more than two such calls on an
# H100, and the quick one 500 s for 14 of them: docs/evidence/h100-2026-11-27-bundled-quick).
# Every file falls in one part: the CUDA l2norms, the other l2norms (Triton, CuTe DSL, TileLang:
# the full task's sizes, their speedups and share of copy bandwidth in the part's reports), and
# the other problems' torch baselines.
BUNDLED_PARTS = ("l2norm_cuda", "l2norm_dsl", "baselines")


def bundled_part(part: str) -> list[Path]:
    files = sorted((ROOT / "kbench" / "submissions").glob("*.py"))
    cuda = [f for f in files if re.fullmatch(r"l2norm_v\d+", f.stem)]
    dsl = [f for f in files if f.stem.startswith("l2norm_") and f not in cuda]
    return {"l2norm_cuda": cuda, "l2norm_dsl": dsl,
            "baselines": [f for f in files if not f.stem.startswith("l2norm_")]}[part]


@pytest.mark.parametrize("part", BUNDLED_PARTS)
def test_bundled_submissions_on_gpu(part, tmp_path, cache_dir):
    files = bundled_part(part)
    code, results = grade([*map(str, files), "--profile", "quick"], tmp_path, cache_dir)
    assert code == 0 and results["environment"]["device_name"]
    subs = by_name(results)
    assert sorted(subs) == sorted(f.stem for f in files)
    if part == "l2norm_cuda":
        assert subs["l2norm_v2"]["status"] == "build_error"
        assert "too much shared data" in subs["l2norm_v2"]["reason"]
        v1 = subs["l2norm_v1"]
        assert v1["status"] == "wrong_output" and \
            "NaN where the reference is finite" in v1["reason"]
        v3 = subs["l2norm_v3"]
        assert v3["cases_passed"] == v3["cases_total"] >= 28
        timed = [b for b in v3["benchmarks"] if b["speedup"]]
        assert len(timed) >= 5
        subs = {n: s for n, s in subs.items() if n not in ("l2norm_v1", "l2norm_v2")}
    for name, sub in subs.items():
        missing = sub["status"] == "skipped" and "not installed" in sub["reason"]
        assert missing or (sub["status"] == "ok" and sub["speedup"] > 0), (name, sub["reason"])


def test_new_skeleton_builds_runs_and_is_wrong_until_filled_in(tmp_path, cache_dir):
    assert cli.main(["new", "l2norm", "skeleton", "--dir", str(tmp_path)]) == 0
    code, results = grade([str(tmp_path / "l2norm_skeleton.py"), "--task",
                           str(quick_task(tmp_path, **{"limits.host_memory_gib": 16}))],
                          tmp_path / "out", cache_dir)
    sub = results["submissions"][0]
    assert code == 0 and sub["status"] == "wrong_output", sub["reason"]


def test_gpu_faults_then_a_correct_kernel(tmp_path, cache_dir):
    # nvcc and cudafe++ of one build, side by side, pass the quick task's 3 GiB.
    task = quick_task(tmp_path, **{"limits.case_s": 20, "limits.host_memory_gib": 16})
    code, results = grade([str(FIXTURES / "gpu"), str(ROOT / "kbench/submissions/l2norm_v3.py"),
                           "--task", str(task)], tmp_path / "out", cache_dir)
    assert code == 0
    subs = by_name(results)
    assert subs["l2norm_illegal_address"]["status"] == "cuda_error", subs["l2norm_illegal_address"]
    assert "illegal memory access" in subs["l2norm_illegal_address"]["reason"]
    assert subs["l2norm_kernel_hang"]["status"] == "timeout"
    assert subs["l2norm_empty_output"]["status"] == "wrong_output"
    assert subs["l2norm_gpu_oom"]["status"] == "out_of_memory", subs["l2norm_gpu_oom"]["reason"]
    assert subs["l2norm_v3"]["status"] == "ok", subs["l2norm_v3"]["reason"]


def test_work_left_on_a_side_stream_is_charged_and_flagged(tmp_path, cache_dir):
    task = quick_task(tmp_path, **{"benchmarks.cuda": [[4096, 4096], [8192, 8192]],
                                   "timing.budget_ms": 1000, "limits.host_memory_gib": 16})
    code, results = grade([str(FIXTURES / "gpu_timing"), "--task", str(task)],
                          tmp_path / "out", cache_dir)
    subs = by_name(results)
    twin = subs["l2norm_honest_twin"]
    assert all(b["candidate"]["side_work_ms"] is None for b in twin["benchmarks"]), twin
    for name in ("l2norm_side_stream", "l2norm_hidden_in_hold"):
        side = subs[name]
        assert code == 0 and twin["status"] == "ok" and side["status"] == "flagged", side
        assert "work left on other streams" in side["reason"]
        mine, honest = side["benchmarks"][0]["candidate"], twin["benchmarks"][0]["candidate"]
        assert mine["exclusive_hold"] is True  # so the work could not finish inside the hold
        # Charged: most of the twin's time. On an H200 at 4096x4096 the charged total was
        # 0.093-0.107 ms against the twin's 0.118 ms over three runs (not explained; perhaps
        # work that does not wait for the caller starts while the hold drains, before the
        # start event). The verdict, not the figure, keeps it off the leaderboard.
        assert mine["side_work_ms"] > 0.5 * honest["ms"] and mine["ms"] >= 0.7 * honest["ms"]
    assert "work left on other streams" in (tmp_path / "out" / "leaderboard.md").read_text()


def test_graph_timing_mode(tmp_path, cache_dir):
    task = quick_task(tmp_path, **{"limits.host_memory_gib": 16})
    code, results = grade([str(ROOT / "kbench/submissions/l2norm_v3.py"),
                           str(FIXTURES / "gpu_timing" / "l2norm_honest_twin.py"),
                           "--task", str(task), "--timing", "graph"], tmp_path / "out", cache_dir)
    assert code == 0 and results["timing_mode"] == "graph"
    for sub in results["submissions"]:
        assert sub["status"] == "ok" and sub["speedup"] > 0, sub["reason"]
    assert "CUDA graph" in (tmp_path / "out" / "leaderboard.md").read_text()


def test_patched_and_tampered_clocks(tmp_path, cache_dir):
    task = quick_task(tmp_path, **{"benchmarks.cuda": [[8192, 8192]], "timing.budget_ms": 1000,
                                   "limits.host_memory_gib": 16})
    code, results = grade([str(FIXTURES / "cpu" / "l2norm_patches_timer.py"),
                           str(FIXTURES / "cpu_timing" / "l2norm_tampers_stopwatch.py"),
                           str(FIXTURES / "cpu_timing" / "l2norm_pads_empty_pass.py"),
                           str(FIXTURES / "cpu" / "l2norm_torch_ok.py"),
                           "--task", str(task)], tmp_path / "out", cache_dir)
    subs = by_name(results)
    patched, forged, twin = (subs[n] for n in ("l2norm_patches_timer", "l2norm_tampers_stopwatch",
                                               "l2norm_torch_ok"))
    assert code == 0 and patched["status"] == twin["status"] == "ok", patched["reason"]
    assert patched["speedup"] <= 1.1 * twin["speedup"]
    assert forged["status"] == "flagged", forged["reason"]
    # Its clock's empty pass padded too: kbench's process times empty passes as well.
    padded = subs["l2norm_pads_empty_pass"]
    assert padded["status"] == "flagged" and "kbench's own clock" in padded["reason"], \
        padded["reason"]
    honest = twin["benchmarks"][0]["candidate"]
    assert honest["trusted_ms"] <= 1.15 * honest["ms"] + honest["host_ms"] + 0.1


def test_triton_is_compiled_in_the_build_and_graded(tmp_path, cache_dir):
    # The Triton l2norm is correct and timed; a Triton compile error is a build_error quoting
    # Triton, found by the build's warm-up launch.
    task = quick_task(tmp_path, **{"limits.host_memory_gib": 16})
    code, results = grade([str(ROOT / "kbench" / "submissions" / "l2norm_triton.py"),
                           str(FIXTURES / "dsl_gpu" / "l2norm_triton_compile_error.py"),
                           "--task", str(task)], tmp_path / "out",
                          cache_dir)
    subs = by_name(results)
    ok, broken = subs["l2norm_triton"], subs["l2norm_triton_compile_error"]
    assert code == 0 and ok["status"] == "ok" and ok["speedup"] > 0, ok["reason"]
    assert ok["backend"] == "triton" and (tmp_path / "out" / "logs").is_dir()
    assert broken["status"] == "build_error" and "Triton" in broken["reason"], broken["reason"]
    assert "undefined_scale" in broken["reason"]


def test_custom_kernel_share_and_its_policy(tmp_path, cache_dir):
    # What ran, from the profiler: the CUDA and Triton kernels' own share is nearly all their
    # GPU time, torch.nn.functional's is 0; only under the policy is the latter flagged. The
    # full profile reports the share; the quick one profiles only under the policy.
    task = quick_task(tmp_path, **{"limits.host_memory_gib": 16})
    files = [str(ROOT / "kbench/submissions/l2norm_v8.py"),
             str(ROOT / "kbench/submissions/l2norm_triton.py"),
             str(FIXTURES / "policy" / "l2norm_functional.py"), "--task", str(task)]
    code, results = grade(files, tmp_path / "free", cache_dir)
    subs = by_name(results)
    assert code == 0 and all(s["status"] == "ok" for s in subs.values()), subs
    assert subs["l2norm_v8"]["custom_share"] >= 0.9, subs["l2norm_v8"]["kernels"]
    assert subs["l2norm_triton"]["custom_share"] >= 0.9, subs["l2norm_triton"]["kernels"]
    functional = subs["l2norm_functional"]
    assert functional["custom_share"] == 0 and functional["kernels"][0].startswith("library")
    assert "| 0%" in (tmp_path / "free" / "leaderboard.md").read_text()
    code, results = grade([*files, "--profile", "quick"], tmp_path / "quick", cache_dir)
    assert code == 0 and all(s["custom_share"] is None for s in results["submissions"])
    code, results = grade([*files, "--profile", "quick", "--require-custom-kernels"],
                          tmp_path / "policy", cache_dir)
    subs = by_name(results)
    assert subs["l2norm_v8"]["status"] == subs["l2norm_triton"]["status"] == "ok"
    flagged = subs["l2norm_functional"]
    assert flagged["status"] == "flagged" and "ran 0% of its GPU time" in flagged["reason"]
    assert "library" in flagged["reason"], flagged["reason"]


@pytest.mark.skipif(not importlib.util.find_spec("tilelang"), reason="needs TileLang")
def test_tilelang_graded_its_kernel_its_own_its_compile_error_quoted(tmp_path, cache_dir):
    task = quick_task(tmp_path, **{"limits.host_memory_gib": 16})
    code, results = grade([str(ROOT / "kbench" / "submissions" / "l2norm_tilelang.py"),
                           str(FIXTURES / "dsl_gpu" / "l2norm_tilelang_compile_error.py"),
                           "--task", str(task), "--profile", "quick",
                           "--require-custom-kernels"], tmp_path / "out", cache_dir)
    sub, broken = (by_name(results)[n] for n in ("l2norm_tilelang",
                                                   "l2norm_tilelang_compile_error"))
    assert code == 0 and sub["status"] == "ok" and sub["speedup"] > 0, sub["reason"]
    assert sub["backend"] == "tilelang" and sub["custom_share"] >= 0.9, sub["kernels"]
    assert broken["status"] == "build_error" and "TileLang: " in broken["reason"], broken


@pytest.mark.skipif(not importlib.util.find_spec("cutlass"), reason="needs CuTe DSL")
def test_cute_dsl_l2norm_graded_ok_its_kernels_its_own(tmp_path, cache_dir):
    # 3 x 40001 is past the one-pass limit (32768 elements a row): the split path is checked too.
    shapes = [[1, 1], [7, 33], [4, 1000], [16, 1024], [2, 3000], [3, 40001]]
    task = quick_task(tmp_path, **{"limits.host_memory_gib": 16,
                                   "correctness.fixed_shapes": shapes})
    code, results = grade([str(ROOT / "kbench" / "submissions" / "l2norm_cute.py"),
                           "--task", str(task), "--profile", "quick",
                           "--require-custom-kernels"], tmp_path / "out", cache_dir)
    sub = by_name(results)["l2norm_cute"]
    assert code == 0 and sub["status"] == "ok" and sub["speedup"] > 0, sub["reason"]
    assert sub["backend"] == "cute_dsl" and sub["custom_share"] >= 0.9, sub["kernels"]


@pytest.mark.skipif(not importlib.util.find_spec("cutlass"), reason="needs CuTe DSL")
def test_a_cute_dsl_compile_error_is_a_build_error_quoting_it(tmp_path, cache_dir):
    task = quick_task(tmp_path, **{"limits.host_memory_gib": 16})
    code, results = grade([str(FIXTURES / "dsl_gpu" / "l2norm_cute_compile_error.py"),
                           "--task", str(task), "--profile", "quick"], tmp_path / "out", cache_dir)
    broken = by_name(results)["l2norm_cute_compile_error"]
    assert code == 0 and broken["backend"] == "cute_dsl", broken
    assert broken["status"] == "build_error", broken["reason"]
    assert "CuTe DSL: NameError" in broken["reason"] and "undefined_scale" in broken["reason"]


def test_an_empty_clocked_pass_waits_on_the_device_as_long_as_asked():
    # kbench's clock subtracts the empty pass's waits by their events (integrity._clocked_pass):
    # four waits of 0.5 ms, each synchronised like a call of a pass, read about 2 ms in all.
    import torch

    from kbench.worker.hold import DeviceWait
    from kbench.worker.kept import clocked
    from kbench.worker.timing import clocks_of

    device = torch.device("cuda")
    wait = DeviceWait(0.5, clocks_of(device).max_sm_mhz)
    clocked(wait, lambda i: [], 4, device)
    assert 1.5 < wait.waited_ms() < 3.0, wait.waited_ms()
