"""What the trusted side and a worker say to each other: typed, versioned messages.

Both sides import this module; it imports, of kbench's, only kbench.shared.wire (besides torch
and the standard library). A message crosses the channel as a plain dict, ``{"v": VERSION, "kind":
class name, field: value, ...}``, so the parent's allow-list unpickler (kbench.sandbox) never
needs to build a kbench class from a worker's bytes. ``decode`` turns a dict back into its
dataclass and checks every field's type against its annotations (kbench.shared.wire): an answer
from a worker is data from a process that may run candidate code: nothing is used unchecked.

Requests and the answer each expects:

  Load      -> Loaded                 import the file; with a ``model``, build it (its weights'
                                      fingerprints come back)
  Run       -> Ran | Unsupported      one call on the parent's inputs (shared memory)
  Time      -> Timed                  one round of the stopwatch on secret-seeded inputs
  Prepare   -> Prepared               input sets for a Clocked pass
  Clocked   -> ClockedPass            the pass the parent times on its own clock
  Outputs   -> KeptOutputs            outputs kept by Time or Clocked, with their seeds
  Profile   -> Profiled               one call under the profiler: the kernels it ran
  Warm      -> Released               one untimed call (a compiled model compiles for the case),
                                      then a round's warm-up, where asked, done ahead
  TimeTrials -> TrialTimes            a case timed as KernelBench's evaluator times it
  PrepareProfiler -> Released         the profiler's slow first start, with nothing recorded
  Copy      -> Timed                  the copy-bandwidth yardstick
  Release   -> Released               drop every kept output, free device memory
  Exit                                (no answer)

Any request may instead be answered with Failed (an exception, as text).
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from kbench.shared.wire import ProtocolError, build, plain, shown

VERSION = 9


class BadSamples(ProtocolError):
    """A worker's timing answer is not what kbench's stopwatch sends."""


# -- settings and records carried inside messages -------------------------------------------


# One value a call returned: kbench.shared.outputs flattens outputs into these.
Leaf = torch.Tensor | bool | int | float


@dataclass(frozen=True)
class ModelSpec:
    """Which model instance a request runs: ``Class(*init_args)`` built under ``seed`` with
    its floating parameters in ``dtype`` (kbench.shared.inputs.build), with the modules' sizes bound
    to ``params`` (a model may read them); the worker keeps the latest few."""

    init_args: list[Any]
    dtype: str
    seed: int
    params: dict[str, int]


@dataclass(frozen=True)
class WeightPrint:
    """A parameter's or buffer's name, shape, dtype and checksums (kbench.shared.fingerprint)."""

    name: str
    shape: list[int]
    dtype: str
    sums: list[float]


@dataclass(frozen=True)
class TimingSettings:
    """The stopwatch's settings for one measurement (kbench.worker.timing.measure)."""

    warmup_ms: float
    min_samples: int
    max_samples: int
    budget_ms: float
    target_ci: float
    mode: str = "eager"  # or "graph"


_LISTS = ("ms", "after_ms", "idle_ms", "host_ms", "sm_mhz", "mem_mhz", "slowed")


# The longest hold kbench's stopwatch queues ahead of a call (kbench.worker.hold): a call whose
# queueing outlasts it waited on the device (it synchronised), and is timed as it is.
HOLD_MAX_MS = 50.0


@dataclass
class Samples:
    """What the stopwatch measured: per-call times in ms and what the device was doing."""

    ms: list[float] = field(default_factory=list)  # per call: events (CUDA) or wall clock (CPU)
    # CUDA: per call, device time from the end event until the device was idle: work left on
    # other streams, plus the synchronisation's cost and jitter (the trusted side tells them
    # apart over all samples, against idle_ms); 0 on a CPU.
    after_ms: list[float] = field(default_factory=list)
    # CUDA: per call, the same figure for a probe with no side work run right after it: what
    # synchronising cost in the process's state at that moment; 0 on a CPU.
    idle_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)  # host time to issue the call (CUDA)
    sm_mhz: list[int | None] = field(default_factory=list)  # read right after each sample
    mem_mhz: list[int | None] = field(default_factory=list)
    slowed: list[bool] = field(default_factory=list)  # NVML reported a slowdown reason
    max_sm_mhz: int | None = None
    calls_per_sample: int = 1
    persisting_l2_reset: bool | None = None  # CUDA: could the runtime's reset be called
    exclusive_hold: bool | None = None  # CUDA: did the hold fill every SM
    kept: list[int] = field(default_factory=list)  # calls whose outputs were kept to verify

    @classmethod
    def from_wire(cls, data: object) -> Samples:
        """Samples from a worker's dict; BadSamples unless it is what the stopwatch sends."""
        if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in _LISTS):
            raise BadSamples("the worker sent no sample lists")
        ms = data["ms"]
        if not ms or not all(type(v) is float and math.isfinite(v) and v > 0 for v in ms):
            raise BadSamples("the worker sent no valid timings")
        if any(len(data[k]) != len(ms) for k in _LISTS):
            raise BadSamples("the worker's sample lists differ in length")
        if not all(type(v) is float and math.isfinite(v)
                   for k in ("after_ms", "idle_ms", "host_ms") for v in data[k]):
            raise BadSamples("the worker sent invalid device-busy or host times")
        try:
            return build(cls, data, "samples")
        except ProtocolError as exc:
            raise BadSamples(str(exc)) from None


