"""bench/real_batch.py on a tiny leaderboard checkout made here: the layout (paths, the
0-based problem ids, duplicates, a sample whose problem file is missing, --levels and --first),
KernelBench's side of it (its folders, the stand-ins, the evaluator's arguments) and the
busy figures; bench/serve_batch.py's figures from a kept serve run. Nothing is graded: that
takes minutes of builds."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench(name: str):
    """bench/NAME.py as a module (registered first: its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


real_batch = _bench("real_batch")

PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.{op}(x)


batch_size = 16
dim = 1024


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
"""
SAMPLE = PROBLEM.replace("class Model(", "class ModelNew(").split("\n\nbatch_size")[0] + "\n"

# (level, problem_id as raw_data.json counts it: from 0, model, file hash, op)
ROWS = [(1, 0, "org/model-a", "aaa", "relu"), (1, 0, "model-b", "bbb", "relu"),
        (1, 0, "org/model-a", "aaa", "relu"),  # the same sample again
        (1, 1, "model-a", "ccc", "sigmoid"),
        (1, 5, "model-a", "ddd", "tanh"),  # l1_p6.py is missing
        (2, 0, "model-c", "eee", "tanh")]


@pytest.fixture
def leaderboard(tmp_path: Path) -> Path:
    """Problems l1_p1 (1_ReLU), l1_p2 (2_Sigmoid), l2_p1 (1_Tanh); data.json lists aaa and
    ccc under their problems' keys, as the real one lists each problem's best five."""
    assets = tmp_path / "lb" / "docs" / "assets"
    (assets / "problems").mkdir(parents=True)
    for name, op in [("l1_p1", "relu"), ("l1_p2", "sigmoid"), ("l2_p1", "tanh")]:
        (assets / "problems" / f"{name}.py").write_text(PROBLEM.format(op=op))
    raw = [{"level": level, "problem_id": pid, "model": model, "file": file,
            "code": SAMPLE.format(op=op), "torch_speedup": 1.0}
           for level, pid, model, file, op in ROWS]
    data = {"Level 1: 1_ReLU": [{"display_name": "a", "torch_speedup": 1.0, "file": "aaa"}],
            "Level 1: 2_Sigmoid": [{"display_name": "a", "torch_speedup": 1.0, "file": "ccc"}],
            "Level 2: 1_Tanh": []}
    (assets / "raw_data.json").write_text(json.dumps(raw))
    (assets / "data.json").write_text(json.dumps(data))
    return tmp_path / "lb"


def test_census_and_order(leaderboard: Path) -> None:
    samples, census = real_batch.read_leaderboard(leaderboard)
    assert (census.entries, census.duplicates, census.usable, census.in_data_json) == (6, 1, 4, 2)
    assert (census.offset, census.offset_agreed, census.offset_disagreed) == (1, 2, 0)
    assert census.skipped == {"l1_p6": 1} and census.selected == 4
    assert [s.path for s in samples] == [
        "level1/1_ReLU/model-b__bbb.py", "level1/1_ReLU/org-model-a__aaa.py",
        "level1/2_Sigmoid/model-a__ccc.py", "level2/1_Tanh/model-c__eee.py"]
    assert "skipped, no problem file: 1 (l1_p6 x1)" in census.lines()


def test_levels_and_first(leaderboard: Path) -> None:
    samples, census = real_batch.read_leaderboard(leaderboard, levels={1}, first=2)
    assert [s.file for s in samples] == ["bbb", "aaa"] and census.selected == 2
    assert census.usable == 4  # counted over every level
    assert [s.file for s in real_batch.read_leaderboard(leaderboard, levels={2})[0]] == ["eee"]


def test_layout_written_anew(leaderboard: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    samples, _ = real_batch.read_leaderboard(leaderboard)
    real_batch.lay_out(samples, leaderboard, work)
    subs = sorted(p.relative_to(work / "subs").as_posix() for p in work.rglob("subs/**/*.py"))
    assert subs == [s.path for s in samples]
    assert sorted(p.relative_to(work / "problems").as_posix()
                  for p in (work / "problems").rglob("*.py")) == [
        "level1/1_ReLU.py", "level1/2_Sigmoid.py", "level2/1_Tanh.py"]
    assert (work / "problems/level1/2_Sigmoid.py").read_text() == \
        (leaderboard / "docs/assets/problems/l1_p2.py").read_text()
    assert "class ModelNew" in (work / "subs" / samples[0].path).read_text()
    real_batch.lay_out(samples[:1], leaderboard, work)  # a smaller batch leaves nothing behind
    assert [p.name for p in work.rglob("*.py")] == ["model-b__bbb.py", "1_ReLU.py"]


def test_layout_only_main(leaderboard: Path, tmp_path: Path, capsys) -> None:
    record = tmp_path / "real.json"
    assert real_batch.main(["--leaderboard", str(leaderboard), "--work", str(tmp_path / "w"),
                            "--layout-only", "--levels", "1", "--limit", "3",
                            "--json", str(record)]) == 0
    saved = json.loads(record.read_text())
    assert saved["census"]["selected"] == 3 and saved["runs"] == []
    assert saved["samples"][-1] == "level1/2_Sigmoid/model-a__ccc.py"
    assert "usable: 4 (2 of them in data.json's top-5 tables" in capsys.readouterr().out


def test_kernelbench_side(leaderboard: Path, tmp_path: Path, monkeypatch) -> None:
    """One problem id per sample (its problem file copied under that id), the sample as its
    sample 0, the stand-ins on PYTHONPATH; the evaluator's overrides follow kbench's."""
    checkout, work = tmp_path / "KernelBench", tmp_path / "w"
    for folder in ("scripts", "src/kernelbench"):
        (checkout / folder).mkdir(parents=True)
    (checkout / "scripts/eval_from_generations.py").write_text("")
    samples, _ = real_batch.read_leaderboard(leaderboard, levels={1})
    real_batch.lay_out(samples, leaderboard, work)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    root, level, env = real_batch.kb_prepare(checkout, work, samples, ["--gpus", "1,2"])
    assert level == 1 and env["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert sorted(p.name for p in (root / "KernelBench/level1").iterdir()) == [
        "1_ReLU.py", "2_ReLU.py", "3_Sigmoid.py"]
    run = root / "runs/rb_level1"
    assert (run / "level_1_problem_3_sample_0_kernel.py").read_text() == samples[2].code
    assert json.loads((run / "samples.json").read_text())["1"] == samples[0].path
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(root / "src"), str(root / "shim")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")  # --gpus numbers the visible ones
    assert real_batch.kb_prepare(checkout, work, samples, ["--gpus=1,2"])[2][
        "CUDA_VISIBLE_DEVICES"] == "5,6"
    stub: dict = {}
    exec((root / "shim/modal/__init__.py").read_text(), stub)
    app = stub["__getattr__"]("App")("name")
    assert app.cls(image=stub["__getattr__"]("Image").from_registry("x").env({}))(object)
    args = real_batch.kb_arguments(level, root, 4, ["--no-timing", "--cuda-arch", "9.0"], ["x=1"])
    assert {"num_gpu_devices=4", "gpu_arch=['Hopper']", "measure_performance=False",
            "level=1", "x=1"} <= set(args)
    assert "measure_performance=True" in real_batch.kb_arguments(1, root, 1, [], [])
    # its timeout long enough for a batch's builds, unless given
    assert f"timeout={real_batch.KB_TIMEOUT_S}" in args
    given = real_batch.kb_arguments(1, root, 1, [], ["timeout=300"])
    assert [a for a in given if a.startswith("timeout=")] == ["timeout=300"]
    mixed, _ = real_batch.read_leaderboard(leaderboard)
    real_batch.lay_out(mixed, leaderboard, work)
    assert real_batch.kb_prepare(checkout, work, mixed, [])[1] == 9  # levels mixed: one run


def test_options_and_busy(monkeypatch) -> None:
    assert real_batch.count_slots(["--gpus", "0,3", "--profile", "quick"]) == 2
    assert real_batch.count_slots(["--slots=3"]) == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")  # a host's GPUs, two of them visible
    assert real_batch.count_slots(["--profile", "quick"]) == 2
    assert real_batch.option(["--cuda-arch", "9.0"], "--cuda-arch") == "9.0"
    sampler = real_batch.Sampler(lambda: None, every=2.0)
    sampler.cpu = [(2.0, [100.0, 0.0, 50.0]), (4.0, [0.0, 0.0, 0.0]), (6.0, [90.0, 10.0, 20.0])]
    assert sampler.cpu_busy([0], [(0.0, 3.0)]) == 50.0  # the intervals ending at 2 and 4
    assert sampler.cpu_busy(None, [(4.5, 9.0)]) == 40.0
    assert sampler.cpu_busy([0, 2], [(0.0, 1.0), (5.0, 6.0)]) == 65.0
    figures = real_batch.Figures("kbench", 2, wall_s=1800.0, samples=100)
    assert figures.per_hour_per_gpu == 100.0
    assert "| kbench | 100 | 1800 | 100 | 2 |" in real_batch.table([figures])


FAKE_EVALUATOR = '''import json, os, sys
args = dict(a.split("=", 1) for a in sys.argv[1:])
run = os.path.join(args["runs_dir"], args["run_name"])
kernels = sorted(f for f in os.listdir(run) if f.endswith("_kernel.py"))
print("Compile & Cache Progress: 100%|##########| 3/3", end="")  # a bar, then a line after it
print("[Curr Batch] 1 tasks over 1 GPUs; [Total Work left] 2")
results = {"1": [{"sample_id": 0, "compiled": True, "correctness": True, "metadata": {}}],
           "2": [{"sample_id": 0, "compiled": True, "correctness": False, "metadata": {}}],
           "3": [{"sample_id": 0, "compiled": False, "correctness": False,
                  "metadata": {"error": "Evaluation timed out"}}]}
for pid in results:
    print(f"Adding Eval Result to file for problem {pid} sample 0")
json.dump(results, open(os.path.join(run, "eval_results.json"), "w"))
print(len(kernels), args["measure_performance"], os.environ["PYTHONPATH"].split(os.pathsep)[1])
'''


def test_kernelbench_run(leaderboard: Path, tmp_path: Path, capsys) -> None:
    """kb_run over a stand-in for eval_from_generations.py: its verdicts read back from
    eval_results.json, its build stage ended by the first "[Curr Batch]" line."""
    checkout, work = tmp_path / "KernelBench", tmp_path / "w"
    (checkout / "src").mkdir(parents=True)
    (checkout / "scripts").mkdir()
    (checkout / "scripts/eval_from_generations.py").write_text(FAKE_EVALUATOR)
    samples, _ = real_batch.read_leaderboard(leaderboard, levels={1})
    real_batch.lay_out(samples, leaderboard, work)
    args = real_batch.parse(["--leaderboard", "x", "--work", str(work), "--out", "o",
                             "--kernelbench", str(checkout)])[0]
    figures = real_batch.Figures("KernelBench", 1)
    sampler = real_batch.Sampler(lambda: None, every=0.05)
    sampler.start()
    try:
        real_batch.kb_run(figures, work, samples, ["--no-timing"], args, sampler)
    finally:
        sampler.stop()
    assert figures.finished and figures.samples == 3
    assert figures.verdicts == {"correct": 1, "wrong": 1, "timeout": 1}
    assert "until its first batch of evaluations" in figures.build_busy_of
    assert f"3 False {work / 'kernelbench' / 'shim'}" in capsys.readouterr().out


def test_spearman_with_ties_and_the_causes_of_a_difference() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import speedup_agreement as sa

    assert sa.ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    assert sa.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert sa.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert sa.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert sa.spearman([1, 2], [1, 2]) is None and sa.spearman([1, 1, 1], [1, 2, 3]) is None
    fig = sa.KbenchFigure
    mine = {"a.py": fig(1.0, (0.98, 1.02), 1.0, False, False),
            "b.py": fig(3.0, (2.9, 3.1), 1.1, True, False),  # method, at launch-bound sizes
            "c.py": fig(2.0, (1.9, 2.1), 2.0, False, True),  # KernelBench's own figure moved
            "d.py": fig(4.0, (3.9, 4.1), None, False, False)}
    theirs = {"a.py": 1.1, "b.py": 1.0, "c.py": 0.5, "d.py": 4.2, "e.py": 9.0}
    lines = sa.report(mine, theirs)
    assert lines[0].startswith("speedups on 4 sample(s)") and "correlation" in lines[0]
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["b.py", "c.py"]
    assert "method: timed as KernelBench times, kbench gets 1.1x too" in lines[1]
    assert "launch-bound" in lines[1]
    assert "run to run" in lines[2] and "disturbed" in lines[2]


def test_kernelbench_speedups_from_its_results_and_a_baseline(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import speedup_agreement as sa

    results = {"1": [{"correctness": True, "runtime": 2.0, "ref_runtime": 4.0}],
               "2": [{"correctness": True, "runtime": 1.0}],
               "3": [{"correctness": False, "runtime": -1}],
               "4": [{"correctness": True, "runtime": 1.0}]}
    samples = {"1": "l1/a.py", "2": "l1/b.py", "3": "l1/c.py", "4": "l1/d.py"}
    files = {"1": "1_A.py", "2": "2_B.py", "3": "3_C.py", "4": "4_D.py"}
    speedups, missing = sa.kernelbench_figures(results, samples, 1, files,
                                               {"level1": {"2_B.py": {"mean": 3.0}}})
    assert speedups == {"l1/a.py": 2.0, "l1/b.py": 3.0} and missing == ["l1/d.py"]
    subs = tmp_path / "subs"
    run = {"submissions": [
        {"status": "ok", "path": str(subs / "l1/a.py"), "speedup": 1.5, "speedup_ci": [1, 2],
         "kernelbench_speedup": 1.8, "timed_beside": {"disturbed": True},
         "benchmarks": [{"candidate": {"ms": 0.01}, "reference": {"ms": 0.02}}]},
        {"status": "wrong_output", "path": str(subs / "l1/b.py"), "speedup": None}]}
    mine = sa.kbench_figures(run, subs)
    assert mine == {"l1/a.py": sa.KbenchFigure(1.5, (1, 2), 1.8, True, True)}


def test_timing_cost_per_sample_and_share_of_the_gpus() -> None:
    subs = [{"stage_s": {"timing": 30.0}, "timing_s": {"rounds": 20.0, "clock": 5.0},
             "timed_beside": {"disturbed": True, "retimed_alone": "flag"}},
            {"stage_s": {"timing": 10.0}, "timing_s": {"rounds": 6.0}},
            {"stage_s": {"load": 1.0}}]
    line, = real_batch.timing_cost(subs, wall_s=40.0, slots=2)
    assert line.startswith("timing: 20.0 GPU-s per timed sample (2 timed; rounds 13.0, "
                           "clock 2.5); 50% of the GPUs' time")
    assert "1 timed on a disturbed host, 1 timed again alone" in line


def test_kb_baseline_imports_kernelbench_with_the_stand_ins(tmp_path: Path) -> None:
    # KernelBench's package imports openai at module level (not installed for a local run): the
    # baseline script gives it real_batch's stand-ins, as the evaluator gets them.
    package = tmp_path / "kb" / "src" / "kernelbench"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from openai import OpenAI\n")
    (package / "timing.py").write_text(
        "def measure_ref_program_time(name, src):\n    return {'mean': float(len(src))}\n")
    problems = tmp_path / "problems"
    problems.mkdir()
    (problems / "1_Toy.py").write_text("x = 1\n")
    out = tmp_path / "base.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "kb_baseline.py"),
                           str(tmp_path / "kb"), str(problems), "--level", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == {"level1": {"1_Toy.py": {"mean": 6.0}}}


def test_serve_batch_counts_what_a_stopped_server_left_unanswered(tmp_path):
    """bench/serve_batch.py's figures from a kept serve run (--only grade reads it back): a
    sample sent but not answered is counted apart, not compared and not in the serve rate."""
    serve_batch = _bench("serve_batch")
    sent = [serve_batch.Sent("a.py", "p", "j1", 0.0, 4.0, "ok"),
            serve_batch.Sent("b.py", "p", "j2", 1.0, 3.0, "wrong_output", warm=True),
            serve_batch.Sent("c.py", "p", "j3", 2.0)]
    keep = tmp_path / "serve_sent.json"
    serve_batch._keep(keep, 36.0, sent)
    kept = json.loads(keep.read_text())
    assert [serve_batch.Sent(**s) for s in kept["sent"]] == sent and kept["serve_s"] == 36.0
    figures = serve_batch.Figures(3, 8, 36.0, 72.0, [2.0, 4.0], [2.0], unanswered=1)
    lines = figures.lines()
    assert "kbench serve: 36 s, 200 samples/h" in lines  # the two answered
    assert "kbench grade: 72 s, 150 samples/h" in lines
    assert "not answered over HTTP (the step stopped first): 1" in lines
