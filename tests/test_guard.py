"""kbench.grading.building.guard: what a submission writes to kbench's files is found and put
right."""

from pathlib import Path

from kbench.grading.building import guard
from kbench.grading.building.guard import Guard
from kbench.results.presence import Presence


def _tree(tmp_path: Path) -> tuple[Guard, Path, Path]:
    out, cache = tmp_path / "reports", tmp_path / "cache"
    (out / "logs").mkdir(parents=True)
    (out / "kbench.sqlite3").write_bytes(b"results")
    (out / "logs" / "a.run.log").write_text("log")
    for name in ("a-1", "b-2"):
        (cache / name).mkdir(parents=True)
        (cache / name / "lib.so").write_bytes(b"\x7fELF")
    return Guard(restorable=(out,), cache=(cache,)), out, cache


def test_nothing_changed_nothing_said(tmp_path):
    guard, out, cache = _tree(tmp_path)
    before = guard.snapshot()
    assert guard.repair(before) == []


def test_changed_files_are_restored_and_new_ones_removed(tmp_path):
    guard, out, _ = _tree(tmp_path)
    before = guard.snapshot(ignore=[out / "logs"])
    (out / "kbench.sqlite3").write_bytes(b"spoiled")
    (out / "kbench.sqlite3-journal").write_bytes(b"a hot journal")
    (out / "logs" / "a.run.log").write_text("kbench's own writes are ignored")
    lines = guard.repair(before, ignore=[out / "logs"])
    assert len(lines) == 2
    assert any("kbench.sqlite3 (changed, restored)" in line for line in lines)
    assert any("kbench.sqlite3-journal (new, removed)" in line for line in lines)
    assert (out / "kbench.sqlite3").read_bytes() == b"results"
    assert not (out / "kbench.sqlite3-journal").exists()


def test_a_write_that_keeps_size_and_mtime_is_still_seen(tmp_path):
    import os
    guard, out, _ = _tree(tmp_path)
    path = out / "kbench.sqlite3"
    stat = path.stat()
    before = guard.snapshot()
    path.write_bytes(b"RESULTS")  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # modification time set back
    assert guard.repair(before) and path.read_bytes() == b"results"


def test_deleted_files_come_back(tmp_path):
    guard, out, _ = _tree(tmp_path)
    before = guard.snapshot()
    (out / "kbench.sqlite3").unlink()
    assert "(deleted, restored)" in guard.repair(before)[0]
    assert (out / "kbench.sqlite3").read_bytes() == b"results"


def test_a_touched_build_folder_is_deleted_whole(tmp_path):
    guard, _, cache = _tree(tmp_path)
    before = guard.snapshot(ignore=[cache / "a-1"])
    (cache / "a-1" / "lib.so").write_bytes(b"its own folder: fine")
    (cache / "b-2" / "lib.so").write_bytes(b"someone else's library")
    (cache / "planted.so").write_bytes(b"x")
    lines = guard.repair(before, ignore=[cache / "a-1"])
    assert len(lines) == 2 and all("build folder deleted" in line for line in lines)
    assert (cache / "a-1" / "lib.so").exists() and not (cache / "b-2").exists()
    assert not (cache / "planted.so").exists()


def test_sqlite_side_files_that_readers_write_are_not_watched(tmp_path):
    guard, out, _ = _tree(tmp_path)
    before = guard.snapshot()
    (out / "kbench.sqlite3-shm").write_bytes(b"a reader's marks")
    (out / "kbench.sqlite3-wal").write_bytes(b"")
    assert guard.repair(before) == []


def test_shared_folders_are_compared_only_when_asked(tmp_path):
    out, code = tmp_path / "reports", tmp_path / "kbench"
    out.mkdir()
    code.mkdir()
    (out / "leaderboard.md").write_text("mine")
    (code / "grader.py").write_text("trusted")
    guard = Guard(restorable=(out, code), shared=(out,))
    before = guard.snapshot()
    (out / "leaderboard.md").write_text("another grader's")
    (code / "grader.py").write_text("tampered")
    lines = guard.repair(before, shared=False)  # another kbench process used the folder
    assert len(lines) == 1 and "grader.py (changed, restored)" in lines[0]
    assert (out / "leaderboard.md").read_text() == "another grader's"


def test_presence_tells_whether_another_process_uses_the_folder(tmp_path):
    import subprocess
    import sys
    mine = Presence(tmp_path)
    assert mine.alone() and mine.alone()  # its own lock does not count
    other = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from kbench.results.presence import Presence; "
        f"p = Presence(Path({str(tmp_path)!r})); print('in', flush=True); time.sleep(30)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "in"
        assert not mine.alone()
        if Path("/proc/locks").is_file():  # Linux: the other process is named
            assert mine.others() == [other.pid]
    finally:
        other.kill()
        other.wait()
    assert mine.alone()  # the kernel dropped the killed process's lock
    assert mine.others() == []
    mine.close()


def test_a_file_put_back_as_it_was_is_not_a_change(tmp_path):
    # Another slot restoring what its submission wrote gives the file a new inode, but the
    # same bytes: nothing this window's submission did.
    guard, out, _ = _tree(tmp_path)
    before = guard.snapshot()
    store = out / "kbench.sqlite3"
    replacement = out / "put-back"
    replacement.write_bytes(store.read_bytes())
    replacement.replace(store)
    assert guard.repair(before) == []
    store.write_bytes(b"other")
    assert guard.repair(before) == [f"{store.resolve()} (changed, restored)"]


def test_a_scan_does_not_walk_the_folders_it_skips(tmp_path, monkeypatch):
    # A run's build folders and logs hold thousands of files: listing them only to drop them
    # made each check of the build pipeline's window take seconds.
    kept, skipped = tmp_path / "kept", tmp_path / "build-folder"
    for folder in (kept, skipped / "deep"):
        folder.mkdir(parents=True)
        (folder / "f").write_text("x")
    walked = []
    real_walk = guard.os.walk

    def walk(root, *args, **kwargs):
        for folder, dirs, names in real_walk(root, *args, **kwargs):
            walked.append(Path(folder))
            yield folder, dirs, names
    monkeypatch.setattr(guard.os, "walk", walk)
    found = guard.Guard(restorable=(tmp_path,)).snapshot(ignore=[skipped])
    assert set(found) == {(kept / "f").resolve()}
    assert not any(skipped.resolve() in (p, *p.parents) for p in walked)


def test_a_watch_window_beside_another_kbench_process_names_it_and_the_folder(tmp_path):
    import subprocess
    import sys

    from kbench.grading.building.watch import Watcher
    from kbench.grading.options import Options

    options = Options(device="cpu", out_dir=tmp_path / "out", cache_dir=tmp_path / "cache",
                      jobs=1, seed=1)
    watcher = Watcher(options)
    other = subprocess.Popen([sys.executable, "-c", (
        "import time; from pathlib import Path; from kbench.results.presence import Presence; "
        f"p = Presence(Path({str(options.cache_dir)!r})); print('in', flush=True); "
        "time.sleep(30)")], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "in"
        assert watcher.watch([], [])().lines == []
    finally:
        other.kill()
        other.wait()
    note = watcher.unwatched_note()
    assert note.startswith("other kbench processes used this run's folders in 1 of its watch "
                           f"windows ({options.cache_dir}: ")
    if Path("/proc/locks").is_file():
        assert f"pid {other.pid} (ended)" in note  # killed before the note was written
