"""Backends: which one claims a submission, and why it cannot build or run here."""

from pathlib import Path

import pytest

from kbench.grading.jobs import Job
from kbench.grading.options import Device, Options, OptionsError, TimingMode
from kbench.host import backends
from kbench.host.toolchain import Toolchain
from kbench.results.verdict import Status

CUDA_SOURCE = 'load_inline(name="x", cpp_sources="", cuda_sources="__global__ void k() {}")'


def test_cuda_source_is_claimed_by_the_cuda_backend_and_the_rest_by_pytorch():
    assert backends.for_source(CUDA_SOURCE).name == "cuda"
    assert backends.for_source("import torch\nclass ModelNew: pass\n").name == "pytorch"


def test_why_a_cuda_submission_cannot_build_or_run_here():
    cuda = backends.for_source(CUDA_SOURCE)
    none = Toolchain(None, None, "9.0")
    assert cuda.unavailable(none, "nvcc: broken").status is Status.ENVIRONMENT_ERROR
    assert cuda.unavailable(none, None).status is Status.SKIPPED
    found = Toolchain("/usr/local/cuda", "13.0", "9.0")
    assert cuda.unavailable(found, None) is None
    assert cuda.cannot_run("cpu", found).status is Status.SKIPPED
    assert cuda.cannot_run("cuda", found) is None
    plain = backends.for_source("")
    assert plain.unavailable(none, "nvcc: broken") is None and plain.cannot_run("cpu", none) is None
    env = plain.env(found, Path("/tmp/b"), 3)
    assert env["TORCH_EXTENSIONS_DIR"] == "/tmp/b" and env["MAX_JOBS"] == "3"


def test_options_are_typed_and_checked_once(tmp_path):
    options = Options(device="cpu", out_dir=tmp_path, cache_dir=tmp_path, jobs=2, seed=5)
    assert options.device is Device.CPU and options.timing is TimingMode.EAGER
    assert Options.from_dict(options.to_dict()) == options
    for bad, message in (({"timing": "graph"}, "--timing graph"), ({"jobs": 0}, "--build-jobs 0"),
                         ({"device": "tpu"}, "--device tpu")):
        fields = {**options.to_dict(), **bad}
        try:
            Options.from_dict(fields)
        except OptionsError as exc:
            assert message in str(exc)
        else:
            raise AssertionError(f"{bad} accepted")


def test_quick_profiles_what_ran_only_under_the_policy(tmp_path):
    def profiles(**given) -> bool:
        return Options(device="cuda", out_dir=tmp_path, cache_dir=tmp_path, jobs=1, seed=1,
                       **given).profiles_kernels
    assert profiles() and not profiles(profile="quick") and not profiles(untimed=True)
    assert profiles(profile="quick", require_custom_kernels=True)
    assert profiles(untimed=True, require_custom_kernels=True)
    assert not Options(device="cpu", out_dir=tmp_path, cache_dir=tmp_path, jobs=1,
                       seed=1).profiles_kernels


def test_a_job_is_a_plain_value(tmp_path):
    job = Job(task="tasks/l2norm.yaml", problem="l2norm", name="a", path="a.py", sha256="0" * 64,
              options=Options(device="cpu", out_dir=tmp_path, cache_dir=tmp_path, jobs=1,
                              seed=1))
    assert Job.from_dict(job.to_dict()) == job
    assert job.submission().name == "a"


def test_kernel_languages_are_recognised_by_their_imports():
    assert backends.for_source("import triton\nimport triton.language as tl\n").name == "triton"
    assert backends.for_source("from triton import language as tl\n").name == "triton"
    assert backends.for_source("import cutlass.cute as cute\n").name == "cute_dsl"
    assert backends.for_source("from tilelang import language as T\n").name == "tilelang"
    assert backends.for_source("x = 'import triton'\n").name == "pytorch"  # not an import
    assert backends.for_source(CUDA_SOURCE + "\nimport triton\n").name == "cuda"  # needs nvcc
    found = Toolchain("/usr/local/cuda", "13.0", "9.0")
    triton = backends.for_source("import triton\n")
    assert triton.env(found, Path("/tmp/b"), 2)["TRITON_CACHE_DIR"] == "/tmp/b/triton-cache"
    assert triton.cannot_run("cpu", found).status is Status.SKIPPED
    assert triton.cannot_run("cuda", found) is None


