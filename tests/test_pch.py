"""kbench's precompiled torch header (kbench.host.pch) and the compiler wrapper that uses it
(kbench.worker.cxx): used only where a compile's flags are exactly the header's, never across a
change of headers, and never the cause of a failed build. A fake compiler records what it was
asked; the real compiler's run is test_grade_cpu's (same verdicts with and without)."""

import subprocess
import sys
from pathlib import Path

from kbench.host import pch
from kbench.host.toolchain import Toolchain
from kbench.shared.pch_key import HEADER, compile_flags, key

CXX_WRAPPER = Path(pch.__file__).resolve().parents[1] / "worker" / "cxx.py"
FLAGS = ["-DTORCH_API_INCLUDE_EXTENSION_H", "-isystem", "/torch/include", "-fPIC", "-std=c++20"]


def fake_compiler(tmp_path: Path, fail_with_header: bool = False) -> Path:
    """A compiler that appends its arguments to calls.txt (and fails when forced a header)."""
    script = tmp_path / "fakecxx"
    fail = 'case "$*" in *-include*) exit 1;; esac\n' if fail_with_header else ""
    script.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls.txt\n{fail}exit 0\n')
    script.chmod(0o755)
    return script


def torch_compile(source: Path, flags: list[str]) -> list[str]:
    """The arguments ninja gives the compiler for main.cpp (torch's compile rule)."""
    return ["-MMD", "-MF", "main.o.d", "-DTORCH_EXTENSION_NAME=ext_a", *flags, "-c",
            str(source), "-o", "main.o"]


def run_wrapper(compiler: Path, headers: Path, args: list[str]) -> str:
    done = subprocess.run([sys.executable, "-S", "-E", str(CXX_WRAPPER), str(compiler),
                           str(headers), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return (compiler.parent / "calls.txt").read_text()


def with_header(headers: Path, compiler: Path, flags: list[str]) -> Path:
    folder = headers / key(str(compiler), flags)
    folder.mkdir(parents=True)
    (folder / HEADER).write_text("#include <torch/extension.h>\n")
    (folder / (HEADER + ".gch")).write_bytes(b"gch")
    return folder


def main_cpp(tmp_path: Path, first: str = "#include <torch/extension.h>") -> Path:
    source = tmp_path / "main.cpp"
    source.write_text(f"{first}\nint f() {{ return 1; }}\n")
    return source


def test_flags_leave_out_what_names_one_file_or_extension():
    flags, source = compile_flags(torch_compile(Path("/b/main.cpp"), FLAGS))
    assert flags == FLAGS and source == "/b/main.cpp"
    other = compile_flags(["-MMD", "-MF", "x.d", "-DTORCH_EXTENSION_NAME=ext_b", *FLAGS, "-c",
                           "/c/main.cpp", "-o", "/c/main.o"])
    assert other[0] == flags  # another extension, the same header
    assert compile_flags(["main.o", "-shared", "-o", "ext.so"]) is None  # the link
    assert compile_flags(["-v"]) is None
    assert compile_flags(["-x", "c++", *FLAGS, "-c", "a.cpp", "-o", "a.o"]) is None


def test_the_header_is_forced_in_only_where_the_flags_match(tmp_path):
    compiler, headers, source = fake_compiler(tmp_path), tmp_path / "pch", main_cpp(tmp_path)
    folder = with_header(headers, compiler, FLAGS)
    calls = run_wrapper(compiler, headers, torch_compile(source, FLAGS))
    assert f"-include {folder / HEADER} -Winvalid-pch" in calls
    (tmp_path / "calls.txt").unlink()
    calls = run_wrapper(compiler, headers, torch_compile(source, [*FLAGS, "-O3"]))
    assert "-include" not in calls and "-O3" in calls  # other flags: compiled as it was
    (tmp_path / "calls.txt").unlink()
    calls = run_wrapper(compiler, headers, ["main.o", "-shared", "-o", "ext.so"])
    assert calls.strip() == "main.o -shared -o ext.so"


def test_a_source_that_does_not_start_with_torch_gets_no_header(tmp_path):
    compiler, headers = fake_compiler(tmp_path), tmp_path / "pch"
    with_header(headers, compiler, FLAGS)
    source = main_cpp(tmp_path, first="#define TORCH_ASSERT_ONLY_METHOD_OPERATORS")
    calls = run_wrapper(compiler, headers, torch_compile(source, FLAGS))
    assert "-include" not in calls


def test_a_compile_that_fails_with_the_header_runs_again_without(tmp_path):
    compiler = fake_compiler(tmp_path, fail_with_header=True)
    headers, source = tmp_path / "pch", main_cpp(tmp_path)
    with_header(headers, compiler, FLAGS)
    calls = run_wrapper(compiler, headers, torch_compile(source, FLAGS)).splitlines()
    assert len(calls) == 2 and "-include" in calls[0] and "-include" not in calls[1]


def test_changed_headers_or_compiler_give_another_folder(tmp_path):
    include = tmp_path / "include"
    include.mkdir()
    (include / "a.h").write_text("int a;\n")
    tools = Toolchain(cuda_home=None, nvcc_version=None, arch_list="9.0",
                      extra_includes=(str(include),))
    before = pch.folder(tmp_path, tools)
    assert pch.folder(tmp_path, tools) == before
    (include / "a.h").write_text("int a, b;\n")  # another size
    pch._fingerprint.cache_clear()  # read once per process: a run's headers do not change
    assert pch.folder(tmp_path, tools) != before
    assert key("/usr/bin/g++", FLAGS) != key("/usr/bin/clang++", FLAGS)


def test_flag_sets_are_read_from_literal_load_inline_calls():
    plain = 'load_inline(name="a", cpp_sources=s, functions=["f"])'
    cuda = 'load_inline(name="b", cpp_sources=s, cuda_sources=c, extra_cflags=["-O3"])'
    empty = 'load_inline(name="c", cpp_sources=s, cuda_sources=c, extra_cflags=["-O3", ""])'
    computed = 'load_inline(name="d", cpp_sources=s, extra_cflags=flags)'
    counts = pch.variants([plain, cuda, empty, computed, "x = (", plain + "\n" + plain])
    assert counts == {pch.Variant(False): 2, pch.Variant(True, ("-O3",)): 2}


def test_a_header_that_fails_to_build_is_reported_by_the_line_naming_its_error(tmp_path,
                                                                                monkeypatch):
    # gcc on a full disk: the cause, then "compilation terminated.", which alone says nothing
    compiler = tmp_path / "fullcxx"
    compiler.write_text("#!/bin/sh\necho 'kbench_torch.h: fatal error: cannot write PCH file: "
                        "No space left on device' >&2\necho 'compilation terminated.' >&2\n"
                        "exit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    failed = pch._build_all(tmp_path, {pch.Variant(False): FLAGS}, {}, 0)
    assert failed == ["kbench_torch.h: fatal error: cannot write PCH file: No space left on "
                      "device"]
    assert not list(tmp_path.glob(".tmp-*"))  # its temporary folder removed
