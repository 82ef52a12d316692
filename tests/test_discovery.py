"""Which submission goes with which problem: KernelBench's generation layout, a folder per
problem, a name prefix, and the one problem --task names."""

from pathlib import Path

import pytest

from kbench.problems.discovery import DiscoveryError, assign, find_files, find_problems


def _touch(path: Path, text: str = "x = 1\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def problem_set(tmp_path):
    root = tmp_path / "KernelBench"
    for name in ("level1/19_ReLU", "level1/1_Square_matmul", "level2/19_Conv_GELU", "l2norm"):
        _touch(root / f"{name}.py")
    _touch(root / "level1" / "__init__.py")  # hidden: not a problem
    return root


def test_a_folder_of_problems_is_named_by_path(problem_set):
    label, problems = find_problems(str(problem_set))
    assert label == "KernelBench"
    assert sorted(p.name for p in problems) == ["l2norm", "level1/19_ReLU",
                                                "level1/1_Square_matmul", "level2/19_Conv_GELU"]


def test_each_layout_finds_its_problem(problem_set, tmp_path):
    subs = tmp_path / "subs"
    files = [
        _touch(subs / "run7" / "level_1_problem_19_sample_0_kernel.py"),  # KernelBench's
        _touch(subs / "level_2_problem_19_sample_3_kernel.py"),
        _touch(subs / "19_ReLU" / "mine.py"),  # a folder named after the problem
        _touch(subs / "level1" / "1_Square_matmul" / "tiled.py"),
        _touch(subs / "l2norm_fast.py"),  # a prefix
        _touch(subs / "mystery.py"),
    ]
    _, problems = find_problems(str(problem_set))
    assigned, unmatched = assign(find_files([str(subs)]), problems, [str(subs)])
    got = {sub.name: problem.name for problem, subs_ in assigned.items() for sub in subs_}
    assert got == {
        "level_1_problem_19_sample_0_kernel": "level1/19_ReLU",
        "level_2_problem_19_sample_3_kernel": "level2/19_Conv_GELU",
        "19_ReLU/mine": "level1/19_ReLU",
        "1_Square_matmul/tiled": "level1/1_Square_matmul",
        "l2norm_fast": "l2norm",
    }
    assert len(unmatched) == 1 and str(files[-1]) in unmatched[0]


def test_a_problem_s_folder_given_itself_is_the_folder_rule(problem_set, tmp_path):
    folder = tmp_path / "subs" / "level1" / "19_ReLU"
    _touch(folder / "mine.py")
    _touch(tmp_path / "subs" / "level1" / "1_Square_matmul" / "tiled.py")
    _, problems = find_problems(str(problem_set))
    assigned, unmatched = assign(find_files([str(folder)]), problems, [str(folder)])
    assert {p.name: [s.name for s in subs] for p, subs in assigned.items()} == \
        {"level1/19_ReLU": ["19_ReLU/mine"]} and not unmatched


def test_one_named_problem_takes_any_file(problem_set, tmp_path):
    sub = _touch(tmp_path / "anything.py")
    _, problems = find_problems(str(problem_set / "level1" / "19_ReLU.py"))
    assigned, unmatched = assign([sub], problems, [str(sub)], named=True)
    assert [s.name for s in assigned[problems[0]]] == ["anything"] and not unmatched


def test_two_submissions_of_one_name_are_refused(problem_set, tmp_path):
    files = [_touch(tmp_path / "a" / "l2norm_x.py"), _touch(tmp_path / "b" / "l2norm_x.py")]
    _, problems = find_problems(str(problem_set))
    with pytest.raises(DiscoveryError, match="two submissions are named l2norm_x"):
        assign(files, problems, [str(tmp_path)])


def test_an_empty_problem_folder_is_refused(tmp_path):
    with pytest.raises(DiscoveryError, match="no problem files"):
        find_problems(str(tmp_path))
