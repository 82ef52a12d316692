"""The child process's main loop: import one module, then answer the trusted side's requests.

Started as ``python -m kbench.worker CHANNEL_FD PARENT_PID [DEVICE]``. Requests arrive over the
private channel (a socket inherited as a file descriptor; stdout and stderr are only a log) as the
typed messages of kbench.shared.protocol, which lists them with the answer each expects. Crashes and
hangs are for the parent to notice.

Timing inputs are drawn here from seeds made with the OS's randomness at the moment each set
is needed, never sent by the parent: the submission cannot know an input before it is made.
``Time`` (with ``keep``) and ``Clocked`` keep some outputs with their seeds; ``Outputs`` hands
them to the parent, which draws the same inputs from the seeds and checks them.

``Run`` answers with the output and ``returned``, a copy made the moment the call returned: the
parent checks the copy's values and compares the output with it later, so a thread that writes
the output after the call returned is caught as such however late the parent looks.

This side imports kbench.shared.protocol, pure helpers and torch: nothing of the trusted side.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
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

from kbench.shared import inputs as problem
from kbench.shared import protocol as p
from kbench.shared.fingerprint import weight_sums
from kbench.shared.outputs import Unsupported, flatten
from kbench.worker import prebuilt
from kbench.worker.hold import DeviceWait
from kbench.worker.kept import HELD_BY_A_PASS, clocked
from kbench.worker.kernels import kernels_of, prepare_profiler
from kbench.worker.timing import clocks_of, measure, rotation, set_bytes, synchronizer, warm_up
from kbench.worker.trials import trials

_MODELS_KEPT = 2  # instances kept at once (cases of other sizes or dtypes build their own)


class Worker:
    def __init__(self) -> None:
        self.cls: Any = None
        self.eval_mode = False
        self.compile = False
        self.models: dict[str, Any] = {}  # repr(ModelSpec) -> instance, oldest first
        self.reference: Any = None
        self.module: Any = None  # the submission's module (the reference's, for a baseline)
        self.device = torch.device("cpu")
        self.last_output: Any = None  # held for the parent until the next request
        self.kept: dict[int, tuple[Any, float | None, int]] = {}  # call -> output, norm, seed
        self.prepared: list[tuple[list, int] | None] = []  # sets for ``clocked``, with seeds
        self.pass_plan: p.Prepare | None = None

    def answer(self, request: p.Request) -> p.Answer:
        handler = {p.Load: self.load, p.Run: self.run, p.Time: self.time,
                   p.TimeTrials: self.time_trials,
                   p.Prepare: self.prepare, p.Clocked: self.clocked, p.Outputs: self.outputs,
                   p.Profile: self.profile, p.Warm: self.warm,
                   p.PrepareProfiler: self.prepare_profiler, p.Copy: self.copy,
                   p.Release: self.release}[type(request)]
        return handler(request)

    def load(self, r: p.Load) -> p.Answer:
        self.device = torch.device(r.device)
        self.eval_mode, self.compile = r.eval_mode, r.compile
        try:
            self.reference = problem.load_file(r.reference, "kbench_reference")
        except BaseException as exc:
            return _error("reference", exc)
        if r.path == r.reference:  # the reference itself: one module, one set of sizes
            module = self.reference
        else:
            try:
                module = problem.load_file(r.path, r.module_name, vars(self.reference)
                                           if r.shared_names else None)
            except BaseException as exc:  # SystemExit at import is the submission's failure too
                return _error("import", exc)
        self.module = module
        self.cls = getattr(module, r.class_name, None)
        if not isinstance(self.cls, type):
            return p.Failed(p.WorkerError("import", "kbench.MissingClass",
                                          f"defines no class {r.class_name}"))
        if r.model is None:
            return p.Loaded()
        try:
            model = self._model(r.model)
            weights = [p.WeightPrint(name, list(t.shape), str(t.dtype).removeprefix("torch."),
                                     weight_sums(t))
                       for name, t in getattr(model, "_orig_mod", model).state_dict().items()
                       if isinstance(t, torch.Tensor)]
        except BaseException as exc:
            return _error("init", exc)
        return p.Loaded(weights)

    def _model(self, spec: p.ModelSpec) -> Any:
        """The instance ``spec`` names, built under its seed if it is not one of the latest
        (kbench.shared.inputs.build); torch.compile'd for a compile baseline."""
        problem.bind(self.reference, spec.params)
        if self.module is not self.reference:
            problem.mirror(self.module, spec.params)
        key = repr(spec)
        if key in self.models:
            return self.models[key]
        while len(self.models) >= _MODELS_KEPT:
            del self.models[next(iter(self.models))]
        model = problem.build(self.cls, spec.init_args, spec.seed, self.device, spec.dtype,
                              self.eval_mode)
        if self.compile:  # compiles lazily, on the first call of each new shape
            model = torch.compile(model)
        self.models[key] = model
        return model

    def run(self, r: p.Run) -> p.Answer:
        self.last_output = None
        try:
            model = self._model(r.model)
        except BaseException as exc:
            return _error("init", exc)
        try:
            with torch.no_grad():
                out = model(*r.inputs)
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                try:
                    leaves, structure = flatten(out)
                except Unsupported as exc:
                    return p.Unsupported(str(exc))
                # a tensor that requires grad cannot cross the channel
                leaves = [_detach(v) if type(v) is torch.Tensor else v for v in leaves]
                returned = [_clone(v) if type(v) is torch.Tensor else v for v in leaves]
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
        except BaseException as exc:
            return _error("run", exc)
        self.last_output = (leaves, returned)
        aliases = any(type(v) is torch.Tensor and isinstance(t, torch.Tensor)
                      and _same_memory(v, t) for v in leaves for t in r.inputs)
        return p.Ran(outputs=leaves, returned=returned, structure=structure,
                     aliases_input=aliases)

    def time(self, r: p.Time) -> p.Answer:
        """Samples for one benchmark case, each call on a set drawn from a fresh secret seed."""
        seeds: dict[int, int] = {}

        def inputs(i: int) -> list:
            args, seeds[i] = self._fresh_set(r)
            return args

        try:
            model = self._model(r.model)
        except BaseException as exc:
            return _error("init", exc)
        with torch.no_grad():
            answer, kept = self._measure(lambda args: model(*args), inputs, r.timing,
                                         "benchmark")
        if r.keep:
            self.kept = {i: (out, norm, seeds[i]) for i, (out, norm) in kept.items()}
        else:  # the reference's round: give its memory back before the other side's round
            del kept
            self._free()
        return answer

    def time_trials(self, r: p.TimeTrials) -> p.Answer:
        """KernelBench's timing of one case (kbench.worker.trials), on one fresh input set."""
        try:
            model = self._model(r.model)
            args = self._fresh_set(r)[0]
            with torch.no_grad():
                ms = trials(lambda: model(*args), self.device, r.warmup, r.trials, r.budget_ms)
        except BaseException as exc:
            return _error("benchmark (KernelBench's timing)", exc)
        finally:
            self.last_output = None
            self._free()
        return p.TrialTimes(ms)

    def prepare(self, r: p.Prepare) -> p.Answer:
        """Input sets for a ``clocked`` pass of ``calls`` calls (as many sets as the calls
        rotate over, see rotation), after untimed calls on a spare set whose outputs are held
        together, as many as the pass holds at once (see kept.clocked), so that the pass's
        outputs come from the allocator's cache as timed calls' do: after a ``release`` the
        cache is empty, and a fresh device allocation of a large output costs milliseconds
        (seen on an H100 at 32768x65535: 2.4 ms a call, enough to fail kbench's own clock)."""
        self.prepared, self.kept = [], {}
        self.pass_plan = r
        try:
            model = self._model(r.model)
            with torch.no_grad():
                spare = self._fresh_set(r)[0]
                held = [model(*spare) for _ in range(HELD_BY_A_PASS)]
                del spare, held
            self.prepared.append(self._fresh_set(r))
            count = rotation(set_bytes(self.prepared[0][0]), self.device)
            self.prepared += [self._fresh_set(r) for _ in range(min(r.calls, count) - 1)]
            if self.device.type == "cuda":
                torch.cuda.synchronize()
        except BaseException as exc:
            self.prepared = []
            return _error("benchmark", exc)
        return p.Prepared(r.calls)

    def clocked(self, r: p.Clocked) -> p.Answer:
        """The prepared pass: call i takes set i modulo the sets, which gets new values from a
        new secret seed whenever its turn comes round again, so no call sees an input twice;
        ``empty``: the same loop, new values included, with no call (on a GPU a wait on the
        device in its place, ``wait_ms`` long)."""
        sets, plan = self.prepared, self.pass_plan
        if plan is None or not sets:
            return p.Failed(p.WorkerError("benchmark", "kbench.NotPrepared",
                                          "a clocked pass before its input sets were prepared"))
        seeds: dict[int, int] = {}

        def inputs(i: int) -> list:
            slot = i % len(sets)
            if i >= len(sets):
                sets[slot] = None  # freed first: the new set takes its memory
                sets[slot] = self._fresh_set(plan)
            seeds[i] = sets[slot][1]
            return sets[slot][0]

        try:
            model = self._model(plan.model)
        except BaseException as exc:
            return _error("init", exc)
        wait = DeviceWait(r.wait_ms, clocks_of(self.device).max_sm_mhz) \
            if r.empty and r.wait_ms > 0 and self.device.type == "cuda" else None
        call = wait or ((lambda args: None) if r.empty else (lambda args: model(*args)))
        try:
            with torch.no_grad():
                kept = clocked(call, inputs, plan.calls, self.device)
            waited_ms = wait.waited_ms() if wait else 0.0
        except BaseException as exc:
            return _error("benchmark", exc)
        if r.empty:
            return p.ClockedPass(plan.calls, [], waited_ms)
        self.prepared = []
        self.kept = {i: (out, norm, seeds[i]) for i, (out, norm) in kept.items()}
        return p.ClockedPass(plan.calls, sorted(kept))

    def outputs(self, r: p.Outputs) -> p.Answer:
        """The kept outputs of ``calls`` (shared with the parent, alive until the next
        request); every other kept output is dropped."""
        kept, self.kept = self.kept, {}
        sent = []
        for call in r.calls:
            if call not in kept:
                continue
            out, norm, seed = kept[call]
            try:
                leaves, structure = flatten(out)
                leaves = [_detach(v) if type(v) is torch.Tensor else v for v in leaves]
            except Unsupported as exc:
                leaves, structure = None, str(exc)
            sent.append(p.KeptOutput(call=call, seed=seed, outputs=leaves, structure=structure,
                                     norm=norm))
        self.last_output = sent
        return p.KeptOutputs(sent)

    def profile(self, r: p.Profile) -> p.Answer:
        """One call under the profiler, on a fresh input set: the kernels it ran."""
        self.last_output, self.kept = None, {}
        try:
            model = self._model(r.model)
            with torch.no_grad():
                kernels = kernels_of(model, self._fresh_set(r)[0])
        except BaseException as exc:
            return _error("profile", exc)
        finally:
            self._free()
        return p.Profiled(kernels)

    def warm(self, r: p.Warm) -> p.Answer:
        """One untimed call on a fresh input set (a compiled model compiles for the case), then
        calls for ``repeat_ms``: the warm-up of this case's first timed round, done ahead."""
        self.last_output, self.kept = None, {}
        try:
            model = self._model(r.model)
            with torch.no_grad():
                warm_up(lambda args: model(*args), self._fresh_set(r)[0], r.repeat_ms,
                        synchronizer(self.device))
        except BaseException as exc:
            return _error("benchmark (warm-up)" if r.repeat_ms else "benchmark (torch.compile)",
                          exc)
        finally:
            self._free()
        return p.Released()

    def prepare_profiler(self, r: p.PrepareProfiler) -> p.Answer:
        try:
            prepare_profiler()
        except BaseException as exc:
            return _error("profile", exc)
        return p.Released()

    def _fresh_set(self, r: p.Drawn) -> tuple[list, int]:
        """An input set drawn from a new secret seed, and the seed."""
        seed = secrets.randbits(62)
        return problem.draw(self.reference, r.params, r.dtype, r.distribution, seed,
                            self.device), seed

    def copy(self, r: p.Copy) -> p.Answer:
        buffers: list = []

        def inputs(i: int) -> list:  # made on first use, so a failure is reported like others
            if not buffers:
                buffers.append(torch.ones(r.nbytes, dtype=torch.uint8, device=self.device))
                buffers.append(torch.empty_like(buffers[0]))
            return buffers

        timing = dataclasses.replace(r.timing, mode="eager")
        return self._measure(lambda args: args[1].copy_(args[0]), inputs, timing,
                             "copy bandwidth")[0]

    def release(self, r: p.Release) -> p.Answer:
        """Drop every output held for the parent and give the device memory back, so that
        the next round, the other side's or the parent's own check, has it (a process that
        has finished its part must not sit on a case's worth of cached blocks)."""
        self.last_output, self.kept, self.prepared = None, {}, []
        self._free()
        return p.Released()

    def _free(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _measure(self, call, inputs, timing: p.TimingSettings, stage: str
                 ) -> tuple[p.Answer, dict]:
        self.last_output, self.kept = None, {}
        try:
            samples, kept = measure(call, inputs, self.device, **dataclasses.asdict(timing))
            return p.Timed(samples), kept
        except BaseException as exc:
            return _error(stage, exc), {}
        finally:
            self._free()


_clone, _detach = torch.Tensor.clone, torch.Tensor.detach  # bound before any submission


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.device == b.device
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.untyped_storage().nbytes() > 0)


