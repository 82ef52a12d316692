"""Shared helpers: a fast copy of the l2norm task, and running the CLI in-process."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from kbench.cli import commands as cli
from kbench.host import paths
from kbench.host.toolchain import find_toolchain, probe

# Ray, once initialised in the test process (tests/test_ray_tier.py), would replace
# builtins.print for the rest of the session (what kbench's own Ray driver turns off too).
os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"

has_gpu = torch.cuda.is_available()
has_nvcc = find_toolchain().cuda_home is not None


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """One build cache for the session: the one `kbench grade` uses (KBENCH_CACHE_DIR, else
    ~/.cache/kbench), so the tests reuse the quick start's builds instead of compiling them
    again; build folders are content-addressed, so sharing them is safe."""
    return paths.default_cache_dir()


@pytest.fixture(scope="session")
def compile_checked(cache_dir) -> list[Path]:
    """The marks by which the session cache remembers that `kbench grade`'s CUDA compile check
    (an nvcc compile against torch's headers, some 5 s) passed; made here once."""
    marks = cache_dir / "toolkits"
    tools = find_toolchain(None, marks)  # as the grader finds it
    if tools.cuda_home is not None:
        probe(tools, marks)
    return sorted(marks.glob("probe-*.ok"))


def fresh_cache(folder: Path, compile_checked: list[Path]) -> Path:
    """A build cache of its own at ``folder``, empty but for the remembered compile check:
    tests that need their own builds (or to prune them) need not pay that check each time.
    A mark is keyed on the toolchain, torch and environment, not on the cache it is in."""
    (folder / "toolkits").mkdir(parents=True, exist_ok=True)
    for mark in compile_checked:
        shutil.copy2(mark, folder / "toolkits" / mark.name)
    return folder


def quick_task(tmp_path: Path, **overrides) -> Path:
    """tasks/l2norm.yaml with fewer cases, short budgets and tight limits, for fixtures.

    ``overrides`` maps "section.key" (or a top-level key) to a new value.
    """
    raw = yaml.safe_load((paths.tasks_dir() / "l2norm.yaml").read_text())
    raw["correctness"]["random_cases"] = 3
    raw["correctness"]["max_elements"] = 65536
    raw["correctness"]["fixed_shapes"] = [[1, 1], [7, 33], [4, 1000], [16, 1024], [2, 3000]]
    raw["benchmarks"]["cpu"] = [[16, 1024]]
    raw["benchmarks"]["cuda"] = [[16, 16384], [4096, 4096]]
    raw["timing"].update(min_samples=3, max_samples=50, budget_ms=20, warmup_ms=5, target_ci=0.01,
                         compile_reference=False)
    raw["limits"].update(load_s=120, case_s=15, benchmark_s=60, host_memory_gib=3, log_mib=4)
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        (raw[section] if section else raw)[name] = value
    folder = tmp_path / "task"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "l2norm.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def grade(args: list[str], out: Path, cache: Path) -> tuple[int, dict | None]:
    """Run ``kbench grade`` in-process; return its exit code and results.json (if written)."""
    code = cli.main(["grade", *args, "--out", str(out), "--cache-dir", str(cache)])
    results = out / "results.json"
    return code, (json.loads(results.read_text()) if results.exists() else None)


# The KernelBench-format fixture problems and their candidates, graded on CPU (test_problems
# checks each verdict; test_slots the same run on several slots and on Ray).
PROBLEM_SET_ARGS = [str(FIXTURES / "problem_subs"), "--task", str(FIXTURES / "problems"),
                    "--device", "cpu", "--no-timing", "--jobs", "2", "--seed", "7"]


@pytest.fixture(scope="session")
def problem_set_run(tmp_path_factory, cache_dir) -> tuple[int, dict | None]:
    """The fixture problem set graded in one local slot."""
    return grade(PROBLEM_SET_ARGS, tmp_path_factory.mktemp("problems") / "reports", cache_dir)


def by_name(results: dict) -> dict[str, dict]:
    return {s["name"]: s for s in results["submissions"]}


def assert_forgery_not_believed(sub: dict) -> None:
    """A forged stopwatch (a cpu_timing fixture) is flagged by kbench's own clock; or, timed on
    a host that stayed busy to the end, where load explains a flag as well as a forgery does
    (docs/security.md), ``ok`` with the clock's note and its interval widened to what the
    clock saw: never its forged figure as a clear one."""
    if sub["status"] == "flagged":
        assert "kbench's own clock" in sub["reason"], sub["reason"]
        return
    assert sub["status"] == "ok" and sub["timed_beside"]["disturbed"], \
        (sub["name"], sub["status"], sub["reason"], sub["timed_beside"])
    notes = " ".join(sub["timed_beside"]["notes"])
    assert "clock check could not tell" in notes, notes
    (bench,) = [b for b in sub["benchmarks"] if b.get("candidate")]
    seen = bench["reference"]["ms"] / bench["candidate"]["trusted_ms"]
    assert sub["speedup_ci"][0] <= seen, (sub["speedup_ci"], seen)
