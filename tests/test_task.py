from pathlib import Path

import pytest
import yaml

from kbench.host import paths
from kbench.problems.load import load_task
from kbench.problems.task import TaskError


def test_bundled_task_loads():
    task = load_task("l2norm")
    assert task.dtypes[0] == "float32"
    assert task.parameters == ("batch", "dim")
    assert {"batch": 16, "dim": 16384} in task.benchmarks["cuda"]
    assert {"batch": 32768, "dim": 65535} in task.benchmarks["cuda"]
    assert task.correctness.random_cases >= 20
    assert task.tolerance["float32"].rtol <= 1e-5
    assert "KernelBench" in task.semantics and "NaN" in task.semantics
    assert task.timing["cuda"].fresh_rounds_below_ms == 0.1


def test_fresh_rounds_are_optional_and_off_by_default(tmp_path):
    task = load_task(str(write(tmp_path, lambda r: r["timing"].pop("fresh_rounds_below_ms"))))
    assert task.timing["cuda"].fresh_rounds_below_ms == 0
    assert task.timing["cpu"].fresh_rounds_below_ms == 0


def write(tmp_path: Path, mutate) -> Path:
    raw = yaml.safe_load((paths.tasks_dir() / "l2norm.yaml").read_text())
    mutate(raw)
    path = tmp_path / "l2norm.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("mutate, key, expected", [
    (lambda r: r.pop("limits"), "limits", "it is required"),
    (lambda r: r.update(dtypes=["float8"]), "dtypes[0]", "one of"),
    (lambda r: r["timing"].update(min_samples="many"), "timing.min_samples", "an integer"),
    (lambda r: r["tolerance"].pop("float16"), "tolerance.float16", "it is required"),
    (lambda r: r["correctness"].update(distributions=["normal", "cauchy"]),
     "correctness.distributions[1]", "one of"),
    (lambda r: r["benchmarks"].update(cuda=[[16, 0]]), "benchmarks.cuda[0][1]", ">= 1"),
    (lambda r: r["benchmarks"].update(cpu=[[16, 16, 16]]), "benchmarks.cpu[0]", "2 dimensions"),
    (lambda r: r.update(refrence="x"), "refrence", "unknown key"),
    (lambda r: r.update(reference="kbench.reference.nope"), "reference", "importable module"),
    (lambda r: r["limits"].update(case_s=-1), "limits.case_s", ">= 0.001"),
    (lambda r: r["timing"].update(fresh_rounds_below_ms={"cuda": -1, "cpu": 0}),
     "timing.fresh_rounds_below_ms.cuda", ">= 0"),
    (lambda r: r["correctness"].update(random_shape=[[5, 2], [1, 10]]),
     "correctness.random_shape[0][1]", ">= 5"),
])
def test_malformed_task_names_file_key_and_allowed(tmp_path, mutate, key, expected):
    path = write(tmp_path, mutate)
    with pytest.raises(TaskError) as err:
        load_task(str(path))
    message = str(err.value)
    assert message.startswith(f"{path}: {key}: expected"), message
    assert expected in message


def test_invalid_yaml_and_unknown_task(tmp_path):
    bad = tmp_path / "l2norm.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(TaskError, match="not valid YAML"):
        load_task(str(bad))
    with pytest.raises(TaskError, match="no task named 'no_such_task'.*known: .*l2norm"):
        load_task("no_such_task")


def test_cases_are_named_by_the_task_s_parameters(tmp_path):
    task = load_task(str(write(tmp_path, lambda r: r["benchmarks"].update(
        cpu=[{"dim": 8, "batch": 2}, [3, 5]]))))
    assert task.benchmarks["cpu"] == ({"batch": 2, "dim": 8}, {"batch": 3, "dim": 5})
    assert task.min_bytes({"batch": 2, "dim": 8}, "float32") == 2 * 2 * 8 * 4
    with pytest.raises(TaskError, match=r"benchmarks.cpu\[0\].rows: expected one of the keys"):
        load_task(str(write(tmp_path, lambda r: r["benchmarks"].update(cpu=[{"rows": 2}]))))


_PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.tanh(x)


batch = 16
dim = 256


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return []
'''


def test_a_yaml_names_a_problem_file_and_says_what_it_cannot(tmp_path):
    (tmp_path / "tanh.py").write_text(_PROBLEM)
    path = tmp_path / "tanh_eval.yaml"
    path.write_text("reference: tanh.py\nmode: eval\nsizes: {batch: 16, dim: [32, 512]}\n"
                    "tolerance: {float32: {rtol: 1.0e-3, atol: 1.0e-3}}\n")
    task = load_task(str(path))
    assert task.mode == "eval" and task.tolerance["float32"].rtol == 1e-3
    assert task.parameters == ("batch", "dim")
    ranges = dict(zip(task.parameters, task.correctness.random_shape, strict=True))
    assert ranges == {"batch": (16, 16), "dim": (32, 512)}
    assert task.correctness.fixed_shapes[0] == {"batch": 16, "dim": 256}


def test_a_yaml_size_the_problem_lacks_is_refused(tmp_path):
    (tmp_path / "tanh.py").write_text(_PROBLEM)
    path = tmp_path / "bad.yaml"
    path.write_text("reference: tanh.py\nsizes: {width: 4}\n")
    with pytest.raises(TaskError, match=r"bad.yaml: sizes.width: expected one of the problem's "
                                        r"sizes \['batch', 'dim'\]"):
        load_task(str(path))


_BROADCAST = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.clamp(1 - predictions * targets, min=0).mean()


batch_size = 8192
input_shape = (8192,)


def get_inputs():
    return [torch.rand(batch_size, *input_shape), torch.rand(batch_size)]


def get_init_inputs():
    return []
'''


