"""Which CUDA toolkit builds submissions, whether it can, and what the user is told."""

import os
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, ROOT, by_name, grade, has_nvcc, quick_task

from kbench.cli import commands as cli
from kbench.host import doctor, toolchain
from kbench.host.toolchain import find_toolchain, probe


def fake_toolkit(root: Path, release: str, compiles: bool = True) -> Path:
    """A folder shaped like a CUDA toolkit whose nvcc reports ``release`` and, asked to
    compile, succeeds or fails the way nvcc does on mismatched headers."""
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    nvcc = root / "bin" / "nvcc"
    failure = 'echo "x.h:39:6: error: #error \\"CUDA compiler and CUDA toolkit headers are ' \
              'incompatible\\"" >&2; exit 1'
    nvcc.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "Cuda compilation tools, '
                    f'release {release}, V{release}.1"; exit 0; fi\n'
                    + ("touch probe.o\n" if compiles else failure + "\n"))
    nvcc.chmod(0o755)
    return root


@pytest.fixture
def fresh_toolchain(monkeypatch):
    """find_toolchain remembers its answer; these tests change what it would find."""
    find_toolchain.cache_clear()
    monkeypatch.delenv("CUDA_PATH", raising=False)
    yield
    find_toolchain.cache_clear()


def test_a_toolkit_matching_torch_is_preferred_over_cuda_home(tmp_path, monkeypatch,
                                                              fresh_toolchain):
    monkeypatch.setattr(toolchain, "torch_cuda", lambda: "13.2")
    wheel = fake_toolkit(tmp_path / "site" / "nvidia" / "cu13", "13.2")
    monkeypatch.setattr(toolchain, "_wheel_nvccs", lambda: [wheel / "bin" / "nvcc"])
    (wheel / "lib").mkdir()
    (wheel / "lib" / "libcudart.so.13").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(fake_toolkit(tmp_path / "system", "13.0")))
    tools = find_toolchain("9.0", tmp_path / "links")
    assert tools.cuda_home == str(wheel) and tools.nvcc_version == "13.2"
    assert tools.origin == "NVIDIA's nvcc wheel"
    assert str(tmp_path / "system") in [t.home for t in tools.others]
    # The wheel ships libcudart.so.13 only; torch links with -lcudart.
    (links,) = tools.library_dirs
    assert (Path(links) / "libcudart.so").resolve() == wheel / "lib" / "libcudart.so.13"
    env = tools.env()
    assert links in env["LIBRARY_PATH"].split(os.pathsep) and env["CUDA_HOME"] == str(wheel)
    assert (doctor._nvcc("cpu", tools).level, doctor._nvcc("cpu", tools).blocks_cuda) == \
        (doctor.Level.OK, False)


def test_without_a_match_the_same_major_release_wins(tmp_path, monkeypatch, fresh_toolchain):
    monkeypatch.setattr(toolchain, "torch_cuda", lambda: "13.2")
    monkeypatch.setattr(toolchain, "_wheel_nvccs", lambda: [])
    monkeypatch.setattr(toolchain, "SYSTEM_HOMES", ())  # this machine's own toolkit aside
    monkeypatch.setenv("CUDA_HOME", str(fake_toolkit(tmp_path / "old", "12.8")))
    monkeypatch.setenv("PATH", str(fake_toolkit(tmp_path / "path", "13.0") / "bin"))
    tools = find_toolchain("9.0")
    assert tools.cuda_home == str(tmp_path / "path") and tools.origin == "PATH"
    check = doctor._nvcc("cuda", tools)
    assert check.level is doctor.Level.WARN and "pip install -e '.[cuda]'" in check.fix
    major = doctor._nvcc("cuda", toolchain.Toolchain(str(tmp_path / "old"), "12.8", "9.0"))
    assert major.level is doctor.Level.PROBLEM and major.blocks_cuda


