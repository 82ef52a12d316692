"""What a call returned, as leaves and a structure: pure, imported by both sides.

A model may return a tensor, a tuple or list of them (nested too), or a Python number. The
leaves (tensors and numbers) cross the boundary one by one; the structure is a short text
(``tensor``, ``tuple(tensor, tensor)``, ``float``) that both sides compare first.
"""

from __future__ import annotations

from typing import Any

import torch

_NUMBERS = (bool, int, float)


class Unsupported(TypeError):
    """A value that is neither a dense tensor, a Python number nor a tuple or list of them;
    its message names what it is."""


def flatten(value: Any, meta: bool = False) -> tuple[list[Any], str]:
    """The leaves of ``value`` in order and its structure; Unsupported for anything else (an
    exact type check: a tensor subclass is not a tensor). ``meta``: tensors on the meta
    device count (kbench.problems.trial runs the reference there)."""
    leaves: list[Any] = []
    structure = _walk(value, leaves, meta)
    return leaves, structure


def _walk(value: Any, leaves: list[Any], meta: bool) -> str:
    kind = type(value)
    if kind is torch.Tensor:
        if value.layout is not torch.strided or value.is_nested or value.is_meta and not meta:
            kind_of = "nested" if value.is_nested else "meta" if value.is_meta else \
                str(value.layout).removeprefix("torch.").lstrip("_")
            raise Unsupported(f"a {kind_of} tensor")
        leaves.append(value)
        return "tensor"
    if kind in _NUMBERS:
        leaves.append(value)
        return kind.__name__
    if kind in (tuple, list):
        return f"{kind.__name__}({', '.join(_walk(v, leaves, meta) for v in value)})"
    raise Unsupported(f"{kind.__module__}.{kind.__qualname__}")


def describe(value: Any) -> str:
    """A value's structure, or its type's name where it has none."""
    try:
        return flatten(value)[1]
    except Unsupported as exc:
        return str(exc)


def tensors(leaves: list[Any]) -> list[torch.Tensor]:
    return [leaf for leaf in leaves if type(leaf) is torch.Tensor]


def as_tensor(leaf: Any) -> torch.Tensor:
    """A leaf as a tensor: a Python number becomes a 0-d tensor of its natural dtype."""
    if type(leaf) is torch.Tensor:
        return leaf
    return torch.tensor(leaf, dtype=torch.float64 if type(leaf) is float else None)


def own_copy(leaf: Any) -> Any:
    """A plain tensor cloned (storage of its own, which no other process can write), anything
    else as it is."""
    return leaf.clone() if type(leaf) is torch.Tensor else leaf