def _error(stage: str, exc: BaseException) -> p.Failed:
    text = traceback.format_exc()
    print(text, file=sys.stderr, flush=True)
    kind = type(exc)
    return p.Failed(p.WorkerError(stage, f"{kind.__module__}.{kind.__qualname__}",
                                  str(exc)[-20000:], text[-20000:]))


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
    """``CHANNEL_FD PARENT_PID [DEVICE]``: with DEVICE cuda (a spare started ahead of need,
    kbench.host.spawn.prestart), the CUDA context is made before the first request."""
    _die_with_parent(int(argv[1]))
    conn = Connection(int(argv[0]))
    if argv[2:] == ["cuda"] and torch.cuda.is_available():
        with contextlib.suppress(Exception):  # the load that follows reports a broken device
            torch.empty(1, device="cuda")
            torch.cuda.empty_cache()
    # Tensors travel as shared memory; the descriptor handover authenticates with this key.
    multiprocessing.current_process().authkey = conn.recv_bytes(64)
    prebuilt.install()  # before any submission imports load_inline
    worker = Worker()
    while True:
        try:
            request = p.decode(conn.recv(), p.REQUESTS)
        except EOFError:
            return 0
        if isinstance(request, p.Exit):
            return 0
        answer = worker.answer(request)
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(p.encode(answer))