def test_a_size_only_its_own_value_or_one_fits_shrinks_to_one_on_a_cpu(tmp_path):
    # (batch, 8192) * (batch,) broadcasts only for batch 8192 or 1: 256 MiB per call as
    # written, too much for a CPU run; at 1 it is 32 KiB.
    path = tmp_path / "hinge.py"
    path.write_text(_BROADCAST)
    task = load_task(str(path))
    assert task.correctness.fixed_shapes[0] == {"batch_size": 8192, "input_shape[0]": 8192}
    assert task.cpu_correctness.fixed_shapes[0]["batch_size"] == 1


def test_a_problem_size_of_zero_or_below_is_a_fixed_size(tmp_path):
    path = tmp_path / "pad.py"
    path.write_text(_PROBLEM.replace("dim = 256", "dim = 256\npadding = 0\nlow = -1").replace(
        "torch.randn(batch, dim)", "torch.randn(batch, dim + padding).clamp_min(low)"))
    task = load_task(str(path))
    assert task.correctness.fixed_shapes[0]["padding"] == 0
    ranges = dict(zip(task.parameters, task.correctness.random_shape, strict=True))
    assert ranges["padding"] == (0, 0) and ranges["low"] == (-1, -1)


def test_random_cases_keep_fixed_sizes_as_they_are(tmp_path):
    from kbench.problems.cases import plan_cases

    path = tmp_path / "pad.py"
    path.write_text(_PROBLEM.replace("dim = 256", "dim = 256\npadding = 0\nlow = -1").replace(
        "torch.randn(batch, dim)", "torch.randn(batch, dim + padding).clamp_min(low)"))
    cases = plan_cases(load_task(str(path)), run_seed=3, device="cpu")
    assert len(cases) > 1
    assert all(c.params["padding"] == 0 and c.params["low"] == -1 for c in cases)


_WIDTHS = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, widths):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(a, b) for a, b in zip(widths, widths[1:])])

    def forward(self, x):
        return self.layers(x)


batch_size = 64
widths = [4096, 8192, 4096]


def get_inputs():
    return [torch.rand(batch_size, widths[0])]


def get_init_inputs():
    return [widths]
'''


def test_each_width_in_a_list_of_sizes_varies_and_shrinks_on_a_cpu(tmp_path):
    from kbench.problems.cases import plan_cases

    path = tmp_path / "mlp.py"
    path.write_text(_WIDTHS)
    task = load_task(str(path))
    assert task.parameters == ("batch_size", "widths[0]", "widths[1]", "widths[2]")
    assert task.correctness.fixed_shapes[0] == {"batch_size": 64, "widths[0]": 4096,
                                                 "widths[1]": 8192, "widths[2]": 4096}
    shrunk = task.cpu_correctness.fixed_shapes[0]
    assert shrunk["widths[1]"] < 8192 and shrunk["widths[0]"] < 4096
    cases = plan_cases(task, run_seed=5, device="cpu")
    assert len({c.params["widths[1]"] for c in cases}) > 1


_SIZED = '''import torch
{sizes}

def get_inputs():
    return [torch.randn(batch_size, {width})]

def get_init_inputs():
    return [{width}]
'''


def test_each_problem_module_gets_its_own_sizes_when_another_was_freed(tmp_path):
    # Two problems loaded in turn, each freed before the next: the second must never be read
    # with the first's layout (keyed by id(), a freed module's id came back; in CI a problem
    # was asked for a size only the other one defines).
    import gc
    import sys

    from kbench.shared import inputs

    files = {}
    for name, sizes, width in (("a", "batch_size = 4\nin_features = 8", "in_features"),
                               ("b", "batch_size = 4\nfeatures = 8", "features")):
        files[name] = tmp_path / f"{name}.py"
        files[name].write_text(_SIZED.format(sizes=sizes, width=width))
    expected = {"a": ["batch_size", "in_features"], "b": ["batch_size", "features"]}
    for k in range(20):
        for name, path in files.items():
            module = inputs.load_file(path, f"kbench_test_sized_{k}_{name}")
            sys.modules.pop(module.__name__)
            assert inputs.size_names(module) == expected[name], (k, name)
            assert inputs.own_sizes(module) == {n: getattr(module, n) for n in expected[name]}
            del module
            gc.collect()
