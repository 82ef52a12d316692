"""What a long run shows as it goes: a line per result, and per build as it ends, with the
counts per verdict so far, the rate and the time left. On a terminal a tqdm bar holds the
counts below the lines; elsewhere (a log file, CI) each line carries them, plainly."""

from __future__ import annotations

import shutil
import sys
import time
from collections import Counter
from typing import TextIO

from kbench.reports.markdown import progress_line
from kbench.results.run_record import SubmissionResult


class Progress:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout  # as it is now, not at import
        # A result's line is cut to the terminal's width (results.json and the reports have
        # every reason in full).
        self.width = shutil.get_terminal_size((120, 24)).columns
        self.counts: Counter[str] = Counter()
        self.start = time.monotonic()
        self.first: float | None = None  # when the first result came
        self.bar = None
        self.terminal = self.stream.isatty()

    def say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def result(self, result: SubmissionResult, index: int, total: int) -> None:
        """The ``index``-th of ``total`` results this run still had to produce."""
        self.counts[result.status.value] += 1
        line = progress_line(result, index, total)
        line = line if len(line) <= self.width else line[:self.width - 3] + "..."
        if self.terminal:
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=index - 1, file=self.stream,
                                unit="sub", dynamic_ncols=True)
            self.bar.write(line, file=self.stream)
            self.bar.set_postfix_str(self._counts(), refresh=False)
            self.bar.update(1)
        else:
            print(f"{line}\n    {self._status(index, total)}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _counts(self) -> str:
        return ", ".join(f"{status} {n}" for status, n in self.counts.most_common())

    def _status(self, index: int, total: int) -> str:
        """The counts, and the pace of the results since the first: what came before it
        (builds, screening) says nothing of how fast the rest will come, and divided into
        the first few results it once promised 351 minutes for a 6-minute remainder."""
        now = time.monotonic()
        done = sum(self.counts.values())
        self.first = self.first if self.first is not None else now
        minutes = (now - self.first) / 60
        rate = (done - 1) / minutes if done >= 3 and minutes > 0 else 0.0
        pace = f"; {rate:.1f} per min" if rate else ""
        left = f", about {(total - index) / rate:.0f} min left" if rate and index < total else ""
        return f"so far: {self._counts()}{pace}{left}"
