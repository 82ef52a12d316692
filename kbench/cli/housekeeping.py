"""``kbench prune``: old runs out of the store, with the logs and build folders nobody uses.

A run's results live in the store; its logs in the output folder's logs/ (named by submission,
so a later run of the same name writes over them); its builds in the cache's extensions/
(content-addressed, shared by every run that graded the same bytes with the same toolchain,
and touched whenever a run uses them). So a log or build folder can go once no kept result
names it and nothing has used it since the oldest kept run started.
"""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

from kbench.results.presence import Presence
from kbench.results.store import Store


def prune(store: Store, out_dir: Path, cache_dir: Path, keep: int) -> str:
    """Keep the newest ``keep`` runs (and any being graded now); say what went."""
    gone, oldest = store.prune(keep)
    # With no run kept, nothing is in use: every log and build folder goes.
    since = datetime.fromisoformat(oldest).timestamp() if oldest else float("inf")
    named = store.logs_in_use()
    logs = [p for p in sorted((out_dir / "logs").glob("*.log"))
            if str(p) not in named and p.stat().st_mtime < since]
    for path in logs:
        path.unlink(missing_ok=True)
    lines = [f"deleted {len(gone)} run(s)" + (f" ({_ranges(gone)})" if gone else "")
             + f" and {len(logs)} log file(s) from {out_dir}"]
    presence = Presence(cache_dir)
    try:
        if not presence.alone():
            lines.append(f"left the build cache {cache_dir} alone: another kbench process is "
                         "using it")
            return "\n".join(lines)
        folders = [p for p in sorted((cache_dir / "extensions").glob("*"))
                   if p.is_dir() and p.stat().st_mtime < since]
        size = sum(f.stat().st_size for p in folders for f in p.rglob("*") if f.is_file())
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        why = "not used since the oldest kept run started" if oldest else "(no run is kept)"
        lines.append(f"deleted {len(folders)} build folder(s) ({size / 2**20:.0f} MiB) {why}, "
                     f"from {cache_dir / 'extensions'}")
    finally:
        presence.close()
    return "\n".join(lines)


def _ranges(ids: list[int]) -> str:
    """[9, 8, 7, 3] -> "runs 3, 7-9"."""
    ids, parts = sorted(ids), []
    start = prev = ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return "runs " + ", ".join(parts)
