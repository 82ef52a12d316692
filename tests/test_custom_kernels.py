"""What ran: kernels sorted into the submission's own and torch's libraries', the share, and
the --require-custom-kernels policy (the profiling itself runs on a GPU: tests/test_gpu.py)."""

from types import SimpleNamespace

import pytest

from kbench.grading.channel import Stop
from kbench.grading.checking import custom_kernels
from kbench.grading.options import Options, OptionsError
from kbench.results.run_record import SubmissionResult
from kbench.results.verdict import Status, Verdict
from kbench.shared import protocol as p

OWN_CUDA = p.KernelRun("void l2norm_rows<256, float>(float const*, float*, int, int)", 90.0, "")
OWN_TRITON = p.KernelRun("_l2norm_fwd", 30.0, "")
ATEN = p.KernelRun("void at::native::vectorized_elementwise_kernel<4, at::native::"
                   "FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor"
                   "<float>, std::array<char*, 1ul>)", 10.0, "aten::fill_")


def test_own_kernels_are_the_ones_launched_outside_torch_operators():
    share = custom_kernels.classify([OWN_CUDA, ATEN])
    assert share.share == pytest.approx(0.9)
    assert share.kernels == ["own 90%: l2norm_rows",
                             "library 10%: at::native::vectorized_elementwise_kernel"]
    assert custom_kernels.classify([OWN_TRITON]).share == 1.0
    assert custom_kernels.classify([]).share is None
    assert custom_kernels.classify([OWN_TRITON, p.KernelRun("x", float("inf"), "")]).share == 1


@pytest.mark.parametrize("name", [
    # torch's types in a kernel's template arguments or parameters do not make it a library's
    "void l2norm_half<c10::Half>(c10::Half const*, c10::Half*, int)",
    "void rows_kernel<float>(at::GenericPackedTensorAccessor<float, 2ul, at::RestrictPtrTraits,"
    " int>, at::GenericPackedTensorAccessor<float, 2ul, at::RestrictPtrTraits, int>)",
    "void cutlass::Kernel2<MyGemm<cutlass::half_t>>(MyGemm<cutlass::half_t>::Params)",
])
def test_own_kernels_that_name_torch_types_stay_own(name):
    assert not custom_kernels.is_library(p.KernelRun(name, 1.0, ""))


@pytest.mark.parametrize("kernel", [
    # launched inside an operator, whatever its name
    p.KernelRun("my_own_looking_kernel", 5.0, "aten::mm"),
    # library names launched from a submission's C++ without an operator: still library
    p.KernelRun("void at::native::reduce_kernel<512, 1>(...)", 5.0, ""),
    p.KernelRun("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", 5.0, ""),
    p.KernelRun("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 5.0, ""),
    p.KernelRun("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>"
                "(cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4::Params)", 5.0, ""),
    p.KernelRun("void cudnn::engines_precompiled::nchwToNhwcKernel<float>(...)", 5.0, ""),
    p.KernelRun("triton_poi_fused_div_linalg_vector_norm_0", 5.0, ""),
    p.KernelRun("Memcpy DtoD (Device -> Device)", 5.0, ""),
    p.KernelRun("void cub::DeviceReduceKernel<...>(...)", 5.0, ""),
])
def test_library_kernels_by_operator_or_by_name(kernel):
    assert custom_kernels.is_library(kernel)
    assert custom_kernels.classify([kernel]).share == 0.0


class _Channel:
    """Answers Profile with ``kernels``, or raises ``stop``."""

    def __init__(self, kernels=(), stop=None):
        self.kernels, self.stop, self.asked = list(kernels), stop, []

    def call(self, request, timeout, stage):
        self.asked.append((request, stage))
        if self.stop:
            raise self.stop
        return p.Profiled(self.kernels)


def _ctx(policy: bool) -> SimpleNamespace:
    return SimpleNamespace(
        options=SimpleNamespace(require_custom_kernels=policy),
        task=SimpleNamespace(benchmark_dtype="float32", limits=SimpleNamespace(case_s=5.0)),
        distribution="problem", spec=lambda params, dtype: p.ModelSpec([], dtype, 1, params))


def _result() -> SubmissionResult:
    return SubmissionResult(name="x", path="x.py", sha256="0", status=Status.OK)


def _measure(ctx, channel, result, sizes) -> None:
    """Profiled in ``channel``'s process, then judged (kbench.grading.running.submission)."""
    custom_kernels.judge(ctx, result, custom_kernels.profiled(ctx, channel, sizes))


def test_the_share_is_recorded_at_every_timed_size_and_judged_only_under_the_policy():
    sizes = [{"batch": 4, "dim": 8}, {"batch": 2, "dim": 16}]
    result, channel = _result(), _Channel([ATEN])
    _measure(_ctx(False), channel, result, sizes)
    assert result.custom_share == 0.0 and result.kernels[0].startswith("library 100%")
    assert [stage for _, stage in channel.asked] == ["kernels at 4x8", "kernels at 2x16"]
    with pytest.raises(Stop) as stop:
        _measure(_ctx(True), channel, _result(), sizes)
    assert stop.value.verdict.status is Status.FLAGGED
    assert "ran 0% of its GPU time" in stop.value.verdict.reason
    assert "vectorized_elementwise_kernel" in stop.value.verdict.reason
    _measure(_ctx(True), _Channel([OWN_CUDA, ATEN]), result, sizes)
    assert result.custom_share == pytest.approx(0.9)
    nothing = _result()  # a correct call that ran nothing on the device: no profiler there
    _measure(_ctx(False), _Channel([]), nothing, sizes)
    assert nothing.custom_share is None and "saw no kernel" in nothing.flags[0]


def test_a_profiling_failure_leaves_the_share_unknown_which_the_policy_refuses():
    failed = Stop(Verdict(Status.RUNTIME_ERROR, "kernels at batch=4: CUPTI unavailable"))
    result = _result()
    _measure(_ctx(False), _Channel(stop=failed), result, [{"batch": 4, "dim": 8}])
    assert result.custom_share is None and "CUPTI unavailable" in result.flags[0]
    with pytest.raises(Stop) as stop:
        _measure(_ctx(True), _Channel(stop=failed), _result(), [{"batch": 4, "dim": 8}])
    assert stop.value.verdict.status is Status.FLAGGED
    # It ran after every case and the timing passed: even a process that died here (a
    # profiler crash, say) leaves the verdict alone.
    crashed = Stop(Verdict(Status.CRASHED, "kernels at batch=4: killed by SIGSEGV"))
    result = _result()
    _measure(_ctx(False), _Channel(stop=crashed), result, [{"batch": 4, "dim": 8}])
    assert result.status is Status.OK and "SIGSEGV" in result.flags[0]


def test_the_policy_needs_a_gpu(tmp_path):
    with pytest.raises(OptionsError, match="--require-custom-kernels"):
        Options(device="cpu", out_dir=tmp_path, cache_dir=tmp_path, jobs=1, seed=1,
                require_custom_kernels=True)
