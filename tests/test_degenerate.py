"""Degenerate problems (an output of rounding noise, constant over inputs, independent of its
inputs or of its weights) are graded, marked with the reason and left out of fast_p and the
geometric mean unless --include-degenerate; a problem whose every submission was skipped is
counted apart, and a skipped verdict shows in the HTML like any other."""

import pytest
from conftest import FIXTURES, by_name, grade

from kbench.cli import commands as cli
from kbench.reports import html_report
from kbench.reports.markdown import leaderboard
from kbench.reports.summary import summarise
from kbench.results.run_record import ProblemRun, RunResult, SubmissionResult
from kbench.results.store import Store
from kbench.results.verdict import Status

DEGENERATE = FIXTURES / "degenerate"
KINDS = {"noise_mean": "rounding noise", "ones_softmax": "constant over inputs",
         "weights_only": "independent of its inputs",
         "unused_layer": "independent of its weights"}


@pytest.fixture(scope="module")
def run(tmp_path_factory, cache_dir):
    out = tmp_path_factory.mktemp("degenerate") / "reports"
    code, results = grade([str(DEGENERATE / "subs"), "--task", str(DEGENERATE / "problems"),
                           "--device", "cpu", "--no-timing", "--jobs", "2", "--seed", "7"],
                          out, cache_dir)
    assert code == 0
    return results, out


@pytest.mark.parametrize("problem, reason", KINDS.items())
def test_a_degenerate_problem_is_graded_and_says_why(run, problem, reason):
    results, _ = run
    subs = by_name(results)
    assert subs[f"{problem}/right"]["status"] == "ok", subs[f"{problem}/right"]["reason"]
    assert subs[f"{problem}/wrong"]["status"] == "wrong_output"
    record = next(p for p in results["problems"] if p["name"] == problem)
    assert record["error"] is None
    assert record["degenerate"].startswith(f"{reason}: "), record["degenerate"]
    if problem != "noise_mean":  # noise is also constant (zeros pass); the rest one reason
        assert "; " not in record["degenerate"]


def test_degenerate_problems_are_shown_and_counted_apart(run):
    results, out = run
    s = summarise(Store(out).load_run(results["run_id"]))
    assert (s.problems, s.degenerate, s.correct) == (0, 4, 0)
    board = (out / "leaderboard.md").read_text()
    assert board.count("**Degenerate** (graded; left out of fast_p") == 4
    assert "; 4 more degenerate: graded, but left out" in board
    page = (out / "index.html").read_text()
    assert page.count("(degenerate)</span>") == 4 and page.count("<b>Degenerate</b>") == 4


def test_kbench_list_says_what_the_latest_stored_run_found(run, tmp_path, capsys):
    _, out = run
    assert cli.main(["list", "--task", str(DEGENERATE / "problems"), "--out", str(out)]) == 0
    listed = capsys.readouterr().out
    assert "weights_only  (weights_only.py)  - degenerate in run 1: independent of its " \
        "inputs" in listed
    assert cli.main(["list", "--task", str(DEGENERATE / "problems"),  # no store there
                     "--out", str(tmp_path)]) == 0
    assert "- degenerate" not in capsys.readouterr().out


def test_include_degenerate_counts_them(tmp_path, cache_dir):
    code, results = grade([str(DEGENERATE / "subs" / "weights_only" / "right.py"),
                           "--task", str(DEGENERATE / "problems" / "weights_only.py"),
                           "--device", "cpu", "--no-timing", "--include-degenerate"],
                          tmp_path / "out", cache_dir)
    assert code == 0 and results["include_degenerate"]
    s = summarise(Store(tmp_path / "out").load_run(results["run_id"]))
    assert (s.problems, s.degenerate, s.correct) == (1, 0, 1)


def _sub(problem: str, status: Status, speedup=None, reason="") -> SubmissionResult:
    ci = [speedup * 0.95, speedup * 1.05] if speedup else None
    return SubmissionResult(name=f"{problem}/s{status.value}", path="", sha256="",
                            status=status, reason=reason, speedup=speedup, speedup_ci=ci,
                            problem=problem)


def _run(subs: list[SubmissionResult], include: bool = False) -> RunResult:
    return RunResult(kbench_version="t", task="set", seed=1, started="", environment={},
                     problems=[ProblemRun("a", "", ""),
                               ProblemRun("b", "", "", degenerate="constant over inputs: x"),
                               ProblemRun("c", "", "")],
                     submissions=subs, include_degenerate=include)


def test_fast_p_and_the_geomean_leave_degenerate_problems_out_unless_included():
    subs = [_sub("a", Status.OK, 2.0), _sub("b", Status.OK, 8.0), _sub("c", Status.OK, 0.5)]
    s = summarise(_run(subs))
    assert (s.problems, s.degenerate, s.correct) == (2, 1, 2)
    assert s.geomean == pytest.approx(1.0) and s.fast[1.0] == 0.5
    included = summarise(_run(subs, include=True))
    assert (included.problems, included.degenerate) == (3, 0)
    assert included.geomean == pytest.approx(2.0) and included.fast[1.0] == pytest.approx(2 / 3)
    assert "counted in fast_p and the geometric mean (--include-degenerate)" in \
        leaderboard(_run(subs, include=True))


