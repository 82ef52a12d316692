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
    """A value that is neither a tensor, a Python number nor a tuple or list of them."""


def flatten(value: Any) -> tuple[list[Any], str]:
    """The leaves of ``value`` in order and its structure; Unsupported for anything else (an
    exact type check: a tensor subclass is not a tensor)."""
    leaves: list[Any] = []
    structure = _walk(value, leaves)
    return leaves, structure


def _walk(value: Any, leaves: list[Any]) -> str:
    kind = type(value)
    if kind is torch.Tensor:
        leaves.append(value)
        return "tensor"
    if kind in _NUMBERS:
        leaves.append(value)
        return kind.__name__
    if kind in (tuple, list):
        return f"{kind.__name__}({', '.join(_walk(v, leaves) for v in value)})"
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
