"""What a run writes besides results.json: index.html (opened in headless Chromium), the
Markdown with its charts, results.csv, and `kbench compare` between two runs."""

import csv
import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from kbench.cli.commands import main
from kbench.reports import csv_report, html_report, report_folder
from kbench.reports import markdown as report
from kbench.reports.run_diff import Floors, diff
from kbench.results.run_record import (
    Benchmark,
    Measurement,
    ProblemRun,
    RunResult,
    SubmissionResult,
)
from kbench.results.verdict import Status

HOSTILE = "<script>alert('reason')</script> and a very long tail " + "x" * 200


def _bench(size: int, speedup: float, flops: int | None = None) -> Benchmark:
    ms = 1.0 / speedup
    return Benchmark(
        params={"batch": 16, "dim": size}, dtype="float32",
        reference=Measurement(1.0, [0.98, 1.02], 30, gbps=500.0),
        candidate=Measurement(ms, [ms * 0.98, ms * 1.02], 30, gbps=500.0 * speedup),
        speedup=speedup, speedup_ci=[speedup * 0.97, speedup * 1.03],
        compile_speedup=speedup * 0.8, compile_speedup_ci=[speedup * 0.77, speedup * 0.83],
        flops=flops, nbytes=2 * 16 * size * 4)


def _ok(problem: str, name: str, speedup: float, flops: int | None = None) -> SubmissionResult:
    benches = [_bench(1024, speedup, flops), _bench(4096, speedup * 1.1, flops)]
    return SubmissionResult(name=name, path=f"subs/{name}.py", sha256="ab" * 32,
                            status=Status.OK, speedup=speedup * 1.05,
                            speedup_ci=[speedup, speedup * 1.1], compile_speedup=speedup * 0.84,
                            compile_speedup_ci=[speedup * 0.8, speedup * 0.9], cases_passed=9,
                            cases_total=9, benchmarks=benches, problem=problem,
                            logs=["/abs/out/logs/x.build.log", "/abs/out/logs/x.run.log",
                                  "/abs/out/logs/x.round2.log"])


def _run() -> RunResult:
    problems = [ProblemRun("level1/relu", "relu.py", "d1", notes=["a note"],
                           reference=[_bench(1024, 1.0), _bench(4096, 1.0)], copy_gbps=3000.0),
                ProblemRun("level1/gemm", "gemm.py", "d2"),
                ProblemRun("level1/broken", "broken.py", "d3", error="no Model in it")]
    bad = SubmissionResult(name="relu_bad", path="subs/relu_bad.py", sha256="cd" * 32,
                           status=Status.WRONG_OUTPUT, reason=HOSTILE, cases_passed=2,
                           cases_total=9, problem="level1/relu",
                           failure={"reproduce": "kbench grade subs/relu_bad.py --case 3"})
    return RunResult("t", "KernelBench", 7, "2026-11-25", {"device": "cuda",
                     "device_name": "NVIDIA H100 80GB HBM3", "torch": "2.11"}, problems,
                     [_ok("level1/relu", "relu_fast", 2.0), _ok("level1/relu", "relu_same", 1.0),
                      bad, _ok("level1/gemm", "gemm_a", 1.3, flops=10**9),
                      SubmissionResult("broken_a", "b.py", "ef" * 32, Status.TASK_ERROR,
                                       reason="not graded", problem="level1/broken")],
                     run_id=3)


def test_results_csv_has_a_row_per_submission_and_size():
    rows = list(csv.DictReader(csv_report.table(_run()).splitlines()))
    assert len(rows) == 2 + 2 + 1 + 2 + 1  # untimed submissions keep one row
    assert list(rows[0]) == list(csv_report.COLUMNS)
    fast = [r for r in rows if r["submission"] == "relu_fast"]
    assert [r["size"] for r in fast] == ["batch=16;dim=1024", "batch=16;dim=4096"]
    assert float(fast[0]["size_speedup"]) == 2.0 and float(fast[0]["size_speedup_low"]) == 1.94
    assert float(fast[0]["ms"]) == 0.5 and float(fast[0]["copy_gbps"]) == 3000.0
    gemm = next(r for r in rows if r["submission"] == "gemm_a")
    assert float(gemm["tflops"]) == pytest.approx(1e9 / (1 / 1.3 * 1e-3) / 1e12)
    bad = next(r for r in rows if r["submission"] == "relu_bad")
    assert bad["status"] == "wrong_output" and bad["size"] == "" and bad["reason"] == HOSTILE


def test_the_custom_kernel_share_is_shown_where_it_was_measured():
    run = _run()
    assert "own kernels" not in report.leaderboard(run)  # nothing profiled (a CPU run)
    fast = next(s for s in run.submissions if s.name == "relu_fast")
    fast.custom_share, fast.kernels = 0.97, ["own 97%: relu_kernel", "library 3%: at::fill"]
    assert "own kernels" in report.leaderboard(run) and "| 97%" in report.leaderboard(run)
    row = next(r for r in csv.DictReader(csv_report.table(run).splitlines())
               if r["submission"] == "relu_fast")
    assert float(row["custom_share"]) == 0.97 and row["kernels"].startswith("own 97%")
    assert "own 97%: relu_kernel; library 3%" in html_report.page(run)


