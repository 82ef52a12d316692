"""`kbench new` for a problem file: ModelNew's constructor is the reference's own."""

import ast

from kbench.cli import commands as cli

PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n, m):
        super(Model, self).__init__()
        self.fc = nn.Linear(n, m)
        self.scale = nn.Parameter(torch.ones(m))

    def forward(self, x):
        return self.fc(x) * self.scale


n = 8
m = 4


def get_inputs():
    return [torch.randn(2, n)]


def get_init_inputs():
    return [n, m]
'''


def test_new_copies_the_reference_constructor(tmp_path, capsys):
    problem = tmp_path / "7_Linear_Scale.py"
    problem.write_text(PROBLEM)
    out = tmp_path / "mine"
    assert cli.main(["new", str(problem), "v1", "--dir", str(out)]) == 0
    written = out / "7_Linear_Scale_v1.py"
    assert f"--task {problem}" in capsys.readouterr().out
    tree = ast.parse(written.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    body = ast.unparse(init)
    assert "super().__init__()" in body and "super(Model" not in body
    assert body.index("self.fc = nn.Linear(n, m)") < body.index("self.scale = nn.Parameter")


def test_a_cpu_skeleton_filled_in_is_ok_on_a_machine_without_gpu(tmp_path, cache_dir, capsys):
    # The newcomer's path (README, "Your own kernel"): --cpu, the reference's expression filled
    # in (the scale in Python, the softmax in ATen's C++), checked with --no-timing.
    import re
    import time

    from conftest import grade

    assert cli.main(["new", "softmax", "mine", "--cpu", "--dir", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    path = tmp_path / "softmax_mine.py"
    assert f"kbench grade {path} --device cpu --no-timing" in said
    text = path.read_text()
    assert "Task: Softmax with a temperature" in text and "Base class" not in text
    text = re.sub(r"AT_DISPATCH_FLOATING_TYPES_AND2\(.*?\n    \}\);\n", "", text, flags=re.S)
    text = text.replace("auto output = torch::empty_like(input);",
                        "auto output = torch::softmax(input, -1);")
    text = text.replace("extension.softmax_mine_forward(x)",
                        "extension.softmax_mine_forward(x / self.temperature)")
    path.write_text(text)
    args = [str(path), "--device", "cpu", "--no-timing"]
    code, results = grade(args, tmp_path / "first", cache_dir)  # its first build
    (sub,) = results["submissions"]
    assert code == 0 and sub["status"] == "ok", sub["reason"]
    started = time.monotonic()
    code, results = grade([*args, "--force"], tmp_path / "again", cache_dir)
    assert code == 0 and results["submissions"][0]["status"] == "ok"
    assert time.monotonic() - started < 120  # measured on 2 cores: README, "Your own kernel"


def test_a_task_without_a_description_writes_none(tmp_path):
    # Model without a docstring of its own: nothing, never nn.Module's "Base class for ...".
    problem = tmp_path / "8_Plain.py"
    problem.write_text(PROBLEM)
    assert cli.main(["new", str(problem), "v1", "--dir", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "8_Plain_v1.py").read_text()
    assert "Task:" not in text and "Base class" not in text
