"""Static look at a submission's source: what it needs to run, and labels for the report.

Read as text, never imported. Labels are facts about the code, not verdicts.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize

_CUDA_SOURCE = re.compile(r"\bcuda_sources\s*=|__global__|\.cu['\"]")
# CUDA C++ through torch's extensions, a Triton kernel, a CuTe DSL kernel, a TileLang kernel.
_CUSTOM_KERNEL = re.compile(r"\bload_inline\b|\bcpp_extension\.load\b|__global__|@triton\.jit|"
                            r"@cute\.(kernel|jit)\b|@T\.prim_func\b|@tilelang\.jit\b")


def compiles(source: str) -> bool:
    """True when importing the file builds a C++ or CUDA extension (torch's cpp_extension):
    its build is a compile; any other file's is an import."""
    return bool(_EXTENSION.search(source))


_EXTENSION = re.compile(r"\bload_inline\b|\bcpp_extension\.load\b")


def needs_cuda(source: str) -> bool:
    """True when the file compiles CUDA code, which no CPU-only machine can run."""
    return bool(_CUSTOM_KERNEL.search(source)) and bool(_CUDA_SOURCE.search(source))


_IMPORT_LINE = re.compile(r"^\s*import\s+([\w.\s,]+?)\s*(?:#.*)?$", re.MULTILINE)
_FROM_LINE = re.compile(r"^\s*from\s+(\w+)", re.MULTILINE)


@functools.lru_cache(maxsize=512)
def imported(source: str) -> frozenset[str]:
    """The top-level modules the source imports, in any form and anywhere (``import a,
    triton``, ``import triton.language as tl``, ``from triton import jit``, an import inside a
    function); by lines where the source does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        names = [n.strip().split()[0] for line in _IMPORT_LINE.findall(source)
                 for n in line.split(",") if n.strip()]
        return frozenset([n.split(".")[0] for n in names] + _FROM_LINE.findall(source))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return frozenset(found)


# Things a reviewer of a fast result wants to know about; none of them is wrong in itself.
_LABELS = {
    "library-compute": re.compile(
        r"\b(F|functional)\.\w*norm\w*\b|\btorch\.(linalg|norm|matmul|einsum|cdist)\b|"
        r"\b(at|torch)::(norm|linalg_\w+|matmul|mm|bmm|sum|div)\b|cublas|cudnn"),
    "try-except": re.compile(r"^\s*(try\s*:|except\b)|\bcatch\s*\(", re.MULTILINE),
    # KernelBench's static patterns: the reference's own class, and torch's functional ops.
    "inherits-model": re.compile(r"^\s*class\s+ModelNew\s*\(\s*Model\s*\)", re.MULTILINE),
    "torch-functional": re.compile(r"\b(F|functional)\.\w+\s*\("),
    # Streams other than the caller's (launching on getCurrentCUDAStream() is the norm).
    "streams": re.compile(r"cuda\.Stream\b|cuda\.stream\(|cudaStreamCreate|getStreamFromPool|"
                          r"setCurrentCUDAStream|CUDAStreamGuard"),
    "threads": re.compile(r"\bthreading\b|\bThread\(|\bmultiprocessing\b|concurrent\.futures|"
                          r"std::thread|\bos\.fork\b"),
    "introspection": re.compile(r"^\s*import\s+(gc|inspect)\b|\bgc\.|\binspect\.|sys\._getframe|"
                                r"\bf_back\b|\bf_globals\b|__globals__|\bsys\.modules\b|"
                                r"\bkbench\b|/proc/", re.MULTILINE),
}


def flags(source: str) -> list[str]:
    """Labels shown beside a result: no custom kernel, and the _LABELS the code matches
    (the module docstring and comment lines are left out: prose is not code)."""
    found = [] if _CUSTOM_KERNEL.search(source) else ["no-custom-kernel"]
    code = _without_prose(source)
    return found + [name for name, pattern in _LABELS.items() if pattern.search(code)]


def _without_prose(source: str) -> str:
    lines = _without_comments(source).splitlines()
    try:
        body = ast.parse(source).body
    except (SyntaxError, ValueError):
        body = []
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        del lines[body[0].lineno - 1:body[0].end_lineno]
    return "\n".join(line for line in lines if not line.lstrip().startswith(("#", "//")))


def _without_comments(source: str) -> str:
    """The source with every Python comment cut, a trailing one included (``x = f()  # about
    kbench``); as it is where it does not tokenize."""
    try:
        comments = [t.start for t in tokenize.generate_tokens(io.StringIO(source).readline)
                    if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return source
    lines = source.splitlines()
    for row, col in comments:
        lines[row - 1] = lines[row - 1][:col]
    return "\n".join(lines)
