"""A task from a KernelBench problem file as it is: sensible defaults for everything a task
YAML says, with a YAML (if any) merged over them.

Defaults: float32; tolerance rtol = atol = 1e-4 (KernelBench's for float32; atol relative to
the output's rms) and 1e-2 for 16-bit types; the problem's own sizes as one case and the
benchmark, plus random cases over the sizes kbench.problems.sizes proposes (shrunk on a CPU);
values from the problem's own get_inputs; training mode, as constructed.
"""

from __future__ import annotations

import copy
import inspect
import math
from pathlib import Path
from typing import Any

from kbench.problems import sizes
from kbench.problems.task import Correctness, Task, TaskError, digest
from kbench.problems.task_yaml import _Reader, build
from kbench.results.run_record import error_line
from kbench.shared import inputs

RANDOM_CASES = 8
RANDOM_CASES_HEAVY = 2  # on a CPU, for a problem still over the CPU bound shrunk

_DEFAULTS: dict[str, Any] = {
    "dtypes": ["float32"],
    "tolerance": {"float32": {"rtol": 1e-4, "atol": 1e-4},
                  "float16": {"rtol": 1e-2, "atol": 1e-2},
                  "bfloat16": {"rtol": 1e-2, "atol": 1e-2},
                  "float64": {"rtol": 1e-7, "atol": 1e-7}},
    "timing": {"warmup_ms": {"cpu": 50, "cuda": 100}, "min_samples": 10, "max_samples": 1000,
               "target_ci": 0.005, "budget_ms": {"cpu": 2000, "cuda": 3000},
               "compile_reference": {"cpu": False, "cuda": True},
               "fresh_rounds_below_ms": {"cpu": 0, "cuda": 0.1}},
    "limits": {"build_s": 900, "load_s": 300, "case_s": 300, "benchmark_s": 600,
               "host_memory_gib": 32, "log_mib": 16},
}


def from_problem(file: Path, raw: dict | None = None, yaml_path: Path | None = None) -> Task:
    """The task for a problem file; ``raw`` is a YAML's mapping (at ``yaml_path``) that
    overrides the defaults section by section."""
    raw = dict(raw or {})
    where = yaml_path or file
    r = _Reader(where)
    try:
        module = inputs.load_file(file, f"kbench_problem_{abs(hash(str(file.resolve())))}")
    except BaseException as exc:  # the problem's own import failed, whatever it raised
        raise TaskError(f"{file}: cannot import it: {error_line(exc)}") from None
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not callable(getattr(module, attr, None)):
            raise TaskError(f"{file}: expected a KernelBench problem defining {attr}")
    mode = r.choice(raw.get("mode", "train"), "mode", ("train", "eval"))
    overrides = _size_overrides(r, raw.get("sizes", {}), inputs.size_names(module))
    plan = sizes.plan(module, overrides, mode == "eval")
    names = list(plan.own)
    merged = copy.deepcopy(_DEFAULTS)
    merged.update(
        name=raw.get("name", file.stem), reference=str(file.resolve()),
        semantics=_semantics(module, file), parameters=names,
        correctness=_correctness(plan, "cuda", names),
        benchmarks={"dtype": "float32", "cuda": [list(plan.own.values())],
                    "cpu": [list(plan.cpu_own.values())]})
    merged["benchmarks"]["dtype"] = (raw.get("dtypes") or ["float32"])[0]
    for key, value in raw.items():
        if key in ("sizes", "reference"):
            continue
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key != "tolerance":
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    files = [file] + ([yaml_path] if yaml_path else [])
    cpu = None if "correctness" in raw else _spec(_correctness(plan, "cpu", names), names,
                                                  RANDOM_CASES_HEAVY if plan.cpu_heavy else None)
    return build(merged, where, module, str(file.resolve()), (inputs.PROBLEM,),
                 digest(*files), smallest_size=-math.inf, default_tolerance="tolerance" not in raw,
                 cpu_correctness=cpu, checked_sizes=plan.checked, notes=tuple(plan.notes))


def _correctness(plan: sizes.SizePlan, device: str, names: list[str]) -> dict:
    own, ranges = plan.for_device(device)
    return {"distributions": [inputs.PROBLEM], "fixed_shapes": [[own[n] for n in names]],
            "random_cases": RANDOM_CASES if ranges else 0,
            "random_shape": [[ranges[n].lo, ranges[n].hi] if n in ranges else [own[n], own[n]]
                             for n in names],
            "steps": [ranges[n].step if n in ranges else 1 for n in names],
            "max_elements": 1 << 62}


def _spec(data: dict, names: list[str], random_cases: int | None) -> Correctness:
    """``_correctness``'s mapping as the typed value (its fixed shape by name)."""
    return Correctness(
        distributions=tuple(data["distributions"]),
        fixed_shapes=tuple(dict(zip(names, s, strict=True)) for s in data["fixed_shapes"]),
        random_cases=data["random_cases"] if random_cases is None else min(
            random_cases, data["random_cases"]),
        random_shape=tuple(tuple(pair) for pair in data["random_shape"]),
        max_elements=data["max_elements"], steps=tuple(data["steps"]))


def _size_overrides(r: Any, raw: Any, known: list[str]) -> dict[str, sizes.Range | int]:
    """``sizes:`` in a YAML: NAME: VALUE (fixed) or NAME: [LO, HI] (varies)."""
    if not isinstance(raw, dict):
        raise r.fail("sizes", "a mapping of size names to a value or [lo, hi]", raw)
    out: dict[str, sizes.Range | int] = {}
    for name, value in raw.items():
        key = f"sizes.{name}"
        if name not in known:
            raise r.fail(key, f"one of the problem's sizes {known}", name)
        if isinstance(value, list):
            if len(value) != 2:
                raise r.fail(key, "[lo, hi]", value)
            lo = r.number(value[0], f"{key}[0]", 1, integer=True)
            out[name] = sizes.Range(lo, r.number(value[1], f"{key}[1]", lo, integer=True))
        else:
            out[name] = r.number(value, key, -math.inf, integer=True)
    return out


def _semantics(module: Any, file: Path) -> str:
    """What the problem computes, in its author's words: Model's own docstring, else the
    file's, else its first comment; else nothing (inspect.getdoc would fall back to
    nn.Module's: "Base class for all neural network modules.")."""
    doc = vars(module.Model).get("__doc__") or module.__doc__ or _first_comment(file)
    return inspect.cleandoc(doc).split("\n\n")[0].strip() if doc else ""


def _first_comment(file: Path) -> str:
    """The file's first block of ``#`` comments (a shebang and coding line left out)."""
    lines: list[str] = []
    try:
        text = file.read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#!") or stripped.startswith("# -*-"):
            continue
        if stripped.startswith("#"):
            lines.append(stripped.lstrip("#").strip())
        elif lines or stripped:
            break
    return "\n".join(lines)
