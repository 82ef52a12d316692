"""The child process's main loop: import one module, then answer the trusted side's requests.

Started as ``python -m kbench.worker CHANNEL_FD PARENT_PID``. Requests arrive as dicts over the
private channel (a socket inherited as a file descriptor; stdout and stderr are only a log).
Each answer is ``{"ok": True, ...}`` or ``{"ok": False, "error": {...}}``; crashes and hangs
are for the parent to notice.

  load     {path, module_name, class_name, init_args, device, reference, instantiate, compile}
  run      {inputs}                    -> {output, returned, aliases_input}
                                          or {output: None, output_type}
  time     {shape, dtype, timing, keep} -> {samples}  (timing.Samples as a dict)
  prepare  {shape, dtype, calls}       -> {calls}  (input sets for ``clocked``)
  clocked  {empty}                     -> {calls, kept}  (the calls, over fresh input sets)
  outputs  {calls}                     -> {outputs: [{call, seed, output, output_type, norm}]}
  copy     {nbytes, timing}            -> {samples}  (the copy-bandwidth yardstick)
  release  {}                          -> {}  (drop every output held for the parent, free the
                                          device memory they took)
  exit

Timing inputs are drawn here from seeds made with the OS's randomness at the moment each set
is needed, never sent by the parent: the submission cannot know an input before it is made.
``time`` (with ``keep``) and ``clocked`` keep some outputs with their seeds; ``outputs`` hands
them to the parent, which draws the same inputs from the seeds and checks them.

``run`` answers with the output and ``returned``, a copy made the moment the call returned: the
parent checks the copy's values and compares the output with it later, so a thread that writes
the output after the call returned is caught as such however late the parent looks (before,
the parent copied the output only once the answer had crossed the channel, milliseconds later
on a loaded machine, and such a write could land first and read as a wrong output).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import multiprocessing
import os
import secrets
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401  (registers tensor sharing with the pickler)

from kbench.worker.timing import HELD_BY_A_PASS, clocked, measure, rotation, set_bytes


class Worker:
    def __init__(self) -> None:
        self.model: Any = None
        self.reference: Any = None
        self.device = torch.device("cpu")
        self.last_output: Any = None  # held for the parent until the next request
        self.kept: dict[int, tuple[Any, float | None, int]] = {}  # call -> output, norm, seed
        self.prepared: list[tuple[list, int] | None] = []  # sets for ``clocked``, with seeds
        self.pass_plan: tuple[list, str, int] = ([], "float32", 0)  # shape, dtype, calls

    def load(self, path: str, module_name: str, class_name: str, init_args: list,
             device: str, reference: str, instantiate: bool, compile: bool = False) -> dict:
        self.device = torch.device(device)
        self.reference = importlib.import_module(reference)
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:  # SystemExit at import is the submission's failure too
            return _error("import", exc)
        cls = getattr(module, class_name, None)
        if not isinstance(cls, type):
            return {"ok": False, "error": {"stage": "import", "type": "kbench.MissingClass",
                                           "message": f"defines no class {class_name}",
                                           "traceback": ""}}
        if instantiate:
            try:
                self.model = cls(*init_args).to(self.device)
                self.model.eval()
                if compile:  # compiles lazily, on the first call of each new shape
                    self.model = torch.compile(self.model)
            except BaseException as exc:
                return _error("init", exc)
        return {"ok": True}

    def run(self, inputs: list) -> dict:
        self.last_output = None
        try:
            with torch.no_grad():
                out = self.model(*inputs)
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                if type(out) is not torch.Tensor:
                    kind = type(out)
                    return {"ok": True, "output": None,
                            "output_type": f"{kind.__module__}.{kind.__qualname__}"}
                out = _detach(out)  # a tensor that requires grad cannot cross the channel
                returned = _clone(out)
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
        except BaseException as exc:
            return _error("run", exc)
        self.last_output = (out, returned)
        aliases = any(isinstance(t, torch.Tensor) and _same_memory(out, t) for t in inputs)
        return {"ok": True, "output": out, "returned": returned, "aliases_input": aliases}

    def time(self, shape: list, dtype: str, timing: dict, keep: bool) -> dict:
        """Samples for one benchmark shape, each call on a set drawn from a fresh secret seed."""
        seeds: dict[int, int] = {}

        def inputs(i: int) -> list:
            args, seeds[i] = self._fresh_set(shape, dtype)
            return args

        with torch.no_grad():
            answer, kept = self._measure(lambda args: self.model(*args), inputs, timing,
                                         "benchmark")
        if keep:
            self.kept = {i: (out, norm, seeds[i]) for i, (out, norm) in kept.items()}
        else:  # the reference's round: give its memory back before the other side's round
            del kept
            self._free()
        return answer

    def prepare(self, shape: list, dtype: str, calls: int) -> dict:
        """Input sets for a ``clocked`` pass of ``calls`` calls (as many sets as the calls
        rotate over, see rotation), after untimed calls on a spare set whose outputs are held
        together, as many as the pass holds at once (see timing.clocked), so that the pass's
        outputs come from the allocator's cache as timed calls' do: after a ``release`` the
        cache is empty, and a fresh device allocation of a large output costs milliseconds
        (seen on an H100 at 32768x65535: 2.4 ms a call, enough to fail kbench's own clock)."""
        self.prepared, self.kept = [], {}
        self.pass_plan = (shape, dtype, calls)
        try:
            with torch.no_grad():
                spare = self._fresh_set(shape, dtype)[0]
                held = [self.model(*spare) for _ in range(HELD_BY_A_PASS)]
                del spare, held
            self.prepared.append(self._fresh_set(shape, dtype))
            count = rotation(set_bytes(self.prepared[0][0]), self.device)
            self.prepared += [self._fresh_set(shape, dtype) for _ in range(min(calls, count) - 1)]
            if self.device.type == "cuda":
                torch.cuda.synchronize()
        except BaseException as exc:
            self.prepared = []
            return _error("benchmark", exc)
        return {"ok": True, "calls": calls}

    def clocked(self, empty: bool) -> dict:
        """The prepared pass: call i takes set i modulo the sets, which gets new values from a
        new secret seed whenever its turn comes round again, so no call sees an input twice;
        ``empty``: the same loop, new values included, with no call."""
        sets, (shape, dtype, calls) = self.prepared, self.pass_plan
        seeds: dict[int, int] = {}

        def inputs(i: int) -> list:
            slot = i % len(sets)
            if i >= len(sets):
                sets[slot] = None  # freed first: the new set takes its memory
                sets[slot] = self._fresh_set(shape, dtype)
            seeds[i] = sets[slot][1]
            return sets[slot][0]

        call = (lambda args: None) if empty else (lambda args: self.model(*args))
        try:
            with torch.no_grad():
                kept = clocked(call, inputs, calls, self.device)
        except BaseException as exc:
            return _error("benchmark", exc)
        if empty:
            return {"ok": True, "calls": calls, "kept": []}
        self.prepared = []
        self.kept = {i: (out, norm, seeds[i]) for i, (out, norm) in kept.items()}
        return {"ok": True, "calls": calls, "kept": sorted(kept)}

    def outputs(self, calls: list) -> dict:
        """The kept outputs of ``calls`` (shared with the parent, alive until the next
        request); every other kept output is dropped."""
        kept, self.kept = self.kept, {}
        sent = []
        for call in calls:
            if call not in kept:
                continue
            out, norm, seed = kept[call]
            kind = type(out)
            tensor = out if kind is torch.Tensor else None
            sent.append({"call": call, "seed": seed, "output": tensor, "norm": norm,
                         "output_type": f"{kind.__module__}.{kind.__qualname__}"})
        self.last_output = sent
        return {"ok": True, "outputs": sent}

    def _fresh_set(self, shape: list, dtype: str) -> tuple[list, int]:
        """An input set drawn from a new secret seed, and the seed."""
        seed = secrets.randbits(62)
        return self.reference.make_inputs(tuple(shape), dtype, "normal", seed, self.device), seed

    def copy(self, nbytes: int, timing: dict) -> dict:
        buffers: list = []

        def inputs(i: int) -> list:  # made on first use, so a failure is reported like others
            if not buffers:
                buffers.append(torch.ones(nbytes, dtype=torch.uint8, device=self.device))
                buffers.append(torch.empty_like(buffers[0]))
            return buffers

        return self._measure(lambda args: args[1].copy_(args[0]), inputs,
                             {**timing, "mode": "eager"}, "copy bandwidth")[0]

    def release(self) -> dict:
        """Drop every output held for the parent and give the device memory back, so that
        the next round, the other side's or the parent's own check, has it (a process that
        has finished its part must not sit on a shape's worth of cached blocks)."""
        self.last_output, self.kept, self.prepared = None, {}, []
        self._free()
        return {"ok": True}

    def _free(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _measure(self, call, inputs, timing: dict, stage: str) -> tuple[dict, dict]:
        self.last_output, self.kept = None, {}
        try:
            samples, kept = measure(call, inputs, self.device, **timing)
            return {"ok": True, "samples": samples.to_dict()}, kept
        except BaseException as exc:
            return _error(stage, exc), {}
        finally:
            self._free()


_clone, _detach = torch.Tensor.clone, torch.Tensor.detach  # bound before any submission


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.device == b.device
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.untyped_storage().nbytes() > 0)


def _error(stage: str, exc: BaseException) -> dict:
    text = traceback.format_exc()
    print(text, file=sys.stderr, flush=True)
    kind = type(exc)
    return {"ok": False, "error": {"stage": stage, "type": f"{kind.__module__}.{kind.__qualname__}",
                                   "message": str(exc)[-20000:], "traceback": text[-20000:]}}


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill this process when kbench dies (even by SIGKILL), so a killed grading
    run leaves no worker behind, hung kernels included."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def main(argv: list[str]) -> int:
    _die_with_parent(int(argv[1]))
    conn = Connection(int(argv[0]))
    # Tensors travel as shared memory; the descriptor handover authenticates with this key.
    multiprocessing.current_process().authkey = conn.recv_bytes(64)
    worker = Worker()
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return 0
        op = request.pop("op")
        if op == "exit":
            return 0
        answer = getattr(worker, op)(**request)
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(answer)