def test_a_problem_whose_submissions_were_all_skipped_is_not_counted_as_not_correct():
    why = "CUDA submission: no CUDA device here"
    run = _run([_sub("a", Status.OK, 2.0), _sub("b", Status.OK),
                _sub("c", Status.SKIPPED, reason=why), _sub("c", Status.SKIPPED, reason=why)])
    s = summarise(run)
    assert (s.problems, s.skipped, s.correct, s.degenerate) == (1, 1, 1, 1)
    assert "- correct: 1/1 problems (100%)" in leaderboard(run)
    assert "1 more with every submission skipped" in leaderboard(run)
    page = html_report.page(run)
    assert ".skipped{background:" in page  # the verdict's text is white: it needs a colour
    assert f"title='{why}'><span class='v skipped'>skipped</span>" in page
    one_tried = summarise(_run([_sub("c", Status.SKIPPED), _sub("c", Status.WRONG_OUTPUT)]))
    assert (one_tried.problems, one_tried.skipped, one_tried.correct) == (1, 0, 0)


_LAYERNORM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x):
        return self.norm(x)


batch_size = 8
features = 16


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
'''


def test_parameters_that_no_seed_changes_do_not_make_a_problem_degenerate(tmp_path):
    # LayerNorm's weight and bias start as ones and zeros whatever the seed: the probe of
    # another seed cannot tell whether the output depends on them, so it says nothing.
    from kbench.grading.checking.screen import screen
    from kbench.grading.context import Context
    from kbench.grading.options import Options
    from kbench.host.toolchain import Toolchain
    from kbench.problems.load import load_task

    path = tmp_path / "layernorm.py"
    path.write_text(_LAYERNORM)
    options = Options(device="cpu", out_dir=tmp_path / "out", cache_dir=tmp_path / "cache",
                      jobs=1, seed=3)
    ctx = Context.create(load_task(str(path)), options, Toolchain(None, None, "9.0"))
    screen(ctx)
    assert ctx.degenerate == [] and ctx.cases


def _screened(task: str, seed: int, tmp_path):
    from kbench.grading.checking.screen import screen
    from kbench.grading.context import Context
    from kbench.grading.options import Options
    from kbench.host.toolchain import Toolchain
    from kbench.problems.load import load_task

    options = Options(device="cpu", out_dir=tmp_path / "out", cache_dir=tmp_path / "cache",
                      jobs=1, seed=seed)
    ctx = Context.create(load_task(task), options, Toolchain(None, None, "9.0"))
    screen(ctx)
    return ctx


# Seeds under which the probe on l2norm's first case (1x1, whose L2 norm is its value's sign)
# alone called the problem independent of its inputs, plus two it did not.
@pytest.mark.parametrize("seed", [0, 1, 4, 5, 6])
def test_l2norm_whose_1x1_edge_case_is_a_sign_is_never_degenerate(seed, tmp_path):
    ctx = _screened("l2norm", seed, tmp_path)
    assert ctx.degenerate == [], ctx.degenerate


def test_the_probes_run_on_the_largest_cases_never_an_edge_shape_alone(tmp_path):
    from kbench.grading.checking import degenerate
    from kbench.grading.context import Context
    from kbench.grading.options import Options
    from kbench.host.toolchain import Toolchain
    from kbench.problems.load import load_task

    for seed in range(20):
        options = Options(device="cpu", out_dir=tmp_path, cache_dir=tmp_path, jobs=1,
                          seed=seed)
        ctx = Context.create(load_task("l2norm"), options, Toolchain(None, None, "9.0"))
        elements = {c.index: 2 * c.params["batch"] * c.params["dim"] for c in ctx.cases}
        chosen = degenerate.representative(ctx, ctx.cases, elements)
        assert len(chosen) == degenerate.PROBED
        assert len({(c.params["batch"], c.params["dim"]) for c in chosen}) == len(chosen)
        smallest_chosen = min(elements[c.index] for c in chosen)
        assert sum(elements[c.index] > smallest_chosen for c in ctx.cases) < len(chosen)
        assert all(elements[c.index] > 2 for c in chosen)  # never the 1x1 case


@pytest.mark.parametrize("problem", ["weights_only", "unused_layer"])
def test_a_problem_independent_of_its_inputs_or_weights_is_marked_under_every_seed(
        problem, tmp_path):
    reason = KINDS[problem]
    for seed in range(20):
        ctx = _screened(str(DEGENERATE / "problems" / f"{problem}.py"), seed, tmp_path)
        assert [r.split(":")[0] for r in ctx.degenerate] == [reason], (seed, ctx.degenerate)
        assert "case 0 (" in ctx.degenerate[0]  # the problem's own sizes are probed


def test_probes_that_disagree_across_cases_mark_nothing(tmp_path, monkeypatch):
    # An output independent of the inputs on one case only (an edge shape) is not degenerate.
    from kbench.grading.checking import degenerate

    real = degenerate._probe

    def edge_only(ctx, case):
        probe = real(ctx, case)
        return degenerate.Probe(case, case.index == 0, probe.same_weights)

    monkeypatch.setattr(degenerate, "_probe", edge_only)
    ctx = _screened(str(DEGENERATE / "problems" / "weights_only.py"), 3, tmp_path)
    assert ctx.degenerate == []
