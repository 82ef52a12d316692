"""Trying a problem's reference at some sizes without running it: on the meta device, where
tensors have shapes and dtypes but no data, a shape error still raises and FLOPs are counted
from shapes alone."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from types import ModuleType

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from kbench.results.run_record import error_line
from kbench.shared import inputs
from kbench.shared.outputs import Unsupported, flatten, tensors

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float64": torch.float64}


@dataclass(frozen=True)
class Work:
    """What one call of the reference does at some sizes: matrix-unit FLOPs as
    torch.utils.flop_counter counts them (0 for element-wise work), the bytes it holds
    (inputs, parameters and buffers, and its outputs, each once) and the fewest it must move
    (``moved``: see _Traced)."""

    flops: int
    bytes: int
    input_bytes: int
    output_bytes: int
    # The most bytes alive at once during the call: inputs, parameters and buffers, and the
    # op outputs not yet freed (each storage once). Tensors inside an op's own kernel, and
    # library workspaces, are not seen: kbench.grading.checking.screen leaves room for them.
    peak_bytes: int = 0
    moved: int = 0


class TrialError(Exception):
    """The reference does not run at these sizes (the message says why)."""


def _nbytes(values: list) -> int:
    return sum(t.numel() * t.element_size() for t in values if isinstance(t, torch.Tensor))


# Ops that may read only part of their first argument (a table looked up, an input gathered,
# indexed or masked): what they return bounds what they must read of it. An embedding over a
# 32000-row table for 8192 ids reads at most those rows; counting the whole table, kbench's
# bandwidth bound once accused an honest index_select on a CPU.
_PARTIAL_READS = {"aten::embedding", "aten::embedding_bag", "aten::_embedding_bag",
                  "aten::_embedding_bag_forward_only", "aten::index_select", "aten::gather",
                  "aten::take", "aten::take_along_dim", "aten::index", "aten::_unsafe_index",
                  "aten::masked_select"}


class _Traced(TorchDispatchMode):
    """Two things about one call, op by op. The most bytes the ops' outputs hold at once:
    each new storage counted when an op returns it, and again free once no tensor on it is
    left (what a caching allocator would reuse); storages in ``held`` (the inputs, parameters
    and buffers) are not counted. And the fewest bytes of ``held`` the call must read: of each
    storage, the most any op reads of it: a whole argument for most ops (the elements its
    view covers), what the op returns for those that may read in part (_PARTIAL_READS), none
    for ops that only make views; a storage no op reads counts nothing."""

    def __init__(self, held: list) -> None:
        super().__init__()
        self.held = {key: _nbytes([t]) for t in held if (key := _storage(t)) is not None}
        self.live = self.peak = 0
        self.tensors: dict[int, list[int]] = {}  # storage -> [tensors alive on it, its bytes]
        self.read: dict[int, int] = {}  # held storage -> the most bytes one op reads of it

    @property
    def read_bytes(self) -> int:
        return sum(min(n, self.held[key]) for key, n in self.read.items())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False):
            partial = func._schema.name in _PARTIAL_READS
            for position, arg in enumerate(tree_leaves((args, kwargs or {}))):
                key = _storage(arg)
                if key is not None and key in self.held:
                    seen = _nbytes(tree_leaves(out)) if partial and position == 0 else \
                        _covered(arg)
                    self.read[key] = max(self.read.get(key, 0), seen)
        for leaf in tree_leaves(out):
            key = _storage(leaf)
            if key is not None and key not in self.held:
                self._made(leaf, key)
        return out

    def _made(self, tensor: torch.Tensor, key: int) -> None:
        if key not in self.tensors:
            self.tensors[key] = [0, tensor.untyped_storage().nbytes()]
            self.live += self.tensors[key][1]
            self.peak = max(self.peak, self.live)
        self.tensors[key][0] += 1
        weakref.finalize(tensor, self._freed, key)

    def _freed(self, key: int) -> None:
        entry = self.tensors[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.tensors[key]


def _covered(tensor: torch.Tensor) -> int:
    """The bytes of the distinct elements a view covers (a dimension broadcast with stride 0
    covers one)."""
    count = 1
    for size, stride in zip(tensor.shape, tensor.stride(), strict=True):
        count *= size if stride else min(size, 1)
    return count * tensor.element_size()


def _storage(value: object) -> int | None:
    """Which storage a tensor's bytes are in; None for other values and for tensors without
    one (sparse, nested)."""
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return value.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def on_meta(module: ModuleType, params: dict[str, int], dtype: str = "float32",
            eval_mode: bool = False) -> Work:
    """Build the problem's Model and inputs at ``params`` on the meta device and call it once;
    TrialError if any step raises (a shape that does not fit, or an op the meta device
    cannot run: Exception.args says which)."""
    try:
        init = inputs.init_inputs(module, params, 0)
        with torch.device("meta"):
            model = module.Model(*init)
            model = model.to(dtype=_DTYPES[dtype])
            if eval_mode:
                model.eval()
            args = inputs.draw(module, params, dtype, inputs.PROBLEM, 0, "meta")
            state = [t for t in model.state_dict().values() if isinstance(t, torch.Tensor)]
            with torch.no_grad(), FlopCounterMode(display=False) as counter, \
                    _Traced([*tree_leaves(args), *state]) as traced:
                out = model(*args)
        leaves, _ = flatten(out, meta=True)
    except Unsupported as exc:
        raise TrialError(f"returns {exc}") from None
    except Exception as exc:  # the reference's own failure, whatever it is
        raise TrialError(error_line(exc)) from None
    ins, outs = _nbytes(args), _nbytes(tensors(leaves))
    return Work(flops=int(counter.get_total_flops()), bytes=ins + _nbytes(state) + outs,
                input_bytes=ins, output_bytes=outs,
                peak_bytes=ins + _nbytes(state) + traced.peak,
                moved=traced.read_bytes + outs)
