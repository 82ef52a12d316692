"""KernelBench-format problems end to end on the CPU: any number of inputs of any dtype,
Python scalars, integer and tuple and scalar outputs, weights on both sides, training mode,
bad problems reported once, and the bundled problems (a model equal to the reference passes,
zeros fail)."""

from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, by_name, grade

PROBLEMS = FIXTURES / "problems"
EXPECTED = {
    "argmax_rows/honest": ("ok", ""),
    "argmax_rows/int32": ("wrong_output", "output dtype torch.int32, expected torch.int64"),
    "argmax_rows/argmin": ("wrong_output", "integer and bool outputs must match exactly"),
    "batchnorm_train/honest": ("ok", ""),
    "batchnorm_train/running_stats": ("wrong_output", "values wrong"),
    "gather_rows/honest": ("ok", ""),
    "gather_rows/off_by_one": ("wrong_output", "values wrong"),
    "linear_relu/honest": ("ok", ""),
    "linear_relu/draws_first": ("wrong_output",
                                "weights differ from the reference's: fc.weight, fc.bias"),
    "mean_std/honest": ("ok", ""),
    "mean_std/swapped": ("wrong_output", "output 0: "),
    "rnn_cell/copied_sizes": ("ok", ""),
    "rnn_cell/fixed_batch": ("runtime_error", "Sizes of tensors must match"),
    "scaled_add/honest": ("ok", ""),
    "scaled_add/ignores_alpha": ("wrong_output", "values wrong"),
    "scaled_add/sparse": ("wrong_output", "returned a sparse_coo tensor, expected dense"),
    "spectrum/honest": ("ok", ""),
    "spectrum/real_part_only": ("wrong_output", "values wrong"),
    "total/honest": ("ok", ""),
    "total/zero": ("wrong_output", "values wrong"),
    "broken_no_model/any": ("task_error", "broken_no_model.py: expected a KernelBench problem "
                                          "defining Model"),
    "broken_inputs_raise/any": ("task_error", "RuntimeError: no inputs today"),
    "broken_random/any": ("task_error", "non-deterministic outputs"),
    "broken_dict_output/any": ("task_error", "the reference returns builtins.dict"),
}


@pytest.fixture(scope="module")
def run(problem_set_run):
    return problem_set_run


@pytest.mark.parametrize("name, status, words", [(n, s, w) for n, (s, w) in EXPECTED.items()])
def test_each_candidate_gets_its_verdict(run, name, status, words):
    sub = by_name(run[1])[name]
    assert sub["status"] == status, sub["reason"]
    assert words in sub["reason"]
    assert sub["problem"] == name.split("/")[0]


def test_a_right_model_is_not_blamed_for_weights(run):
    # Training-mode BatchNorm updates its running statistics as the reference runs: those
    # buffers are compared as built, so the wrong candidate's reason is its values alone.
    assert "weights differ" not in by_name(run[1])["batchnorm_train/running_stats"]["reason"]


def test_bad_problems_are_reported_once_and_the_run_goes_on(run):
    code, results = run
    assert code == 0
    errors = {p["name"]: p["error"] for p in results["problems"] if p["error"]}
    assert set(errors) == {"broken_no_model", "broken_inputs_raise", "broken_random",
                           "broken_dict_output"}
    assert all(str(PROBLEMS) in e for e in errors.values())
    assert len(results["submissions"]) == len(EXPECTED)


def _with_model_new(problem: Path, body: str) -> str:
    return problem.read_text() + "\n\n" + body


_ZEROS = '''import torch as _torch


def _zeros(value):
    if isinstance(value, _torch.Tensor):
        return _torch.zeros_like(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_zeros(v) for v in value)
    return type(value)(0)


class ModelNew(Model):
    """Computes the right answer and returns zeros of its shape."""

    def forward(self, *args):
        return _zeros(super().forward(*args))
'''


