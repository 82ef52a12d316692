"""The bundled submissions, built for real with nvcc (the two seeds and kbench's own v3)."""

import pytest
from conftest import ROOT, by_name, grade, has_gpu, has_nvcc

from kbench.cli import commands as cli

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(not has_nvcc, reason="no CUDA toolkit (nvcc) found"),
    pytest.mark.skipif(has_gpu, reason="CPU-only behaviour; on a GPU see test_gpu.py"),
]


def test_bundled_submissions_on_a_machine_without_gpu(tmp_path, cache_dir):
    # `kbench new`'s skeleton rides along: it must compile as generated.
    assert cli.main(["new", "l2norm", "skeleton", "--dir", str(tmp_path / "new")]) == 0
    # Verdicts only (timing on a CPU is the other tests' business), compiled although no GPU
    # is here (--build-all): the seed that cannot build, and the skeleton, which builds as the
    # other seeds do (each nvcc build is a minute or more here; the GPU tests build them all).
    bundled = ROOT / "kbench" / "submissions"
    code, results = grade([str(bundled / "l2norm_v2.py"),
                           str(tmp_path / "new" / "l2norm_skeleton.py"), "--jobs", "2",
                           "--no-timing", "--build-all"], tmp_path, cache_dir)
    assert code == 0
    subs = by_name(results)
    v2 = subs["l2norm_v2"]
    assert v2["status"] == "build_error"
    assert "too much shared data" in v2["reason"] and v2["reason"].startswith("ptxas error")
    assert "ptxas error" in (tmp_path / "logs" / "l2norm_v2.build.log").read_text()
    skeleton = subs["l2norm_skeleton"]
    assert skeleton["status"] == "skipped", skeleton["reason"]
    assert "built with nvcc" in skeleton["reason"]
    assert "needs a CUDA device" in skeleton["reason"]
    board = (tmp_path / "leaderboard.md").read_text()
    assert "No submission passed every correctness case." in board
    assert "| l2norm_v2 " in board and "build_error" in board
