"""A stored run's report folder: leaderboard.md with its PNG charts, index.html, results.csv
and results.json, each written atomically so a reader never sees half a file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from kbench.reports import charts, csv_report, html_report
from kbench.reports.markdown import device_text, leaderboard
from kbench.results.run_record import RunResult

MARKDOWN_PROBLEMS = 20  # per-problem charts in leaderboard.md up to this many problems


def write(run: RunResult, out_dir: Path, histories: dict[str, list[dict]] | None = None
          ) -> tuple[Path, Path]:
    """Write leaderboard.md with its charts (charts/*.png), index.html, results.csv and
    results.json, each atomically (temp file, then rename). ``histories``: see
    kbench.reports.html_report.page."""
    out_dir.mkdir(parents=True, exist_ok=True)
    images = _charts(run, out_dir / "charts")
    board = _atomic_write(out_dir / "leaderboard.md", leaderboard(run, images))
    _atomic_write(out_dir / "index.html", html_report.page(run, histories))
    _atomic_write(out_dir / "results.csv", csv_report.table(run))
    data = _atomic_write(out_dir / "results.json", json.dumps(run.to_dict(), indent=2) + "\n")
    return board, data


def _charts(run: RunResult, folder: Path) -> dict[str, list[str]]:
    """PNG charts for the Markdown: fast_p for a run over many problems, and speedup and
    roofline per problem (for at most MARKDOWN_PROBLEMS problems: beyond that, index.html)."""
    device = device_text(run)
    figures = {"": [("fast_p", charts.fast_p(run))]}
    if len(run.problems) <= MARKDOWN_PROBLEMS:
        for problem in run.problems:
            subs = [s for s in run.submissions if s.problem == problem.name]
            figures[problem.name] = [
                ("speedup", charts.speedups(subs)),
                ("roofline", charts.roofline(subs, problem, device, run.copy_gbps))]
    images: dict[str, list[str]] = {}
    for key, named in figures.items():
        for what, fig in named:
            if fig is None:
                continue
            name = f"{key.replace('/', '_')}-{what}.png" if key else f"{what}.png"
            folder.mkdir(parents=True, exist_ok=True)
            _atomic_write(folder / name, charts.png_bytes(fig))
            images.setdefault(key, []).append(f"charts/{name}")
    return images


def _atomic_write(path: Path, text: str | bytes) -> Path:
    """Readers see the old file or the new one, never half of either."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 is for secrets, not reports
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
