from kbench.host.build_dirs import build_dir
from kbench.host.toolchain import Toolchain
from kbench.results.verdict import first_error_line

PTXAS = """[1/3] /usr/local/cuda/bin/nvcc -Werror=foo -c cuda.cu -o cuda.cuda.o
FAILED: cuda.cuda.o
ptxas error   : Entry function '_Z3fooPf' uses too much shared data (0x20000 bytes, 0xc000 max)
Traceback (most recent call last):
RuntimeError: Error building extension 'l2_norm'
"""


def test_first_error_line_prefers_compiler_errors():
    assert first_error_line(PTXAS).startswith("ptxas error   : Entry function")
    line = "main.cpp:4:1: error: expected ';'"
    assert first_error_line(line + "\n") == line
    assert first_error_line("RuntimeError: Error building extension 'x': [1/2] c++ ...") \
        .startswith("RuntimeError: Error building extension")
    assert first_error_line("all good\n") is None


def test_build_dir_is_content_addressed(tmp_path):
    a, b = tmp_path / "l2norm_a.py", tmp_path / "l2norm_b.py"
    a.write_text("x = 1\n")
    b.write_text("x = 1\n")
    tools = Toolchain(cuda_home=None, nvcc_version=None, arch_list="9.0")
    cache = tmp_path / "cache"
    assert build_dir(cache, a, tools) == build_dir(cache, a, tools)
    b.write_text("# the same code\nx = (1)\n")
    assert build_dir(cache, a, tools) == build_dir(cache, b, tools)  # one build for both
    b.write_text("x = 1 if __file__ else 2\n")  # the same code could differ per file
    assert build_dir(cache, a, tools) != build_dir(cache, b, tools)
    assert build_dir(cache, b, tools) != build_dir(cache, b.rename(tmp_path / "c.py"), tools)
    other_arch = Toolchain(cuda_home=None, nvcc_version=None, arch_list="8.0")
    assert build_dir(cache, a, tools) != build_dir(cache, a, other_arch)
    before = build_dir(cache, a, tools)
    a.write_text("x = 2\n")
    assert build_dir(cache, a, tools) != before