def test_bundled_problems_pass_the_reference_and_fail_zeros(tmp_path, cache_dir):
    bundled = sorted(p for p in (ROOT / "tasks").glob("*.py"))
    assert len(bundled) >= 7
    subs = tmp_path / "subs"
    for problem in bundled:
        folder = subs / problem.stem
        folder.mkdir(parents=True)
        (folder / "same.py").write_text(_with_model_new(problem, "ModelNew = Model\n"))
        (folder / "zeros.py").write_text(_with_model_new(problem, _ZEROS))
    code, results = grade([str(subs), "--device", "cpu", "--no-timing", "--jobs", "2"],
                          tmp_path / "out", cache_dir)
    assert code == 0
    got = {s["name"]: s["status"] for s in results["submissions"]}
    for problem in bundled:
        assert got[f"{problem.stem}/same"] == "ok", by_name(results)[f"{problem.stem}/same"]
        assert got[f"{problem.stem}/zeros"] == "wrong_output"


def test_a_problem_too_large_for_host_memory_is_a_problem_error(tmp_path, cache_dir,
                                                               monkeypatch):
    from types import SimpleNamespace

    from kbench.grading.checking import screen

    total = screen.psutil.virtual_memory().total
    monkeypatch.setattr(screen.psutil, "virtual_memory",  # 64 KiB free
                        lambda: SimpleNamespace(available=64 << 10, total=total))
    sub = tmp_path / "same.py"
    sub.write_text(_with_model_new(PROBLEMS / "scaled_add.py", "ModelNew = Model\n"))
    code, results = grade([str(sub), "--task", str(PROBLEMS / "scaled_add.py"),
                           "--device", "cpu", "--no-timing"], tmp_path / "out", cache_dir)
    assert code == 0
    [only] = results["submissions"]
    assert only["status"] == "task_error" and "GiB of host memory" in only["reason"]


