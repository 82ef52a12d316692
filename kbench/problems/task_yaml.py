"""Task YAML files: read, merge over a problem file's defaults, validate, and build a Task.

A YAML naming a module of kbench's own (``make_inputs``, ``DISTRIBUTIONS``) must say
everything; one naming a KernelBench problem file says only what differs from the defaults
(kbench.problems.defaults): tolerances, sizes, dtypes, mode, benchmarks, timing, limits.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

from kbench.problems.task import (
    DEVICES,
    DTYPES,
    Correctness,
    Limits,
    Params,
    Task,
    TaskError,
    Timing,
    Tolerance,
    digest,
)

_TOP = {"name", "reference", "semantics", "parameters", "dtypes", "tolerance", "correctness",
        "benchmarks", "timing", "limits", "mode", "sizes"}
_MODULE_REQUIRED = {"name", "reference", "semantics", "parameters", "dtypes", "tolerance",
                    "correctness", "benchmarks", "timing", "limits"}


def _semantics(r: _Reader, value: Any, reference: str) -> str:
    """What the task computes: a YAML over a module must say; a problem file (alone or under a
    YAML) may say nothing, where neither its Model nor the file has a docstring or a leading
    comment."""
    if reference.endswith(".py") and value == "":
        return value
    return r.text(value, "semantics")


class _Reader:
    """Walks the parsed YAML and raises TaskError naming file and dotted key."""

    def __init__(self, path: Path, smallest_size: float = 1) -> None:
        self.path = path
        # -inf for a problem file's sizes: any module-level integer (padding = 0,
        # hardtanh_min = -1) that get_inputs or get_init_inputs reads
        self.smallest_size = smallest_size

    def fail(self, key: str, expected: str, got: Any = None) -> TaskError:
        got_text = "" if got is None else f", got {got!r}"
        return TaskError(f"{self.path}: {key}: expected {expected}{got_text}")

    def mapping(self, value: Any, key: str, allowed: set[str], required: set[str]) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key or "top level", "a mapping", value)
        for k in value:
            if k not in allowed:
                where = f"{key}.{k}" if key else str(k)
                raise self.fail(where, f"one of the keys {sorted(allowed)} (unknown key)")
        for k in sorted(required - value.keys()):
            raise self.fail(f"{key}.{k}" if key else k, "this key (it is required)")
        return value

    def number(self, value: Any, key: str, minimum: float = 0.0, integer: bool = False) -> Any:
        kind = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or value < minimum:
            what = "an integer" if integer else "a number"
            raise self.fail(key, f"{what} >= {minimum:g}", value)
        return value

    def flag(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return value

    def text(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, "a non-empty string", value)
        return value

    def choice(self, value: Any, key: str, allowed: tuple[str, ...]) -> str:
        if value not in allowed:
            raise self.fail(key, f"one of {list(allowed)}", value)
        return value

    def params(self, value: Any, key: str, names: tuple[str, ...]) -> Params:
        """A case's sizes: a list in ``names`` order, or a mapping by name."""
        if isinstance(value, dict):
            self.mapping(value, key, set(names), set(names))
            return {n: self.number(value[n], f"{key}.{n}", self.smallest_size, integer=True)
                    for n in names}
        if not isinstance(value, list) or (names and not value):
            raise self.fail(key, "a shape: a non-empty list of positive integers", value)
        if len(value) != len(names):
            raise self.fail(key, f"{len(names)} dimensions ({', '.join(names)})", value)
        return {n: self.number(d, f"{key}[{i}]", self.smallest_size, integer=True)
                for i, (n, d) in enumerate(zip(names, value, strict=True))}

    def cases(self, value: Any, key: str, names: tuple[str, ...]) -> tuple[Params, ...]:
        if not isinstance(value, list) or not value:
            raise self.fail(key, "a non-empty list of shapes", value)
        return tuple(self.params(s, f"{key}[{i}]", names) for i, s in enumerate(value))

    def per_device(self, value: Any, key: str, read) -> dict:
        """A value given once for every device, or as {cpu: ..., cuda: ...}."""
        if isinstance(value, dict) and set(value) <= set(DEVICES):
            self.mapping(value, key, set(DEVICES), set(DEVICES))
            return {d: read(value[d], f"{key}.{d}") for d in DEVICES}
        return {d: read(value, key) for d in DEVICES}