@pytest.mark.parametrize("source", [
    "import torch, torch.nn as nn, triton, triton.language as tl\n",  # several on one line
    "import triton.language as tl\n",  # a submodule alone
    "from triton import jit\n",
    "from triton.language import program_id\n",
    "def kernel_module():\n    import triton\n    return triton\n",  # inside a function
    "import torch\nif True:\n    from triton import jit\n",
    "import torch, triton  # kernels\ndef broken(:\n",  # does not parse: read by lines
])
def test_a_triton_import_is_recognised_in_every_form(source):
    assert backends.for_source(source).name == "triton"


@pytest.mark.parametrize("source", [
    "import torch\n# import triton\n", "import torch\ns = 'from triton import jit'\n",
    "import tritonish\n", "from .triton import jit\n",  # another module; a relative import
])
def test_what_is_not_a_triton_import_is_not_taken_for_one(source):
    assert backends.for_source(source).name == "pytorch"


def test_kernel_languages_on_a_machine_without_gpu(tmp_path, cache_dir):
    # Recognised, named in the results, syntax checked, and skipped with the reason.
    from conftest import FIXTURES, ROOT, by_name, grade, quick_task

    task = quick_task(tmp_path)
    bundled = ROOT / "kbench" / "submissions"
    code, results = grade([str(bundled / "l2norm_triton.py"), str(bundled / "l2norm_tilelang.py"),
                           str(FIXTURES / "dsl"), "--task", str(task), "--device", "cpu",
                           "--no-timing"], tmp_path / "out", cache_dir)
    subs = by_name(results)
    assert code == 0
    assert {n: s["backend"] for n, s in subs.items()} == {
        "l2norm_triton": "triton", "l2norm_triton_syntax": "triton",
        "l2norm_tilelang": "tilelang", "l2norm_cute": "cute_dsl",
        "l2norm_cute_syntax": "cute_dsl"}
    for name in ("l2norm_triton", "l2norm_tilelang", "l2norm_cute"):
        assert subs[name]["status"] == "skipped", subs[name]["reason"]
    assert "Triton" in subs["l2norm_triton"]["reason"]
    assert "TileLang" in subs["l2norm_tilelang"]["reason"]
    assert "CuTe DSL" in subs["l2norm_cute"]["reason"]
    for name in ("l2norm_triton_syntax", "l2norm_cute_syntax"):
        assert subs[name]["status"] == "import_error", subs[name]["reason"]
        assert "SyntaxError" in subs[name]["reason"]
    assert ",l2norm_triton,triton,skipped," in (tmp_path / "out" / "results.csv").read_text()


def test_cuda_code_on_a_machine_without_gpu_is_not_compiled_unless_asked(tmp_path, cache_dir):
    # nvcc's minutes would end in `skipped` all the same: its syntax is checked, nothing built.
    from conftest import ROOT, by_name, grade, has_nvcc, quick_task

    broken = tmp_path / "l2norm_broken.py"
    broken.write_text((ROOT / "kbench" / "submissions" / "l2norm_v3.py").read_text()
                      + "\ndef oops(:\n")
    code, results = grade([str(ROOT / "kbench" / "submissions" / "l2norm_v3.py"), str(broken),
                           "--task", str(quick_task(tmp_path)), "--device", "cpu",
                           "--no-timing"], tmp_path / "out", cache_dir)
    subs = by_name(results)
    assert code == 0 and subs["l2norm_v3"]["status"] == "skipped"
    assert subs["l2norm_v3"]["build_s"] == 0
    if has_nvcc:
        assert "not compiled here" in subs["l2norm_v3"]["reason"]
        assert "--build-all" in subs["l2norm_v3"]["reason"]
        assert subs["l2norm_broken"]["status"] == "import_error"
        assert "SyntaxError" in subs["l2norm_broken"]["reason"]
