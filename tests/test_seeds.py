"""CUDA built for real with nvcc on a machine without a GPU (--build-all): a kernel that cannot
build as the seed l2norm_v2 cannot, and a light kernel that builds and cannot run here."""

import pytest
from conftest import FIXTURES, by_name, grade, has_gpu, has_nvcc

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(not has_nvcc, reason="no CUDA toolkit (nvcc) found"),
    pytest.mark.skipif(has_gpu, reason="CPU-only behaviour; on a GPU see test_gpu.py"),
]


def test_cuda_is_compiled_where_asked_on_a_machine_without_gpu(tmp_path, cache_dir):
    # Verdicts only (timing on a CPU is the other tests' business), compiled although no GPU
    # is here (--build-all): a kernel that cannot build, as the seed l2norm_v2 cannot (too
    # much shared memory for ptxas), and a kernel that builds, then cannot run. Their .cu
    # files need no torch header, so they compile in seconds where the bundled kernels' take
    # a minute or more each here; the GPU tests build, run and grade every bundled
    # submission, l2norm_v2 among them, and kbench new's skeleton.
    code, results = grade([str(FIXTURES / "nvcc" / "l2norm_shared_too_big.py"),
                           str(FIXTURES / "nvcc" / "l2norm_cuda_light.py"), "--jobs", "2",
                           "--no-timing", "--build-all"], tmp_path, cache_dir)
    assert code == 0
    subs = by_name(results)
    big = subs["l2norm_shared_too_big"]
    assert big["status"] == "build_error"
    assert "too much shared data" in big["reason"] and big["reason"].startswith("ptxas error")
    assert "ptxas error" in (tmp_path / "logs" / "l2norm_shared_too_big.build.log").read_text()
    light = subs["l2norm_cuda_light"]
    assert light["status"] == "skipped", light["reason"]
    assert "built with nvcc" in light["reason"]
    assert "needs a CUDA device" in light["reason"]
    board = (tmp_path / "leaderboard.md").read_text()
    assert "No submission passed every correctness case." in board
    assert "| l2norm_shared_too_big " in board and "build_error" in board