def test_a_cpu_only_torch_cannot_build_cuda(monkeypatch):
    monkeypatch.setattr(toolchain, "torch_cuda", lambda: None)
    check = doctor._torch("cpu", toolchain.Toolchain("/usr/local/cuda", "13.0", "9.0"))
    assert check.level is doctor.Level.PROBLEM and check.blocks_cuda
    assert "None" not in check.fix and "CUDA build of torch" in check.fix


def test_no_toolkit_is_a_problem_only_where_cuda_would_run(fresh_toolchain):
    none = toolchain.Toolchain(None, None, "9.0")
    assert doctor._nvcc("cpu", none).level is doctor.Level.WARN
    on_gpu = doctor._nvcc("cuda", none)
    assert on_gpu.level is doctor.Level.PROBLEM and on_gpu.blocks_cuda
    assert "no nvcc that answers --version found" in doctor.blocking([on_gpu])


def test_probe_reports_the_compiler_s_first_error(tmp_path):
    broken = toolchain.Toolchain(str(fake_toolkit(tmp_path / "tk", "13.0", compiles=False)),
                                 "13.0", "9.0")
    error = probe(broken, tmp_path / "marks")
    assert error.startswith("x.h:39:6: error: #error") and "incompatible" in error
    assert not list((tmp_path / "marks").glob("*"))  # failures are tried again next time
    works = toolchain.Toolchain(str(fake_toolkit(tmp_path / "ok", "13.0")), "13.0", "9.0")
    assert probe(works, tmp_path / "marks") is None
    assert len(list((tmp_path / "marks").glob("probe-*.ok"))) == 1


@pytest.mark.nvcc
@pytest.mark.skipif(not has_nvcc, reason="no CUDA toolkit (nvcc) found")
def test_this_machine_s_toolkit_builds_against_torch(tmp_path):
    assert probe(find_toolchain(), tmp_path) is None


def test_a_toolchain_that_cannot_build_is_an_environment_error(tmp_path, monkeypatch,
                                                               cache_dir, fresh_toolchain):
    broken = fake_toolkit(tmp_path / "tk", torch.version.cuda or "13.0", compiles=False)
    monkeypatch.setenv("CUDA_HOME", str(broken))
    monkeypatch.setattr(toolchain, "torch_cuda", lambda: torch.version.cuda or "13.0")
    code, results = grade([str(ROOT / "kbench" / "submissions" / "l2norm_v3.py"),
                           str(FIXTURES / "cpu" / "l2norm_torch_ok.py"),
                           "--task", str(quick_task(tmp_path)), "--device", "cpu", "--case", "0"],
                          tmp_path / "out", cache_dir)
    subs = by_name(results)
    assert code == 0 and subs["l2norm_torch_ok"]["status"] == "ok"
    cuda = subs["l2norm_v3"]
    assert cuda["status"] == "environment_error" and cuda["build_s"] == 0, cuda
    assert "cannot build CUDA extensions" in cuda["reason"] and "incompatible" in cuda["reason"]
    assert "kbench doctor" in cuda["reason"] and "fix is at the top" in cuda["reason"]
    (problem,) = results["environment"]["problems"]
    assert problem.startswith("CUDA compile:")
    board = (tmp_path / "out" / "leaderboard.md").read_text()
    assert board.index("environment problems") < board.index("## Ranked")


def test_doctor_prints_each_check_and_exits_nonzero_on_a_problem(tmp_path, monkeypatch, capsys,
                                                                 fresh_toolchain):
    monkeypatch.setenv("CUDA_HOME", str(fake_toolkit(tmp_path / "tk", "13.0", compiles=False)))
    monkeypatch.setattr(toolchain, "torch_cuda", lambda: "13.0")
    code = cli.main(["doctor", "--quick", "--device", "cpu", "--cache-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1 and "1 problem(s)" in out
    for name in ("torch", "nvcc", "host compiler", "ninja", "GPU", "CUDA compile"):
        assert f"  {name}: " in out
    assert "problem  CUDA compile" in out and "fix: " in out
