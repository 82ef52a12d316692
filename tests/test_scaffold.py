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