@dataclass(frozen=True)
class WorkerError:
    """An exception raised in the worker, as text: the trusted side reads it."""

    stage: str  # import, init, run, benchmark, copy bandwidth
    type: str  # module.QualifiedName
    message: str
    traceback: str = ""


@dataclass(frozen=True)
class KeptOutput:
    """A kept output of a timed call: the parent draws the same inputs from ``seed``."""

    call: int
    seed: int
    outputs: list[Leaf] | None  # the leaves; None when the call returned something else
    structure: str  # kbench.shared.outputs.flatten's, or the type returned
    norm: float | None  # its fingerprint when the call returned (None: not taken)


@dataclass(frozen=True)
class KernelRun:
    """A GPU kernel a profiled call ran: its name as the profiler gives it, its device time,
    and the profiler op that was innermost when it was launched ("" where none was: a launch
    from the submission's own code, not through one of torch's operators)."""

    name: str
    us: float
    op: str


# -- answers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failed:
    """The request raised; what was raised, as text."""

    error: WorkerError


@dataclass(frozen=True)
class Loaded:
    weights: list[WeightPrint] = field(default_factory=list)  # of the model built, if any


@dataclass(frozen=True)
class Ran:
    """The output of one call, as leaves, and a copy of them taken as the call returned (the
    parent judges the copy and later compares the output with it)."""

    outputs: list[Leaf]  # the worker's own tensors, shared: it can still write them
    returned: list[Leaf]  # copies made the moment the call returned
    structure: str  # kbench.shared.outputs.flatten's
    aliases_input: bool


@dataclass(frozen=True)
class Unsupported:
    output_type: str  # what the call returned instead of tensors or numbers: a wrong output


@dataclass(frozen=True)
class Timed:
    samples: Samples


@dataclass(frozen=True)
class TrialTimes:
    """Each trial's time in ms, timed as KernelBench's evaluator times (TimeTrials)."""

    ms: list[float]


@dataclass(frozen=True)
class Prepared:
    """Input sets are ready for a clocked pass of this many calls."""

    calls: int


@dataclass(frozen=True)
class ClockedPass:
    calls: int
    kept: list[int]
    waited_ms: float = 0.0  # device time of an empty pass's waits (Clocked.wait_ms), by events


@dataclass(frozen=True)
class KeptOutputs:
    """The kept outputs asked for (every other kept output is dropped), each shared with
    the parent and alive until the next request."""

    outputs: list[KeptOutput]


@dataclass(frozen=True)
class Profiled:
    kernels: list[KernelRun]


@dataclass(frozen=True)
class Released:
    pass


# -- requests --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    answers: ClassVar[tuple[type, ...]] = (Loaded,)
    path: str
    module_name: str
    class_name: str
    device: str
    reference: str  # the task's reference file: the worker draws timing inputs with it
    model: ModelSpec | None  # build this instance now (None: import only)
    eval_mode: bool = False  # the task's mode: models stay in training mode unless eval
    compile: bool = False
    # The submission's module starts with the reference's module-level names, as it would
    # where KernelBench runs the problem and the submission in one namespace.
    shared_names: bool = False


@dataclass(frozen=True)
class Run:
    answers: ClassVar[tuple[type, ...]] = (Ran, Unsupported)
    inputs: list[Any]
    model: ModelSpec


@dataclass(frozen=True)
class Drawn:
    """A request whose input sets the worker draws itself, each from a fresh secret seed: the
    parent sends sizes, never values."""

    params: dict[str, int]
    dtype: str
    distribution: str  # the task's first: what its inputs look like (kbench.shared.inputs.draw)
    model: ModelSpec