def read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TaskError(f"{path}: not valid YAML: {exc}") from None
    except OSError as exc:
        raise TaskError(f"{path}: cannot read it ({exc.strerror})") from None


def problem_file(path: Path, raw: dict) -> Path | None:
    """The problem file a YAML's ``reference`` names (kbench.problems.defaults merges the
    YAML over it), or None for a reference module."""
    r = _Reader(path)
    r.mapping(raw, "", _TOP, {"reference"})
    reference = r.text(raw["reference"], "reference")
    if not reference.endswith(".py"):
        return None
    file = (path.parent / reference).resolve()
    if not file.is_file():
        raise r.fail("reference", "a Python file that exists", reference)
    return file


def parse(path: Path, raw: dict) -> Task:
    """A Task from a YAML file (read as ``raw``) whose reference is a module."""
    r = _Reader(path)
    reference = r.text(raw["reference"], "reference")
    r.mapping(raw, "", _TOP - {"mode", "sizes"}, _MODULE_REQUIRED)
    try:
        module = importlib.import_module(reference)
    except ImportError as exc:
        raise r.fail("reference", "an importable module", f"{reference} ({exc})") from None
    for attr in ("Model", "get_inputs", "get_init_inputs", "make_inputs", "DISTRIBUTIONS"):
        if not hasattr(module, attr):
            raise r.fail("reference", f"a module defining {attr}", reference)
    name = r.text(raw["name"], "name")
    if name != path.stem:
        raise r.fail("name", f"the file's name {path.stem!r}", name)
    return build(raw, path, module, reference, tuple(module.DISTRIBUTIONS),
                 digest(path, Path(module.__file__)))


def build(raw: dict, path: Path, module: Any, reference: str, known: tuple[str, ...],
          task_digest: str, smallest_size: float = 1, **extra: Any) -> Task:
    """Validate a complete task mapping (YAML, or defaults with a YAML merged over them);
    ``smallest_size``: what a size may be at least."""
    r = _Reader(path, smallest_size)
    names_raw = raw["parameters"]
    if not isinstance(names_raw, list) or len(set(map(str, names_raw))) != len(names_raw):
        raise r.fail("parameters", "a list of distinct names", names_raw)
    parameters = tuple(r.text(n, f"parameters[{i}]") for i, n in enumerate(names_raw))

    dtypes_raw = raw["dtypes"]
    if not isinstance(dtypes_raw, list) or not dtypes_raw:
        raise r.fail("dtypes", f"a non-empty list drawn from {list(DTYPES)}", dtypes_raw)
    dtypes = tuple(r.choice(d, f"dtypes[{i}]", DTYPES) for i, d in enumerate(dtypes_raw))

    tol_raw = r.mapping(raw["tolerance"], "tolerance", set(DTYPES), set(dtypes))
    tolerance = {}
    for dtype, entry in tol_raw.items():
        key = f"tolerance.{dtype}"
        r.mapping(entry, key, {"rtol", "atol"}, {"rtol", "atol"})
        tolerance[dtype] = Tolerance(rtol=float(r.number(entry["rtol"], f"{key}.rtol")),
                                     atol=float(r.number(entry["atol"], f"{key}.atol")))

    correctness = _correctness(r, raw["correctness"], known, parameters)

    bench_keys = {"dtype", "cpu", "cuda"}
    bench = r.mapping(raw["benchmarks"], "benchmarks", bench_keys, bench_keys)
    benchmark_dtype = r.choice(bench["dtype"], "benchmarks.dtype", dtypes)
    benchmarks = {d: r.cases(bench[d], f"benchmarks.{d}", parameters) for d in DEVICES}

    timing_keys = {"warmup_ms", "min_samples", "max_samples", "budget_ms", "target_ci",
                   "compile_reference", "fresh_rounds_below_ms"}
    t = r.mapping(raw["timing"], "timing", timing_keys, timing_keys - {"fresh_rounds_below_ms"})
    min_samples = r.number(t["min_samples"], "timing.min_samples", 1, integer=True)
    max_samples = r.number(t["max_samples"], "timing.max_samples", min_samples, integer=True)
    warmup = r.per_device(t["warmup_ms"], "timing.warmup_ms", r.number)
    budget = r.per_device(t["budget_ms"], "timing.budget_ms", r.number)
    target = float(r.number(t["target_ci"], "timing.target_ci", 0.0001))
    compile_ref = r.per_device(t["compile_reference"], "timing.compile_reference", r.flag)
    fresh = r.per_device(t.get("fresh_rounds_below_ms", 0), "timing.fresh_rounds_below_ms",
                         r.number)
    timing = {d: Timing(float(warmup[d]), min_samples, max_samples, float(budget[d]), target,
                        compile_ref[d], float(fresh[d])) for d in DEVICES}

    limit_keys = {"build_s", "load_s", "case_s", "benchmark_s", "host_memory_gib", "log_mib"}
    lim = r.mapping(raw["limits"], "limits", limit_keys, limit_keys)
    limits = Limits(**{k: float(r.number(lim[k], f"limits.{k}", 0.001)) for k in limit_keys})
    mode = r.choice(raw.get("mode", "train"), "mode", ("train", "eval"))
    return Task(name=r.text(raw["name"], "name"), path=path, reference=reference,
                digest=task_digest, semantics=_semantics(r, raw["semantics"], reference),
                parameters=parameters, dtypes=dtypes, tolerance=tolerance,
                correctness=correctness, benchmark_dtype=benchmark_dtype,
                benchmarks=benchmarks, timing=timing, limits=limits, mode=mode, **extra)


