"""Real C++ builds (a minute or two here): kbench's precompiled header changes no verdict and
no object file, and two files of the same code are built once, each graded in its own worker."""

import shutil

from conftest import FIXTURES, grade, quick_task

from kbench.host.build_dirs import build_dir
from kbench.host.toolchain import find_toolchain

CPP = FIXTURES / "cpu" / "l2norm_cpp_ok.py"


def test_same_verdicts_and_objects_with_and_without_the_header(tmp_path, cache_dir):
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(CPP, subs / "l2norm_a.py")  # one code under two names: one build
    (subs / "l2norm_b.py").write_text("# another sample, the same code\n" + CPP.read_text())
    task = quick_task(tmp_path)
    args = [str(subs), "--task", str(task), "--device", "cpu", "--no-timing", "--seed", "3"]
    # The header's in a cache of its own; the plain build in the suite's, where the other
    # tests' build of the same code is (built here where none has been).
    caches = {"pch": tmp_path / "cache-pch", "plain": cache_dir}
    runs = {}
    for name, extra in (("pch", ["--pch"]), ("plain", [])):
        code, results = grade(args + extra, tmp_path / name, caches[name])
        assert code == 0, results
        runs[name] = {s["name"]: s["status"] for s in results["submissions"]}
    assert runs["pch"] == runs["plain"] == {"l2norm_a": "ok", "l2norm_b": "ok"}

    tools = find_toolchain()
    folders = {n: build_dir(caches[n], subs / "l2norm_a.py", tools) for n in runs}
    assert folders["pch"] == build_dir(tmp_path / "cache-pch", subs / "l2norm_b.py", tools)
    logs = [(tmp_path / "pch" / "logs" / f"l2norm_{x}.build.log").read_text() for x in "ab"]
    assert sum("no work to do" in log for log in logs) == 1  # the other one compiled it
    assert list((tmp_path / "cache-pch" / "pch").glob("*/*/kbench_torch.h.gch"))
    ninja = (folders["pch"] / "l2norm_cpp" / "build.ninja").read_text()
    assert "kbench-g++" in ninja.splitlines()[1]  # built through the wrapper
    objects = [(folders[n] / "l2norm_cpp" / "main.o").read_bytes() for n in ("pch", "plain")]
    assert objects[0] == objects[1]
