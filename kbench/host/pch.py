"""kbench's own precompiled torch header for the C++ side of ``load_inline`` builds.

Every load_inline extension compiles a main.cpp that starts with ``#include <torch/extension.h>``
and spends most of its seconds parsing torch's headers. kbench precompiles that include once
per compiler, flag set and state of the headers, in its cache, and builds see a compiler
wrapper as CXX (kbench.worker.cxx) that forces the header in only where a compile's flags are
exactly those it was built with (kbench.shared.pch_key). torch's own ``use_pch`` is not used: it
writes into torch's install folder, with no lock, and any build without it deletes it.

Layout: ``CACHE/pch/FINGERPRINT/`` (the compiler and every header file's size and time under
torch's, Python's and CUDA's include folders: a changed header gives a new folder) holds the
wrapper ``kbench-g++`` and one folder per flag set, ``KEY/kbench_torch.h(.gch)``, made in a
temporary folder and renamed into place under a lock, files read-only. Only kbench's trusted
side writes there, before the builds start; the folder is watched like the build cache
(kbench.grading.building.watch), so a build that writes there is caught and the folder deleted.

Which flag sets: those of the load_inline calls the run's submissions make with literal
arguments (read from their source, never run), used by at least ``MIN_USES`` submissions (a
header costs about one compile of main.cpp), at most ``MAX_HEADERS`` (each is about 0.8 GB).
"""

from __future__ import annotations

import ast
import collections
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from kbench.host import paths
from kbench.host.toolchain import Toolchain
from kbench.shared.pch_key import HEADER, HEADER_TEXT, key

MIN_USES = 2
MAX_HEADERS = 4
WRAPPER = "kbench-g++"  # torch checks the compiler's name for g++ (check_compiler_ok_for_platform)


@dataclass(frozen=True)
class Variant:
    """What in a load_inline call changes main.cpp's flags."""

    with_cuda: bool
    extra_cflags: tuple[str, ...] = ()
    include_paths: tuple[str, ...] = ()


def real_compiler() -> str | None:
    """The C++ compiler torch would build with (CXX, else c++), as an absolute path; None
    where it is not one plain program (a ccache line, or none found)."""
    parts = shlex.split(os.environ.get("CXX", "c++"))
    found = shutil.which(parts[0]) if len(parts) == 1 else None
    return os.path.abspath(found) if found else None


def folder(cache_dir: Path, toolchain: Toolchain) -> Path | None:
    """This machine's headers folder for the current compiler and headers (None: no compiler)."""
    compiler = real_compiler()
    if compiler is None:
        return None
    roots = [Path(torch.__file__).parent / "include", Path(sysconfig.get_path("include"))]
    if toolchain.cuda_home:
        roots.append(Path(toolchain.cuda_home) / "include")
    roots += [Path(p) for p in toolchain.extra_includes]
    return Path(cache_dir) / "pch" / _fingerprint(compiler, tuple(roots))


def env(cache_dir: Path, toolchain: Toolchain) -> dict[str, str]:
    """CXX for a build or worker process: kbench's wrapper where ``prepare`` wrote one for this
    compiler and these headers, else nothing (build and load must see the same CXX: ninja
    compiles again when a command changes)."""
    where = folder(cache_dir, toolchain)
    wrapper = where / WRAPPER if where else None
    return {"CXX": str(wrapper)} if wrapper and wrapper.is_file() else {}


def variants(sources: Iterable[str]) -> collections.Counter[Variant]:
    """The flag sets of the load_inline calls in these submissions' sources, with how many
    submissions make each (calls whose arguments are not literals are left out)."""
    counts: collections.Counter[Variant] = collections.Counter()
    for text in sources:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        found = {v for node in ast.walk(tree) if (v := _variant(node)) is not None}
        counts.update(found)
    return counts


def _variant(node: ast.AST) -> Variant | None:
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if name != "load_inline" or any(k.arg is None for k in node.keywords):  # **kwargs
        return None
    kw = {k.arg: k.value for k in node.keywords}
    try:
        flags = ast.literal_eval(kw["extra_cflags"]) if "extra_cflags" in kw else None
        paths_ = ast.literal_eval(kw["extra_include_paths"]) if "extra_include_paths" in kw \
            else None
        cuda = ast.literal_eval(kw["with_cuda"]) if "with_cuda" in kw else None
    except ValueError:
        return None
    if cuda is None:
        given = kw.get("cuda_sources", node.args[2] if len(node.args) > 2 else None)
        cuda = given is not None and not (isinstance(given, ast.Constant) and not given.value)
    flags, paths_ = flags or [], paths_ or []
    if isinstance(flags, str) or isinstance(paths_, str) or paths_:
        return None  # user include folders: their headers are not fingerprinted
    return Variant(bool(cuda), tuple(shlex.split(" ".join(str(f) for f in flags))))


def prepare(cache_dir: Path, toolchain: Toolchain, sources: Iterable[str],
            build_env: dict[str, str], nice: int = 0) -> str:
    """Write the wrapper and build the headers this run's submissions would use (see the
    module's docstring), under the headers folder's lock; what was done, in a line."""
    where = folder(cache_dir, toolchain)
    if where is None:
        return "no precompiled header: no plain C++ compiler found (CXX, c++)"
    wanted = [v for v, n in variants(sources).most_common(MAX_HEADERS) if n >= MIN_USES]
    with _locked(where):
        _write_wrapper(where)
        flags = predicted_flags(wanted, build_env) if wanted else {}
        compiler = real_compiler() or "c++"
        todo = {v: f for v, f in flags.items()
                if not (where / key(compiler, f) / (HEADER + ".gch")).is_file()}
        failed = _build_all(where, todo, build_env, nice)
    made = len(todo) - len(failed)
    line = (f"precompiled torch header: {len(flags)} flag set(s) used by at least {MIN_USES} "
            f"submissions, {made} built now, {len(flags) - len(todo)} from the cache")
    return line + (f"; failed: {'; '.join(failed)[:300]}" if failed else "")