def _correctness(r: _Reader, raw: Any, known: tuple[str, ...],
                 parameters: tuple[str, ...]) -> Correctness:
    keys = {"distributions", "fixed_shapes", "random_cases", "random_shape", "max_elements",
            "steps"}
    c = r.mapping(raw, "correctness", keys, keys - {"steps"})
    dist_raw = c["distributions"]
    if not isinstance(dist_raw, list) or not dist_raw:
        raise r.fail("correctness.distributions", f"a non-empty list drawn from {list(known)}",
                     dist_raw)
    distributions = tuple(r.choice(d, f"correctness.distributions[{i}]", known)
                          for i, d in enumerate(dist_raw))
    ranges_raw = c["random_shape"]
    if not isinstance(ranges_raw, list) or len(ranges_raw) != len(parameters):
        raise r.fail("correctness.random_shape", f"a list of [lo, hi] per parameter "
                     f"({', '.join(parameters)})", ranges_raw)
    ranges = []
    for i, pair in enumerate(ranges_raw):
        key = f"correctness.random_shape[{i}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise r.fail(key, "a pair [lo, hi]", pair)
        lo = r.number(pair[0], f"{key}[0]", r.smallest_size, integer=True)
        hi = r.number(pair[1], f"{key}[1]", lo, integer=True)
        if lo < 1 and hi > lo:
            raise r.fail(key, "lo >= 1 where the size varies (it is drawn log-uniformly)", pair)
        ranges.append((lo, hi))
    steps_raw = c.get("steps", [1] * len(parameters))
    if not isinstance(steps_raw, list) or len(steps_raw) != len(parameters):
        raise r.fail("correctness.steps", "a step per parameter", steps_raw)
    steps = tuple(r.number(s, f"correctness.steps[{i}]", 1, integer=True)
                  for i, s in enumerate(steps_raw))
    max_elements = r.number(c["max_elements"], "correctness.max_elements", 1, integer=True)
    fixed = r.cases(c["fixed_shapes"], "correctness.fixed_shapes", parameters)
    return Correctness(
        distributions=distributions,
        fixed_shapes=fixed,
        random_cases=r.number(c["random_cases"], "correctness.random_cases", 0, integer=True),
        random_shape=tuple(ranges),
        max_elements=max_elements,
        steps=steps,
    )