def test_the_memory_a_reference_needs_counts_what_is_alive_at_once(tmp_path):
    # Ten rounds of three element-wise ops make 30 outputs the input's size, but no more than
    # three are alive at once: the peak is what a run needs, not the sum (which kept problems
    # that fit out, such as KernelBench's InstanceNorm on an H200).
    import importlib.util

    from kbench.problems.trial import on_meta

    path = tmp_path / "chain.py"
    path.write_text("import torch\nimport torch.nn as nn\nN = 256\n\n"
                    "class Model(nn.Module):\n    def forward(self, x):\n"
                    "        for _ in range(10):\n            x = torch.sin(x) * 2 + 1\n"
                    "        return x\n\n"
                    "def get_inputs():\n    return [torch.randn(N, N)]\n\n"
                    "def get_init_inputs():\n    return []\n")
    spec = importlib.util.spec_from_file_location("chain", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    work = on_meta(module, {"N": 256})
    assert 2 * work.input_bytes <= work.peak_bytes <= 4 * work.input_bytes


def test_work_and_traffic_are_counted_for_a_problem_file():
    from kbench.problems.load import load_task

    task = load_task(str(ROOT / "tasks" / "gemm.py"))
    params = {"M": 64, "K": 32, "N": 16}
    assert task.flops(params, "float32") == 2 * 64 * 32 * 16
    assert task.min_bytes(params, "float32") == 4 * (64 * 32 + 32 * 16 + 64 * 16)


def test_achieved_flops_are_set_against_the_device_peak():
    from kbench.reports.markdown import _bandwidth
    from kbench.results.run_record import Benchmark, Measurement

    bench = Benchmark(params={"M": 4096}, dtype="float32", flops=int(33.45e9))
    timed = Measurement(ms=1.0, ci=[0.99, 1.01], samples=10, gbps=100.0)
    text = _bandwidth(timed, 1000.0, bench, "NVIDIA H100 80GB HBM3")
    assert text == "100 GB/s (10%), 33.5 TFLOP/s (50%)"
    assert _bandwidth(timed, None, bench, "Intel(R) Xeon(R)").endswith("33.5 TFLOP/s")



def test_cases_where_the_reference_is_rounding_noise_are_dropped_not_the_problem():
    from types import SimpleNamespace

    from kbench.grading.checking.screen import Lazy, _without_noise
    from kbench.problems.cases import Case

    def entry(index: int, own: float):
        case = Case(index=index, params={"n": index + 1}, dtype="float32",
                    distribution="problem", seed=index)
        return case, own, Lazy(2.0, "zeros")

    ctx = SimpleNamespace(task=SimpleNamespace(default_tolerance=True), notes=[])
    kept = _without_noise(ctx, [entry(0, 0.3), entry(1, 1e12), entry(2, 0.5)])
    assert [case.index for case, _, _ in kept] == [0, 2]
    assert "case 1 dropped" in ctx.notes[0] and "rounding noise" in ctx.notes[0]
    everything = [entry(0, 1e12), entry(1, 1e9)]  # nothing left: the problem is degenerate
    assert _without_noise(ctx, everything) == everything


_RELU = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


batch_size = 8
dim = 64


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''
_HONEST = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n" \
          "    def forward(self, x):\n        return torch.relu(x)\n"


def test_a_submission_cannot_change_a_later_problem_or_another_submission(tmp_path, cache_dir):
    # One, on import, rewrites a problem graded after its own so that zeros would be right,
    # and plants a YAML beside it; another, while called, breaks an honest file graded later.
    problems, subs = tmp_path / "problems", tmp_path / "subs"
    problems.mkdir()
    for name in ("aa_relu", "zz_relu"):
        (problems / f"{name}.py").write_text(_RELU)
        (subs / name).mkdir(parents=True)
    later, victim = problems / "zz_relu.py", subs / "zz_relu" / "honest.py"
    victim.write_text(_HONEST)
    (subs / "zz_relu" / "zeros.py").write_text(_HONEST.replace("torch.relu(x)",
                                                               "torch.zeros_like(x)"))
    (subs / "aa_relu" / "rewrites_problem.py").write_text(
        f"from pathlib import Path\np = Path({str(later)!r})\n"
        "p.write_text(p.read_text().replace('torch.relu(x)', 'torch.zeros_like(x)'))\n"
        "p.with_suffix('.yaml').write_text('reference: zz_relu.py\\nmode: eval\\n')\n" + _HONEST)
    (subs / "aa_relu" / "rewrites_submission.py").write_text(_HONEST.replace(
        "        return torch.relu(x)",
        f"        p = __import__('pathlib').Path({str(victim)!r})\n"
        "        p.write_text(p.read_text().replace('relu(x)', 'zeros_like(x)'))\n"
        "        return torch.relu(x)"))
    code, results = grade([str(subs), "--task", str(problems), "--device", "cpu",
                           "--no-timing", "--jobs", "1"], tmp_path / "out", cache_dir)
    subs_by = by_name(results)
    assert code == 0
    for name, what in (("rewrites_problem", "zz_relu.py (changed, restored)"),
                       ("rewrites_submission", "honest.py (changed, restored)")):
        got = subs_by[f"aa_relu/{name}"]
        assert got["status"] == "flagged" and what in got["reason"], got["reason"]
    assert "zz_relu.yaml (new, removed)" in subs_by["aa_relu/rewrites_problem"]["reason"]
    assert subs_by["zz_relu/honest"]["status"] == "ok", subs_by["zz_relu/honest"]["reason"]
    assert subs_by["zz_relu/zeros"]["status"] == "wrong_output"
    assert later.read_text() == _RELU and victim.read_text() == _HONEST
    assert not later.with_suffix(".yaml").exists()


def test_a_planted_pyc_does_not_change_what_a_file_runs(tmp_path):
    # Python would run a .pyc whose header matches the source's mtime and size; kbench
    # compiles the source it hashed.
    import importlib._bootstrap_external as bootstrap
    import importlib.util
    import os

    from kbench.shared.inputs import load_file
    source = tmp_path / "problem_file.py"
    source.write_text("ANSWER = 'source'\n")
    stat = os.stat(source)
    forged = compile("ANSWER = 'planted'\n", str(source), "exec")
    cached = Path(importlib.util.cache_from_source(str(source)))
    cached.parent.mkdir()
    cached.write_bytes(bootstrap._code_to_timestamp_pyc(forged, int(stat.st_mtime),
                                                        stat.st_size))
    spec = importlib.util.spec_from_file_location("plain_import", source)
    plain = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plain)
    assert plain.ANSWER == "planted"  # the trick works on a plain import
    assert load_file(source, "kbench_loaded").ANSWER == "source"
