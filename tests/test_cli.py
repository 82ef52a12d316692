import ast

import pytest
from conftest import ROOT, grade

from kbench.cli import commands as cli


def test_help_and_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    assert "grade" in capsys.readouterr().out


def test_list_shows_tasks_and_submissions(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "l2norm" in out and "l2norm_v1" in out and "l2norm_v3" in out
    assert "  gemm  (gemm.py)" in out and "gemm_torch" in out


def test_list_shows_a_folder_of_problems(tmp_path, capsys):
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "3_Op.py").write_text("x = 1\n")
    assert cli.main(["list", "--task", str(tmp_path)]) == 0
    assert "level1/3_Op  (3_Op.py)" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["no/such/file.py"], "no such .py file or folder"),
    (["README.md"], "no such .py file or folder"),
    (["kbench/submissions/l2norm_v3.py", "--device", "cpu", "--timing", "graph"],
     "--timing graph: CUDA graphs need --device cuda"),
])
def test_grader_could_not_run_exits_2(tmp_path, capsys, args, message):
    code, results = grade(args, tmp_path / "out", tmp_path / "cache")
    assert code == 2 and results is None
    assert message in capsys.readouterr().err


def test_unknown_task_prefix_exits_2(tmp_path, capsys):
    stray = tmp_path / "mystery.py"
    stray.write_text("x = 1\n")
    code, _ = grade([str(stray)], tmp_path / "out", tmp_path / "cache")
    assert code == 2
    assert "cannot tell its task" in capsys.readouterr().err


def test_new_writes_a_valid_skeleton(tmp_path, capsys):
    assert cli.main(["new", "l2norm", "v9", "--dir", str(tmp_path)]) == 0
    path = tmp_path / "l2norm_v9.py"
    tree = ast.parse(path.read_text())
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    assert classes == ["ModelNew"]
    text = path.read_text()
    assert "load_inline" in text and "__global__" in text and "def forward(self, x" in text
    assert cli.main(["new", "l2norm", "v9", "--dir", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_readme_quick_start_is_two_commands():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```", 2)[1]
    commands = [line for line in block.splitlines()[1:] if line.strip()]
    assert len(commands) == 2
    assert "pip install" in commands[0] and "kbench grade kbench/submissions/" in commands[0]
    assert "pytest" in commands[1]


def test_new_writes_here_by_default_not_among_the_bundled_submissions(tmp_path, monkeypatch):
    from kbench.host import paths

    before = set(paths.submissions_dir().iterdir())
    monkeypatch.chdir(tmp_path)
    assert cli.main(["new", "l2norm", "v9"]) == 0
    assert (tmp_path / "l2norm_v9.py").is_file()
    assert set(paths.submissions_dir().iterdir()) == before


def test_a_one_file_grade_prints_its_verdicts_not_the_whole_leaderboard(tmp_path, capsys,
                                                                         cache_dir):
    # Its lines as it goes, a line per submission at the end, each fitting a terminal.
    from conftest import FIXTURES, quick_task

    task = quick_task(tmp_path)
    args = [str(FIXTURES / "cpu" / "l2norm_kernelbench.py"), "--task", str(task), "--device",
            "cpu", "--no-timing"]
    code, results = grade(args, tmp_path / "out", cache_dir)
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and results["submissions"][0]["status"] == "wrong_output"
    assert len(lines) <= 15, "\n".join(lines)
    # The terminal's width (120 where unknown) but where a path is longer than that.
    assert max(len(line) for line in lines if str(tmp_path) not in line) <= 125
    assert not any(line.startswith("# kbench leaderboard") for line in lines)
    assert any("l2norm_kernelbench: wrong_output - case" in line for line in lines)
    code, _ = grade([*args, "--force", "--leaderboard"], tmp_path / "out", cache_dir)
    assert any(line.startswith("# kbench leaderboard") for line in
               capsys.readouterr().out.splitlines())
