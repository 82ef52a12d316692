"""L2 normalisation along dim 1: the reference for tasks/l2norm.yaml (KernelBench format).

``Model``, ``get_inputs`` and ``get_init_inputs`` follow KernelBench's problem layout.
``make_inputs`` is what kbench uses instead of ``get_inputs``: inputs of any sizes (the task's
parameters, batch and dim), dtype and value distribution, reproducible from a seed;
``min_bytes`` is the traffic one call must move at least.

Semantics: y = x / ||x||_2 per row; a row whose norm is exactly zero gives zeros. KernelBench's
level-1 problem 39 divides by the norm unguarded and returns NaN for such rows. Rows with
non-zero norms below the dtype's smallest normal number are outside the task: never drawn.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
dim = 16384


class Model(nn.Module):
    """Normalises each row of a (batch, dim) tensor to unit L2 norm; zero rows stay zero."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Norms clamped at the dtype's smallest normal number: zero rows become 0 / tiny = 0, and
        # no row kbench draws comes near it. Three kernels (norm, clamp, divide), one more than
        # KernelBench's unguarded x / norm and on (batch, 1) only, so at launch-bound sizes the
        # reference is not slowed by guard ops a fused kernel would not pay for.
        return F.normalize(x, p=2.0, dim=1, eps=torch.finfo(x.dtype).tiny)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim)]


def get_init_inputs() -> list:
    return []


DISTRIBUTIONS = ("normal", "uniform", "row_scaled", "zero_rows", "tiny", "large")

# log10 of the row norms drawn for "tiny" and "large", per dtype. Every non-zero row's norm stays
# at least 1e6 times above the 1e-12 guards kernels commonly use, and its squares stay inside
# float32's range, so float32 accumulation is right and the zero-row rule is never ambiguous.
# float16 inputs also keep every element below 65504; their squares overflow float16, which
# catches kernels that do not accumulate in float32.
_NORM_RANGE_LOG10 = {
    "float32": {"tiny": (-6.0, -3.0), "large": (10.0, 15.0)},
    "bfloat16": {"tiny": (-6.0, -3.0), "large": (10.0, 15.0)},
    "float64": {"tiny": (-6.0, -3.0), "large": (10.0, 15.0)},
    "float16": {"tiny": (-2.0, -1.0), "large": (2.0, 4.0)},
}
_MIN_ROW_NORM = {"float32": 1e-6, "bfloat16": 1e-6, "float64": 1e-6, "float16": 1e-2}


def min_bytes(params: dict[str, int], dtype: str) -> int:
    """One read of x and one write of y."""
    return 2 * params["batch"] * params["dim"] * torch.empty(0, dtype=getattr(torch, dtype)
                                                              ).element_size()


def make_inputs(params: dict[str, int] | tuple[int, int], dtype: str, distribution: str,
                seed: int, device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """Inputs for one case (its parameters by name, or a (batch, dim) shape): a tensor of
    ``dtype`` drawn from ``distribution``.

    normal / uniform: N(0, 1) and U(-1, 1) values; row_scaled: normal rows times factors
    log-uniform over 1e-3..1e3; zero_rows: normal with about a quarter of the rows (at least
    one) exactly zero; tiny / large: normal directions with row norms at the dtype's extremes.
    """
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r}; known: {DISTRIBUTIONS}")
    batch, width = (params["batch"], params["dim"]) if isinstance(params, dict) else params
    gen = torch.Generator(device=device).manual_seed(seed)

    def uniform(*size: int) -> torch.Tensor:
        return torch.rand(*size, generator=gen, device=device)

    if distribution == "uniform":
        x = uniform(batch, width).mul_(2).sub_(1)
    else:
        x = torch.randn(batch, width, generator=gen, device=device)

    if distribution == "row_scaled":
        x.mul_(10.0 ** (uniform(batch, 1) * 6 - 3))
    elif distribution in ("tiny", "large"):
        lo, hi = _NORM_RANGE_LOG10[dtype][distribution]
        norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        x.div_(norms).mul_(10.0 ** (lo + uniform(batch, 1) * (hi - lo)))
    # Lift any row that came out too small (rows of dim 1 can land near zero by chance).
    norms = torch.linalg.vector_norm(x, dim=1)
    small = norms < _MIN_ROW_NORM[dtype]
    if bool(small.any()):
        x[small] *= (_MIN_ROW_NORM[dtype] / norms[small]).unsqueeze(1)

    if distribution == "zero_rows":
        zero = uniform(batch) < 0.25
        zero[int(torch.randint(batch, (1,), generator=gen, device=device))] = True
        x[zero] = 0.0
    return [x.to(getattr(torch, dtype))]