@contextlib.contextmanager
def _locked(where: Path) -> Iterator[None]:
    where.mkdir(parents=True, exist_ok=True)
    fd = os.open(where.parent / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_wrapper(where: Path) -> None:
    script = (f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -S -E "
              f"{shlex.quote(str(paths.PACKAGE_DIR / 'worker' / 'cxx.py'))} "
              f"{shlex.quote(real_compiler() or 'c++')} {shlex.quote(str(where))} \"$@\"\n")
    target = where / WRAPPER
    if target.is_file() and target.read_text() == script:
        return
    tmp = where / f".{WRAPPER}.{os.getpid()}"
    tmp.write_text(script)
    tmp.chmod(0o555)
    os.replace(tmp, target)


_FLAGS_SCRIPT = """
import inspect, json, os, shlex, sys, tempfile
from torch.utils import cpp_extension as ce
write = ce._write_ninja_file_to_build_library
known = inspect.signature(write).parameters
out = []
for with_cuda, cflags in json.loads(sys.argv[1]):
    d = tempfile.mkdtemp()
    sources = [os.path.join(d, "main.cpp")] + ([os.path.join(d, "cuda.cu")] if with_cuda else [])
    args = dict(path=os.path.join(d, "build.ninja"), name="kbench_pch", sources=sources,
                extra_cflags=cflags, extra_cuda_cflags=[], extra_sycl_cflags=[],
                extra_ldflags=[], extra_include_paths=[], with_cuda=with_cuda,
                with_sycl=False, is_standalone=False)
    write(**{k: v for k, v in args.items() if k in known})
    lines = dict(l.split(" = ", 1) for l in open(args["path"]).read().splitlines()
                 if " = " in l and not l.startswith(" "))
    out.append([lines["cxx"], lines["cflags"], lines.get("post_cflags", "")])
print(json.dumps(out))
"""


def predicted_flags(wanted: list[Variant], build_env: dict[str, str]) -> dict[Variant, list[str]]:
    """The flags (as kbench.shared.pch_key reads them) that torch gives main.cpp for each
    flag set, asked of torch's own ninja writer in a process with the builds' environment;
    left out where torch compiles through another program (ccache) or cannot say."""
    plain = {k: v for k, v in build_env.items() if k != "CXX"}
    done = subprocess.run([sys.executable, "-c", _FLAGS_SCRIPT,
                           json.dumps([[v.with_cuda, list(v.extra_cflags)] for v in wanted])],
                          env={**os.environ, **plain}, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        return {}
    found = {}
    for variant, (cxx, cflags, post) in zip(wanted, json.loads(done.stdout.splitlines()[-1]),
                                            strict=False):
        if shlex.split(cxx) != shlex.split(os.environ.get("CXX", "c++")):
            continue
        flags = [f for f in shlex.split(cflags) + shlex.split(post)
                 if not f.startswith("-DTORCH_EXTENSION_NAME=")]
        found[variant] = flags
    return found


def _build_all(where: Path, todo: dict[Variant, list[str]], build_env: dict[str, str],
               nice: int) -> list[str]:
    """Each header built in a temporary folder, then renamed into place; what failed."""
    compiler = real_compiler() or "c++"
    plain = {**os.environ, **{k: v for k, v in build_env.items() if k != "CXX"}}
    running = []
    for flags in todo.values():
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=where))
        (tmp / HEADER).write_text(HEADER_TEXT)
        command = [compiler, "-x", "c++-header", *flags, str(tmp / HEADER),
                   "-o", str(tmp / (HEADER + ".gch"))]
        process = subprocess.Popen(command, env=plain, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True,
                                   preexec_fn=(lambda: os.nice(nice)) if nice else None)
        running.append((process, tmp, where / key(compiler, flags)))
    failed = []
    for process, tmp, target in running:
        _, err = process.communicate()
        if process.returncode != 0:
            failed.append(_cause(err))
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        for file in tmp.iterdir():
            file.chmod(0o444)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, target)
        except OSError:  # made meanwhile by a kbench that did not take the lock
            shutil.rmtree(tmp, ignore_errors=True)
    return failed


def _cause(stderr: str) -> str:
    """The compiler's line that says why it failed: the last one naming an error (gcc ends a
    fatal error, such as a full disk, with "compilation terminated.", which says nothing)."""
    lines = stderr.strip().splitlines() or ["?"]
    return next((line for line in reversed(lines) if "error" in line.lower()), lines[-1])


@cache
def _fingerprint(compiler: str, roots: tuple[Path, ...]) -> str:
    """The compiler (its path, and what it says its version is) and each header file's path,
    size and modification time under ``roots``."""
    digest = hashlib.sha256(compiler.encode())
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        digest.update(subprocess.run([compiler, "--version"], capture_output=True,
                                     timeout=30).stdout)
    for root in roots:
        digest.update(b"\0" + str(root).encode())
        for here, dirs, names in sorted(os.walk(root)):
            dirs.sort()
            for name in sorted(names):
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(here, name))
                    digest.update(f"{here}/{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]
