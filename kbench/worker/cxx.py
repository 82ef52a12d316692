"""The C++ compiler that kbench's builds see (CXX): the real compiler, given kbench's
precompiled torch header where one was built for exactly this compile's flags
(kbench.shared.pch_key) and the source starts by including torch/extension.h, as every
load_inline main.cpp does. Forcing that header in first then changes nothing in what is
compiled (torch's headers are included once), only how fast; where the compile with the header
fails, it runs again without, so a header can never make a build fail that would pass.

Run as ``python -S -E cxx.py REAL_COMPILER HEADERS_FOLDER ARGS...`` by the script kbench.host.pch
writes. Standard library only, and kbench.shared: this runs inside a submission's build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # started with -S: kbench's root

from kbench.shared.pch_key import FIRST_LINE, HEADER, compile_flags, key  # noqa: E402


def header_for(compiler: str, folder: Path, args: list[str]) -> Path | None:
    """The precompiled header this compile may use, or None."""
    parsed = compile_flags(args)
    if parsed is None:
        return None
    flags, source = parsed
    header = folder / key(compiler, flags) / HEADER
    if not header.with_name(HEADER + ".gch").is_file() or not _starts_with_torch(source):
        return None
    return header


def _starts_with_torch(source: str) -> bool:
    try:
        with open(source, errors="replace") as stream:
            first = next((line.strip() for line in stream if line.strip()), "")
    except OSError:
        return False
    return first == FIRST_LINE


def main(argv: list[str]) -> int:
    compiler, folder, args = argv[0], Path(argv[1]), argv[2:]
    header = header_for(compiler, folder, args)
    if header is not None:
        forced = [compiler, "-include", str(header), "-Winvalid-pch", *args]
        done = subprocess.run(forced, capture_output=True)
        if done.returncode == 0:
            sys.stdout.buffer.write(done.stdout)
            sys.stderr.buffer.write(done.stderr)
            return 0
    os.execv(compiler, [compiler, *args])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
