"""How a problem's inputs, init inputs and models are made for one case: pure, imported by both
sides of the boundary (torch and the standard library only).

A KernelBench problem file reads its sizes from module-level integers (``batch_size = 16``)
in ``get_inputs`` and ``get_init_inputs``. A case re-binds them, recomputes the module-level
values derived from them (``input_shape = (num_classes,)``), and calls both under the case's
seed. A task module of kbench's own (``make_inputs``) draws inputs itself.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.machinery
import importlib.util
import sys
import types
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

# The value distribution that means "the problem's own get_inputs".
PROBLEM = "problem"

_FLOATING = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
             "float64": torch.float64}


class _FromSource(importlib.machinery.SourceFileLoader):
    """Compiles the file's text every time: never a cached .pyc beside it, which a submission
    could have planted to change a reference, or another submission, behind a source file
    that still reads (and hashes) the same."""

    def get_code(self, fullname: str) -> types.CodeType:
        return compile(self.get_data(self.path), self.path, "exec", dont_inherit=True)


def load_file(path: str | Path, name: str, names: dict[str, Any] | None = None) -> ModuleType:
    """Import a Python file as module ``name`` (registered in sys.modules, so that pickling
    and dataclasses inside it work), from its source; ``names``: another module's
    namespace whose public names the file starts with (its own definitions win)."""
    spec = importlib.util.spec_from_file_location(name, str(path),
                                                  loader=_FromSource(name, str(path)))
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update({k: v for k, v in (names or {}).items() if not k.startswith("__")})
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


class _Layout:
    """A problem module's top-level assignments in source order: which names are sizes
    (integers that get_inputs or get_init_inputs read, directly or through other top-level
    values) and which values are derived from them."""

    def __init__(self, module: ModuleType) -> None:
        self.assigned: list[tuple[str, ast.expr]] = []
        try:
            tree = ast.parse(Path(module.__file__).read_text())
        except (OSError, SyntaxError, TypeError, ValueError):
            tree = ast.Module(body=[], type_ignores=[])
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                else node.target if isinstance(node, ast.AnnAssign) and node.value else None
            if isinstance(target, ast.Name):
                self.assigned.append((target.id, node.value))
        deps = {name: {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
                for name, expr in self.assigned}
        read: set[str] = set()
        for fn in ("get_inputs", "get_init_inputs"):
            code = getattr(getattr(module, fn, None), "__code__", None)
            if code is not None:
                read |= _globals_read(code)
        closure, todo = set(), list(read)
        while todo:
            name = todo.pop()
            if name not in closure:
                closure.add(name)
                todo += deps.get(name, ())
        self.sizes: list[str] = []
        for name, _ in self.assigned:
            if name not in closure:
                continue
            value = getattr(module, name, None)
            if type(value) is int:
                self.sizes.append(name)
            elif type(value) in (list, tuple) and value and not deps[name] \
                    and all(type(v) is int for v in value):
                # a list of widths (``layer_sizes = [400, 800]``): each element is a size
                self.sizes += [f"{name}[{i}]" for i in range(len(value))]
        self.sizes = list(dict.fromkeys(self.sizes))
        self.deps = deps


def _split(size: str) -> tuple[str, int | None]:
    """``layers[2]`` -> ("layers", 2); ``batch_size`` -> ("batch_size", None)."""
    if size.endswith("]") and "[" in size:
        base, index = size[:-1].split("[", 1)
        return base, int(index)
    return size, None


def _get(module: ModuleType, size: str) -> int:
    base, index = _split(size)
    value = getattr(module, base)
    return value if index is None else value[index]


def _set(module: ModuleType, size: str, value: int) -> str:
    """Set one size; returns the module-level name that changed. A list is replaced, never
    changed in place: a model built earlier may hold the old one."""
    base, index = _split(size)
    if index is not None:
        items = list(getattr(module, base))
        items[index] = value
        value = type(getattr(module, base))(items)
    setattr(module, base, value)
    return base


def _globals_read(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:  # comprehensions and lambdas are code objects of their own
        if isinstance(const, types.CodeType):
            names |= _globals_read(const)
    return names


# By the module itself, held weakly: keyed by id(), a problem loaded after another's module was
# freed could get that module's id, and its sizes (a size the file does not define, at load).
_layouts: weakref.WeakKeyDictionary[ModuleType, _Layout] = weakref.WeakKeyDictionary()


def _layout(module: ModuleType) -> _Layout:
    layout = _layouts.get(module)
    if layout is None:
        layout = _layouts[module] = _Layout(module)
    return layout


def size_names(module: ModuleType) -> list[str]:
    """The module's sizes, in source order: module-level integers read by get_inputs or
    get_init_inputs (directly or through other module-level values), and the elements of
    such a list of integer literals, named ``layers[0]``."""
    return list(_layout(module).sizes)


def bind(module: ModuleType, params: dict[str, int]) -> None:
    """Set the module's sizes to ``params`` and recompute, in source order, every module-level
    value derived from a size (a derived value that cannot be recomputed keeps its own)."""
    layout = _layout(module)
    changed = set()
    for name, value in params.items():
        if name in layout.sizes and _get(module, name) != value:
            changed.add(_set(module, name, value))
    given = {_split(name)[0] for name in params}
    for name, expr in layout.assigned:
        if name in given or not (layout.deps.get(name, set()) & changed):
            continue
        try:
            value = eval(compile(ast.Expression(expr), module.__file__, "eval"), vars(module))
        except Exception:  # a value that is not an expression of sizes: leave it
            continue
        setattr(module, name, value)
        changed.add(name)


def mirror(module: ModuleType, params: dict[str, int]) -> None:
    """Bind a submission's copies of the problem's sizes: one that reads its own module-level
    ``batch_size`` as the reference reads the problem's (``torch.randn(batch_size, h)`` in
    ``__init__``) sees the case's value, not the file's. Sizes it does not define are left."""
    bind(module, params)
    own = set(size_names(module))
    for name, value in params.items():
        try:
            current = _get(module, name)
        except (AttributeError, IndexError, TypeError):  # not defined there, or not a list
            continue
        if name not in own and type(current) is int:
            _set(module, name, value)


def own_sizes(module: ModuleType) -> dict[str, int]:
    """The sizes as the file sets them (read before any ``bind``)."""
    return {name: _get(module, name) for name in size_names(module)}


def draw(module: ModuleType, params: dict[str, int], dtype: str, distribution: str, seed: int,
         device: str | torch.device = "cpu") -> list:
    """One case's inputs: the task module's ``make_inputs`` for a named distribution, or, for
    PROBLEM, the problem's own ``get_inputs`` at these sizes under ``seed``, made on
    ``device``, with floating-point tensors in ``dtype`` (integer, bool and Python values as
    they are)."""
    if distribution != PROBLEM:
        return list(module.make_inputs(params, dtype, distribution, seed, device))
    bind(module, params)
    with seeded(seed, device), torch.device(device):
        made = module.get_inputs()
    return [_placed(value, dtype, device) for value in made]


@contextlib.contextmanager
def seeded(seed: int, device: str | torch.device = "cpu") -> Iterator[None]:
    """Random draws under ``seed``, with the random state around them left as it was: what a
    model's forward draws (dropout) does not depend on the last input or model made."""
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _placed(value: Any, dtype: str, device: str | torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            value = value.to(_FLOATING[dtype])
        return value.to(device)
    return value


def init_inputs(module: ModuleType, params: dict[str, int], seed: int) -> list:
    """The problem's ``get_init_inputs`` at these sizes, under ``seed``."""
    bind(module, params)
    with seeded(seed):
        return list(module.get_init_inputs())


def build(cls: type, init_args: list, seed: int, device: str | torch.device, dtype: str,
          eval_mode: bool) -> torch.nn.Module:
    """``cls(*init_args)`` under ``seed`` (so that a model that creates the same parameters in
    the same order gets the same values, as KernelBench does), on ``device``, its floating
    parameters and buffers in ``dtype``; in training mode unless ``eval_mode``."""
    with seeded(seed, device):
        model = cls(*init_args)
    model = model.to(device=device, dtype=_FLOATING[dtype])
    return model.eval() if eval_mode else model


def promoted(args: list, dtype: str = "float64") -> list:
    """Inputs for the exact reference: floating tensors in ``dtype`` (float64 unless an op of
    the reference has none), the rest untouched."""
    return [a.to(_FLOATING[dtype]) if isinstance(a, torch.Tensor) and a.is_floating_point()
            else a for a in args]