@dataclass(frozen=True)
class Time(Drawn):
    """One round of the stopwatch on one case."""

    answers: ClassVar[tuple[type, ...]] = (Timed,)
    timing: TimingSettings
    keep: bool = False  # hold some outputs for Outputs


@dataclass(frozen=True)
class Prepare(Drawn):
    """Draw the input sets a Clocked pass of ``calls`` calls will rotate over."""

    answers: ClassVar[tuple[type, ...]] = (Prepared,)
    calls: int


@dataclass(frozen=True)
class TimeTrials(Drawn):
    """For its speedup beside kbench's: ``warmup`` synchronised calls, then ``trials`` on one
    input set between two CUDA events (wall clock on a CPU), synchronised after; no hold,
    flush or rotation; fewer past ``budget_ms`` where given (kbench.worker.trials)."""

    answers: ClassVar[tuple[type, ...]] = (TrialTimes,)
    warmup: int
    trials: int
    budget_ms: float | None = None


@dataclass(frozen=True)
class Clocked:
    answers: ClassVar[tuple[type, ...]] = (ClockedPass,)
    empty: bool  # the same loop with no call in it; on a GPU a device wait in each call's
    wait_ms: float = 0.0  # place, this long (kbench.worker.hold.DeviceWait)


@dataclass(frozen=True)
class Outputs:
    answers: ClassVar[tuple[type, ...]] = (KeptOutputs,)
    calls: list[int]


@dataclass(frozen=True)
class Profile(Drawn):
    """One call under torch's profiler."""

    answers: ClassVar[tuple[type, ...]] = (Profiled,)


@dataclass(frozen=True)
class Warm(Drawn):
    """One untimed call on a fresh input set, its memory given back: torch.compile compiles
    the model for the case (kbench.grading.timing.compiled); then calls for ``repeat_ms``, as
    a timed round warms up (kbench.worker.timing.warm_up), so that the process's first round
    of the case takes the short warm-up of a process that has timed it before."""

    answers: ClassVar[tuple[type, ...]] = (Released,)
    repeat_ms: float = 0.0


@dataclass(frozen=True)
class PrepareProfiler:
    """The profiler started and stopped with nothing to record, ahead of the profiled calls
    (kbench.grading.checking.custom_kernels): on an H100 the first profiled call in a process
    took 3.9 s, the next 5 ms."""

    answers: ClassVar[tuple[type, ...]] = (Released,)


@dataclass(frozen=True)
class Copy:
    answers: ClassVar[tuple[type, ...]] = (Timed,)
    nbytes: int
    timing: TimingSettings


@dataclass(frozen=True)
class Release:
    answers: ClassVar[tuple[type, ...]] = (Released,)


@dataclass(frozen=True)
class Exit:
    answers: ClassVar[tuple[type, ...]] = ()


Request = (Load | Run | Time | TimeTrials | Prepare | Clocked | Outputs | Profile | Warm
           | PrepareProfiler | Copy | Release | Exit)
Answer = (Failed | Loaded | Ran | Unsupported | Timed | TrialTimes | Prepared | ClockedPass
          | KeptOutputs | Profiled | Released)

REQUESTS = typing.get_args(Request)
_KINDS = {cls.__name__: cls for cls in REQUESTS + typing.get_args(Answer)}


# -- the wire --------------------------------------------------------------------------------


def encode(message: Request | Answer) -> dict:
    """The dict that crosses the channel. Tensors stay the very tensors (never copies: a
    kept output must reach the parent as the worker's own memory, shared)."""
    return {"v": VERSION, "kind": type(message).__name__, **plain(message)}


def decode(data: object, expected: tuple[type, ...]) -> Any:
    """The message in ``data`` if it is one of ``expected`` (Failed always is), every field
    of the type its annotation names; else ProtocolError saying what is wrong."""
    if type(data) is not dict:
        raise ProtocolError(f"a message is a dict, got {type(data).__name__}")
    version, kind = data.get("v"), data.get("kind")
    if type(version) is not int or version != VERSION:
        raise ProtocolError(f"protocol version {shown(version)}, expected {VERSION}")
    cls = _KINDS.get(kind) if type(kind) is str else None
    if cls is None or (cls not in expected and cls is not Failed):
        wanted = " or ".join(c.__name__ for c in expected)
        raise ProtocolError(f"a message of kind {shown(kind)}, expected {wanted}")
    body = {k: v for k, v in data.items() if k not in ("v", "kind")}
    return build(cls, body, cls.__name__)
