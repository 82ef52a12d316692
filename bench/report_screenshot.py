"""Render a stored run's index.html from its results.json and take a screenshot of it in
headless Chromium, for the docs.

    python bench/report_screenshot.py docs/evidence/h100-2026-11-25-issue16/results.json \\
        /tmp/report.png --height 2200
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kbench.reports import report_folder
from kbench.results.run_record import RunResult


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a results.json")
    parser.add_argument("png", type=Path, help="where to write the screenshot")
    parser.add_argument("--width", type=int, default=1300)
    parser.add_argument("--height", type=int, default=2200)
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("needs chromium (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    run = RunResult.from_dict(json.loads(args.results.read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        report_folder.write(run, Path(tmp))
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--window-size={args.width},{args.height}",
                        f"--screenshot={args.png.resolve()}", (Path(tmp) / "index.html").as_uri()],
                       check=True, capture_output=True, timeout=120)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
