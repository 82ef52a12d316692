"""The Ray build tier on one machine: a head that grades (``kbench_grade``) and two CPU-only
nodes that build (``kbench_build``), each node with a build cache of its own (its
KBENCH_CACHE_DIR), so that what a node loads can only have come through Ray. C++ load_inline
builds, so the builds are real; of pybind11 alone (tests/fixtures/ray_*.py): seconds each."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import FIXTURES, by_name, grade, quick_task

ray = pytest.importorskip("ray", reason="the Ray extra: pip install -e '.[ray]'")

NODES = ("head", "build1", "build2")
CPP_OK = (FIXTURES / "ray_cpp_ok.py").read_text()
# Fixtures written into a run's folder under their graded names.
SOURCES = {"l2norm_torch_ok.py": FIXTURES / "cpu" / "l2norm_torch_ok.py",
           "l2norm_build_error.py": FIXTURES / "build_error_at_once.py"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("ray-tier")
    caches = {name: root / f"cache-{name}" for name in NODES}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"kbench_grade": 1},
        "env_vars": {"KBENCH_CACHE_DIR": str(caches["head"])}})
    nodes = {name: cluster.add_node(num_cpus=1, resources={"kbench_build": 1},
                                    env_vars={"KBENCH_CACHE_DIR": str(caches[name])})
             for name in NODES[1:]}
    ray.init(address=cluster.address)
    yield cluster, nodes, caches, root
    ray.shutdown()
    cluster.shutdown()


def _variant(folder: Path, tag: str) -> Path:
    """ray_cpp_ok as another extension: other code, so another build folder."""
    path = folder / f"l2norm_cpp_{tag}.py"
    path.write_text(CPP_OK.replace('name="l2norm_cpp"', f'name="l2norm_cpp_{tag}"'))
    return path


def _subs(folder: Path, tags: list[str], fixtures: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for tag in tags:
        _variant(folder, tag)
    for name in fixtures:
        (folder / name).write_text(SOURCES[name].read_text())
    return folder


def _where(output: str) -> dict[str, str]:
    """Each build's node (the first 8 hex digits of its id), from the run's build lines."""
    line = (r"^l2norm: (\S+) (?:built|not built|imported|did not import).* "
            r"on \S+ \(node ([0-9a-f]{8})")
    return {m[1]: m[2] for m in re.finditer(line, output, re.M)}


def _ray_grade(subs: Path, task: Path, out: Path, capsys) -> tuple[dict, str]:
    code, results = grade([str(subs), "--task", str(task), "--device", "cpu", "--no-timing",
                           "--seed", "7", "--executor", "ray"], out, out.parent / "driver-cache")
    output = capsys.readouterr().out
    assert code == 0 and results, output[-4000:]
    return results, output


def _compiled(cache: Path) -> set[str]:
    """The build folders in which a compiler ran (object files are there)."""
    return {p.parts[-3] for p in (cache / "extensions").glob("build-*/*/*.o")}


def test_builds_run_on_the_cpu_nodes_and_travel_to_the_grader(cluster, tmp_path, capsys):
    _, nodes, caches, _ = cluster
    task = quick_task(tmp_path)
    subs = _subs(tmp_path / "subs", ["a"], ["l2norm_torch_ok.py", "l2norm_build_error.py"])
    results, output = _ray_grade(subs, task, tmp_path / "ray", capsys)
    verdicts = {n: s["status"] for n, s in by_name(results).items()}
    # Each verdict named, as a local run of these sources gives them (no local run to compare:
    # equal to its verdicts, Ray's could be wrong with it).
    assert verdicts == {"l2norm_cpp_a": "ok", "l2norm_torch_ok": "ok",
                        "l2norm_build_error": "build_error"}, output[-4000:]

    builders = {nodes[n].node_id[:8]: n for n in NODES[1:]}
    where = _where(output)
    assert set(where) == set(verdicts), output[-4000:]
    assert {builders.get(node, "elsewhere") for node in where.values()} <= set(builders.values())
    # Each node compiled only what the run says it built, and the grader compiled nothing:
    # the libraries it loaded were unpacked from what the build nodes sent.
    for name in NODES[1:]:
        built_here = [s for s, node in where.items() if builders[node] == name]
        assert len(_compiled(caches[name])) == len([s for s in built_here if "cpp" in s])
    assert not _compiled(caches["head"])
    shipped = list((caches["head"] / "extensions").glob("build-*/.kbench-shipped"))
    assert len(shipped) == 1  # the C++ extension that built
    for folder in (s.parent for s in shipped):
        assert {p.suffix for p in folder.rglob("*") if p.is_file()} <= {".so", ".json", ".lock",
                                                                        ""}
    assert (tmp_path / "ray" / "logs" / "l2norm_cpp_a.build.log").is_file()
    assert any(n.startswith("built on Ray node") for n in results["notes"])


def test_a_build_node_killed_mid_build_leaves_its_build_to_the_other(cluster, tmp_path,
                                                                     capsys):
    ray_cluster, nodes, caches, _ = cluster
    task = quick_task(tmp_path)
    subs = _subs(tmp_path / "subs", ["c"], ["l2norm_torch_ok.py"])
    killed: list[str] = []

    def kill_the_node_that_builds() -> None:
        """Remove the node whose compiler is at work on l2norm_cpp_c, once it is seen: Ray's
        nodes, their workers and so their compilers are processes below this one."""
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            for proc in psutil.Process().children(recursive=True):
                try:
                    command = " ".join(proc.cmdline())
                except psutil.Error:
                    continue
                if "l2norm_cpp_c/main.cpp" not in command:
                    continue
                for name in NODES[1:]:
                    if f"{caches[name]}/" in command:
                        ray_cluster.remove_node(nodes[name])
                        killed.append(name)
                        return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_the_node_that_builds, daemon=True)
    killer.start()
    results, output = _ray_grade(subs, task, tmp_path / "ray", capsys)
    killer.join()
    assert killed, "no node was seen building"
    other = next(n for n in NODES[1:] if n not in killed)
    assert {s["name"]: s["status"] for s in results["submissions"]} == \
        {"l2norm_cpp_c": "ok", "l2norm_torch_ok": "ok"}, output[-4000:]
    assert _where(output).get("l2norm_cpp_c") == nodes[other].node_id[:8], output[-4000:]
    assert list((caches[other] / "extensions").glob("build-*/l2norm_cpp_c/*.o"))
    graded = re.findall(r"^\[\d+/\d+\] (\S+):", output, re.M)
    assert sorted(graded) == ["l2norm_cpp_c", "l2norm_torch_ok"], output[-4000:]
