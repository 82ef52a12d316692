"""Dense peak FLOP/s of known GPUs, from NVIDIA's data sheets (no sparsity): the compute roof
beside the copy bandwidth each run measures. float32 is the CUDA cores' rate, what PyTorch's
float32 matmul uses unless TF32 is allowed; float16 and bfloat16 the tensor cores'."""

from __future__ import annotations

# Name fragments as torch.cuda.get_device_name reports them, most specific first.
_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"float32": 51.2, "float16": 756.0, "bfloat16": 756.0}),
    ("H100", {"float32": 66.9, "float16": 989.4, "bfloat16": 989.4}),
    ("H200", {"float32": 66.9, "float16": 989.4, "bfloat16": 989.4}),
    ("A100", {"float32": 19.5, "float16": 312.0, "bfloat16": 312.0}),
)


def peak_tflops(device_name: str, dtype: str) -> float | None:
    """The device's dense peak in TFLOP/s for ``dtype``; None for a device not listed."""
    for fragment, peaks in _TFLOPS:
        if fragment in device_name:
            return peaks.get(dtype)
    return None