def test_the_page_escapes_what_submissions_wrote_and_links_logs_beside_it():
    page = html_report.page(_run())
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page
    assert "href='logs/x.build.log'" in page and "/abs/out" not in page
    assert "kbench grade subs/relu_bad.py --case 3" in page
    assert "problem error: no Model in it" in page  # the grid says why a problem has none
    # fast_p; relu's speedups and bandwidth; gemm's speedups and roofline (it counts FLOPs)
    assert page.count("<figure>") == 5


def test_markdown_rows_stay_narrow_and_reasons_are_given_in_full_below(tmp_path):
    board, _ = report_folder.write(_run(), tmp_path)
    text = board.read_text()
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert rows and max(len(line) for line in rows) <= 120
    assert f"- relu_bad: {' '.join(HOSTILE.split())}" in text
    assert "![level1_relu-speedup](charts/level1_relu-speedup.png)" in text
    assert (tmp_path / "charts" / "level1_relu-speedup.png").stat().st_size > 1000
    assert (tmp_path / "results.csv").exists() and (tmp_path / "index.html").exists()


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("no chromium here (.ci/run installs Debian's chromium)")
    return found


def test_the_page_opens_in_a_browser_without_errors_and_draws_its_charts(tmp_path):
    browser = _chromium()
    report_folder.write(_run(), tmp_path)
    url = (tmp_path / "index.html").as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([browser, *flags, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120)
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console
    figures = (tmp_path / "index.html").read_text().count("<figure>")
    assert figures >= 3 and f'data-ready="{figures}"' in dom.stdout  # the script ran to its end
    shot = tmp_path / "index.png"
    subprocess.run([browser, *flags, "--window-size=1300,2400", f"--screenshot={shot}", url],
                   capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 20_000  # a page with charts, not a blank one


def _slowed(run: RunResult, name: str, factor: float) -> RunResult:
    subs = []
    for sub in run.submissions:
        if sub.name == name:
            sub = replace(sub, benchmarks=[replace(b, speedup=b.speedup * factor,
                                                   speedup_ci=[c * factor for c in b.speedup_ci])
                                           for b in sub.benchmarks])
        subs.append(sub)
    return replace(run, submissions=subs)


def test_compare_finds_a_slowed_kernel_and_nothing_in_an_unchanged_run():
    run = _run()
    same = diff(("a", run), ("b", run))
    assert same.sizes and not any(c.beyond_noise for c in same.sizes)
    assert not same.verdicts and not same.regressions(0.0)
    slower = diff(("a", run), ("b", _slowed(run, "relu_fast", 0.7)))
    flagged = [c for c in slower.sizes if c.regressed(5.0)]
    assert {c.submission for c in flagged} == {"relu_fast"} and len(flagged) == 2
    assert not [c for c in slower.sizes if c.regressed(40.0)]  # -30 % is within 40 %


def _narrow(run: RunResult, reference_ms: float) -> RunResult:
    """``run`` with +-0.5 % speedup intervals and its reference table at ``reference_ms``."""
    return replace(run, submissions=[replace(s, benchmarks=[replace(
        b, speedup_ci=[b.speedup * 0.995, b.speedup * 1.005]) for b in s.benchmarks])
        for s in run.submissions], problems=[replace(p, reference=[replace(
            b, reference=replace(b.reference, ms=reference_ms)) for b in p.reference])
        for p in run.problems])


@pytest.mark.parametrize("reference_ms, within, beyond", [(1.0, 0.98, 0.95),
                                                           (0.02, 0.93, 0.85)])
def test_compare_calls_small_changes_noise_even_with_disjoint_intervals(reference_ms, within,
                                                                        beyond):
    # Between runs speedups move more than one run's intervals say: a change under the floor
    # (3 %, or 10 % where the reference is launch-bound) is not beyond noise.
    run = _narrow(_run(), reference_ms)
    small = diff(("a", run), ("b", _slowed(run, "relu_fast", within)))
    moved = [c for c in small.sizes if c.submission == "relu_fast"]
    assert all(c.disjoint and not c.beyond_noise for c in moved) and not small.regressions(0)
    large = diff(("a", run), ("b", _slowed(run, "relu_fast", beyond)))
    assert len(large.regressions(0)) == 2
    unfloored = diff(("a", run), ("b", _slowed(run, "relu_fast", within)), Floors(0, 0))
    assert len(unfloored.regressions(0)) == 2  # no floor: the intervals alone decide


def test_compare_lists_verdicts_new_gone_and_no_longer_correct():
    run = _run()
    later = replace(run, submissions=[replace(s, status=Status.WRONG_OUTPUT, benchmarks=[])
                                      if s.name == "relu_same" else s
                                      for s in run.submissions if s.name != "gemm_a"])
    changes = {v.submission: (v.before, v.after) for v in diff(("a", run), ("b", later)).verdicts}
    assert changes == {"relu_same": ("ok", "wrong_output"), "gemm_a": ("ok", None)}
    assert diff(("a", later), ("b", run)).verdicts[0].after == "ok"  # new or fixed: not bad
    assert len(diff(("a", run), ("b", later)).regressions(5.0)) == 1  # gone is not a regression


def test_compare_command_exits_1_on_a_regression_beyond_noise(tmp_path, capsys):
    run = _run()
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(run.to_dict()))
    after.write_text(json.dumps(_slowed(run, "relu_fast", 0.7).to_dict()))
    assert main(["compare", str(before), str(before), "--fail-on-regression", "5"]) == 0
    assert main(["compare", str(before), str(after), "--fail-on-regression", "5"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "level1/relu/relu_fast" in out
    assert main(["compare", str(before), str(tmp_path / "missing.json")]) == 2
    assert "missing.json: not a kbench results.json" in capsys.readouterr().err
    for flag in ("--noise-floor", "--launch-bound-floor", "--fail-on-regression"):
        assert main(["compare", str(before), str(after), flag, "nan"]) == 2  # it would hide all
        assert f"{flag} nan: expected a percentage" in capsys.readouterr().err


def test_a_results_json_reads_back_as_the_run_it_was():
    run = _run()
    again = RunResult.from_dict(json.loads(json.dumps(run.to_dict())))
    assert again == run


def test_bundled_charts_are_drawn_for_a_stored_gpu_run():
    # A results.json written before kbench 0.3 (one problem, at the top level) still renders.
    old = Path(__file__).parent.parent / "docs" / "evidence" / "h100-2026-11-25" / "results.json"
    run = RunResult.from_dict(json.loads(old.read_text()))
    assert run.problems[0].name == "l2norm" and run.problems[0].reference
    assert html_report.page(run).count("<figure>") == 2


def test_a_submission_graded_in_several_runs_gets_its_history_charted():
    rows = [{"run": 1, "speedup": 1.2, "status": "ok"}, {"run": 2, "speedup": None,
                                                          "status": "wrong_output"},
            {"run": 3, "speedup": 1.9, "status": "ok"}]
    page = html_report.page(_run(), {"relu_fast": rows, "relu_same": rows[:1]})
    assert page.count("<h2>History across stored runs</h2>") == 1
    assert page.count("<figure>") == 6  # one history: relu_same was graded once


def test_a_run_over_many_problems_keeps_its_page_light(monkeypatch):
    monkeypatch.setattr(html_report, "CHARTED_PROBLEMS", 2)
    page = html_report.page(_run())  # three problems: fast_p alone is drawn
    assert page.count("<figure>") == 1 and "drawn for runs of up to 2 problems" in page


def test_a_file_name_with_markup_is_text_in_tables_and_charts():
    run = _run()
    run.submissions[0] = replace(run.submissions[0], name="relu_<script>x()</script>")
    page = html_report.page(run)
    assert "<script>x()" not in page and page.count("&lt;script&gt;x()") >= 3  # table, h3, chart


def test_every_report_says_a_disturbed_timing_first():
    # index.html as the Markdown: each note on a submission's figures, the disturbance first.
    from kbench.results.run_record import TimedBeside

    run = _run()
    fast = next(s for s in run.submissions if s.name == "relu_fast")
    fast.flags = ["no-custom-kernel"]
    fast.timed_beside = TimedBeside(seconds=3.0, other_busy_cores=1.5, load_avg=2.5, cores=2,
                                    beside=["build of level1/gemm/gemm_a"], disturbed=True)
    said = report.labels(fast)
    assert said[0].startswith("timed on a disturbed host (1.5 of 2 cores busy") and \
        said[-1] == "no-custom-kernel"
    assert "timed on a disturbed host (1.5 of 2 cores busy with other work" in \
        html_report.page(run)
    assert "timed on a disturbed host" in report.leaderboard(run)


def test_a_cpu_run_is_described_in_cpu_words():
    run = replace(_run(), environment={"device": "cpu", "device_name": "AMD EPYC",
                                       "torch": "2.14"})
    board = report.leaderboard(run)
    assert "on its GPU" not in board and "device to device" not in board
    assert "SM/mem MHz" not in board and "copy bandwidth (in host memory" in board
    gpu = report.leaderboard(_run())
    assert "SM/mem MHz" not in gpu  # no clocks were read there either: no column


def test_a_speedup_is_shown_beside_the_reference_it_divides():
    # The per-size table: the submission's median and the reference rounds' beside it.
    board = report.leaderboard(_run())
    header = next(line for line in board.splitlines() if "| submission" in line
                  and "| size" in line)
    assert "| median " in header and "| reference " in header
    row = next(line for line in board.splitlines() if line.startswith("| relu_fast")
               and "16x1024" in line)
    assert "0.5 ms" in row and "1 ms" in row
