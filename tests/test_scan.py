import pytest

from kbench.host import source_scan

KERNEL = 'load_inline(name="k", cuda_sources="__global__ void k() {}")\n'


@pytest.mark.parametrize("snippet, label", [
    ("y = F.normalize(x, dim=1)", "library-compute"),
    ("n = torch.linalg.vector_norm(x, dim=1)", "library-compute"),
    ("auto n = at::norm(x, 2, {1}, true);", "library-compute"),
    ("try:\n    y = ext.run(x)\nexcept RuntimeError:\n    y = x", "try-except"),
    ("class ModelNew(Model):\n    pass", "inherits-model"),
    ("y = torch.nn.functional.gelu(x)", "torch-functional"),
    ("y = F.relu(x)", "torch-functional"),
    ("s = torch.cuda.Stream()", "streams"),
    ("cudaStream_t s; cudaStreamCreate(&s);", "streams"),
    ("auto s = at::cuda::getStreamFromPool(); at::cuda::setCurrentCUDAStream(s);", "streams"),
    ("import threading\nthreading.Thread(target=f).start()", "threads"),
    ("import gc\nfor o in gc.get_objects(): pass", "introspection"),
    ("frame = sys._getframe(1).f_back", "introspection"),
    ("t = sys.modules['kbench.worker.timing']", "introspection"),
    ("fds = os.listdir(f'/proc/{os.getppid()}/fd')", "introspection"),
])
def test_labels_name_what_reviewers_look_for(snippet, label):
    assert label in source_scan.flags(KERNEL + snippet)
    assert "no-custom-kernel" not in source_scan.flags(KERNEL + snippet)


def test_docstrings_and_comments_are_not_code():
    source = '"""Replaced torch.norm with a kernel; no threading."""\n# F.normalize was slow\n'
    assert source_scan.flags(source + KERNEL) == []
    trailing = "ext = load_inline(verbose=True)  # output lands in kbench's build log\n"
    assert source_scan.flags(KERNEL + trailing) == []
    assert source_scan.flags(KERNEL + "import kbench  # a note\n") == ["introspection"]


def test_kbench_new_s_skeleton_carries_no_label(tmp_path):
    from kbench.cli import commands as cli

    assert cli.main(["new", "l2norm", "v9", "--dir", str(tmp_path)]) == 0
    assert source_scan.flags((tmp_path / "l2norm_v9.py").read_text()) == []


def test_plain_kernel_has_no_labels():
    assert source_scan.flags(KERNEL + "y = ext.run(x)") == []
    # launching on the caller's stream, as every kernel should, is not a label
    assert source_scan.flags(KERNEL + "cudaStream_t s = at::cuda::getCurrentCUDAStream();") == []
    assert source_scan.flags("y = x * 2") == ["no-custom-kernel"]


@pytest.mark.parametrize("kernel", ["@triton.jit\ndef k(x_ptr): pass",
                                    "@cute.kernel\ndef k(a): pass",
                                    "@T.prim_func\ndef k(A: T.Tensor): pass"])
def test_kernels_of_every_language_count_as_custom(kernel):
    assert "no-custom-kernel" not in source_scan.flags(kernel)
