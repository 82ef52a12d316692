"""A fork server for workers: a process that has imported torch and kbench's worker code, and has
not touched the GPU, forks each new worker on request, so that a worker's start costs a fork
(tens of milliseconds) instead of torch's import (seconds, more on a busy host).

Started as ``python -m kbench.worker.zygote CONTROL_FD`` by kbench.host.spawn, with the
environment and CPU affinity its workers would have started with (what is read as a process
starts, at torch's import, is then the same). Over the control socket (SOCK_SEQPACKET) it says
``ready`` once its imports are done and a probe child could still use CUDA (else
``poisoned``: kbench then starts workers plainly), then answers one request per worker: a
JSON header and the worker's end of its channel (SCM_RIGHTS), answered with the worker's pid
or the error.

Each worker is forked twice: the middle process exits at once, so that the worker is adopted
by kbench (its child subreaper) and kbench waits for it, kills its session and reads its exit
status as for a process it started itself. The worker then makes itself what
``python -m kbench.worker`` would have been (kbench.worker.serve.main): a session of its own,
its log as stdout and stderr, stdin from /dev/null, its scratch folder as working directory, the
environment asked for, its own random state; then it serves. The zygote itself never imports
or runs submission code, and a worker keeps none of its descriptors.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import socket
import sys
import time
import traceback

import torch  # the import every worker would pay
import torch.multiprocessing  # noqa: F401

from kbench.worker import serve

_MESSAGE = 1 << 20
_ADOPTED_S = 5.0  # the middle process exits at once; the worker waits this long at most


def main(argv: list[str]) -> int:
    control = socket.socket(fileno=int(argv[0]))
    sys.stdout.flush()
    control.send(b"ready" if _clean() else b"poisoned")
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, _MESSAGE, 1)
        except OSError:
            return 0
        if not data:
            return 0  # kbench closed its end (or died): no more workers
        try:
            answer = {"pid": _fork(json.loads(data), fds[0], control.fileno())}
        except Exception as exc:  # the request or the fork failed: kbench starts it plainly
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        control.send(json.dumps(answer).encode())


def _clean() -> bool:
    """Whether a worker forked now can use CUDA: nothing imported here may have asked the CUDA
    runtime for its devices (torch.cuda.is_available() does, torch.utils.cpp_extension's
    import calls it), which makes torch refuse CUDA in every forked child."""
    probe = os.fork()
    if probe == 0:
        os._exit(1 if torch._C._cuda_isInBadFork() else 0)
    return os.waitstatus_to_exitcode(os.waitpid(probe, 0)[1]) == 0


def _fork(request: dict, channel: int, control: int) -> int:
    """Fork the worker (through a middle process that exits at once); its pid."""
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read)
            middle_pid = os.getpid()
            worker = os.fork()
            if worker == 0:
                os.close(write)
                _become_worker(request, channel, control, middle_pid)
            os.write(write, str(worker).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        pid = pipe.read()
    os.waitpid(middle, 0)
    return int(pid)


def _become_worker(request: dict, channel: int, control: int, middle: int) -> None:
    """In the forked worker (``middle``: the pid of the process that forked it, named before
    the fork: asked here, it would name kbench where the middle process has exited already,
    and the wait for adoption below would last its whole _ADOPTED_S, as it did on a 2-core
    machine for one forked start in three in a grade, for every one in bench/worker_start.py):
    what a started ``python -m kbench.worker`` is, then serve; never returns."""
    code = 1
    try:
        os.close(control)
        os.setsid()
        deadline = time.monotonic() + _ADOPTED_S
        while os.getppid() == middle and time.monotonic() < deadline:
            time.sleep(0.0005)  # adopted by kbench once the middle process has exited
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if request.get("cpus"):
            os.sched_setaffinity(0, request["cpus"])
        random.seed()
        sys.argv = [serve.__file__, str(channel), str(request["parent"]), request["device"]]
        code = serve.main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
