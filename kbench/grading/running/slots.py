"""Every GPU of a host: one evaluation slot per device, each a process of kbench's own (trusted)
that sees only its GPU (``CUDA_VISIBLE_DEVICES``), screens its problems, times its own
reference workers and drift check there, and builds with its share of the host's cores. The
driver hands out units (kbench.grading.running.units) as builds come out and slots come free,
a problem's to the slot that holds it open, and alone writes the store.

A slot process reads one unit per line on stdin (or ``{"finish": true}``: close the problems it
holds open) and writes one event per line on stdout (kbench.grading.running.units.Event), ending
each with ``{"done": true}``; whatever else it prints goes to stderr."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, replace

import psutil

from kbench.grading.building import hostsplit
from kbench.grading.building.pipeline import Pipeline
from kbench.grading.context import Say
from kbench.grading.jobs import Job, Sink
from kbench.grading.options import Device, Options, OptionsError
from kbench.grading.running import units
from kbench.grading.running.dispatch import Dispatch, key_of
from kbench.grading.running.local import LocalExecutor
from kbench.host import interrupt, proctree, spawn

_RETRIES = 1  # a unit whose slot died is given to a slot once more, then infrastructure_error
_EXIT_WAIT_S = 5.0  # a slot process whose event stream ended is given this long to exit


@dataclass(frozen=True)
class SlotSpec:
    name: str  # "gpu 3", "cpu 1": how lines and reasons name it
    gpu: str | None  # what CUDA_VISIBLE_DEVICES says in its processes; None for a CPU slot


def specs(device: Device, gpus: list[str] | None, cpu_slots: int) -> list[SlotSpec]:
    """The slots a run uses: the GPUs named (as torch numbers the visible ones), else every
    visible one; ``cpu_slots`` on CPU. OptionsError for a GPU that is not there."""
    if device is Device.CPU:
        if gpus is not None:
            raise OptionsError("--gpus: grading on CPU (use --slots for CPU slots)")
        return [SlotSpec(f"cpu {i}", None) for i in range(cpu_slots)]
    import torch

    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")][:count] if visible else \
        [str(i) for i in range(count)]
    chosen = range(count) if gpus is None else gpus
    wrong = [g for g in chosen if not str(g).isdigit() or int(g) >= count]
    if wrong or not chosen:
        raise OptionsError(f"--gpus {','.join(map(str, chosen))}: expected GPU numbers "
                           f"from 0 to {count - 1}, comma-separated")
    return [SlotSpec(f"gpu {g}", ids[int(g)]) for g in dict.fromkeys(map(str, chosen))]


class SlotsExecutor:
    """Several slots on this host, fed units as the host's build pipeline finishes them."""

    def __init__(self, options: Options, slots: list[SlotSpec], say: Say = lambda line: None
                 ) -> None:
        self.options, self.slots, self.say = options, slots, say
        self.notes: list[str] = []  # what the run's reports say about the grading itself
        self.local = LocalExecutor(options, say)  # the machine's description and checks
        self.split = hostsplit.plan(len(slots), options.device, options.jobs)

    def watch_store(self, presence: object) -> None:
        """The store's presence is held by this process; the slots hold their own."""

    def environment(self) -> dict:
        env = self.local.environment()
        env["slots"] = [s.name for s in self.slots]
        env["host_split"] = self.split.to_dict()
        return env

    def run(self, jobs: list[Job], sink: Sink) -> None:
        env_problem, cores = self.local.environment_problem, self.split.cores_per_build()
        deliver = units.Delivery(sink, self.say)
        # Largest problems first: their builds come out first, and a long problem started
        # last would leave the other slots idle while it runs.
        groups: dict[tuple[str, str], list[Job]] = {}
        for job in jobs:
            groups.setdefault(key_of(job), []).append(job)
        ordered = [j for group in sorted(groups.values(), key=len, reverse=True) for j in group]
        template = units.Unit([], env_problem, cores, 0,
                              tuple(dict.fromkeys(job.task for job in jobs)),
                              tuple(job.path for job in jobs), spare=self.split.build
                              if self.split.split else ())
        with Pipeline(self.options, self.local.toolchain, env_problem, self.split,
                      self.say) as pipeline:
            pipeline.start(ordered)
            self.say(f"grading on {len(self.slots)} slot(s): "
                     f"{', '.join(s.name for s in self.slots)}; each submission handed out as "
                     "soon as its build is done, a problem's to the slot that holds it open")
            work = Dispatch(ordered, pipeline, template)
            self._serve_all(work, deliver, self.slots)
            pipeline.finish()
            again = pipeline.suspects() + deliver.deferred
            if again:
                self.say(f"grading {len(again)} submission(s) again, on one slot alone, now "
                         "that the builds are done")
                builds = {**pipeline.built(), **pipeline.settle()}
                final = replace(template, jobs=again, number=work.count, final=True, built={
                    j.path: builds[j.path] for j in again if builds.get(j.path)})
                self._serve_all(Dispatch.given([final]), deliver, self.slots[:1])
        self.say("note: the slots shared the output folder and the build cache, so writes "
                 "there could not be told from a submission's and went unchecked (kbench's "
                 "code, the problems and each submission's own file stayed watched)")

    def _serve_all(self, work: Dispatch, deliver: units.Delivery, slots: list[SlotSpec]
                   ) -> None:
        outbox: queue.Queue[tuple[str, int, units.Event | None]] = queue.Queue()
        for k, slot in enumerate(slots):
            threading.Thread(target=self._serve, args=(slot, self.split.timing[k], work, outbox),
                             daemon=True).start()
        running = len(slots)
        try:
            while running:  # this thread alone passes events on: the store has one writer
                where, number, event = outbox.get()
                if event is None:
                    running -= 1
                else:
                    deliver(event, where, where)  # each slot times its own reference
        except interrupt.Interrupted:  # what the slots finished before they stopped is kept
            _drain(outbox, deliver, running)
            raise
        for unit, _ in work.left():  # every slot's process failed to start: nothing guessed
            for result in units.lost(unit.jobs, "no slot was left to grade it"):
                deliver(units.Event(result=result), "driver", unit.number)

    def _serve(self, slot: SlotSpec, cpus: tuple[int, ...], work: Dispatch,
               outbox: queue.Queue) -> None:
        """One slot: units as they are ready until none is left, through one process kept
        for as long as it lives (on ``cpus``), then the problems it holds open closed; its
        events into ``outbox``, then None."""
        process: subprocess.Popen | None = None
        try:
            while True:
                if process is None or process.poll() is not None:
                    # Before the next unit is taken: taking it marks its problem held here.
                    work.forget(slot.name)  # a new process holds no problem open
                    process = None
                if (taken := work.get(slot.name)) is None:
                    break
                unit, tries = taken
                if process is None:
                    try:
                        process = _start(slot, cpus)
                    except OSError as exc:  # this slot cannot run: its unit goes back
                        outbox.put((slot.name, unit.number,
                                    units.Event(say=f"cannot start: {exc}")))
                        work.put(unit, tries)
                        process = None
                        break
                left, broke = self._unit(process, unit, outbox, slot)
                if not left:
                    continue
                if interrupt.requested():  # told to stop: its jobs are left for --resume
                    break
                self._lost(slot, unit, tries, left, f"its slot ({slot.name}) process "
                           f"{_ended(process)}{broke}", work, outbox)
            if process is not None and process.poll() is None and not interrupt.requested():
                self._unit(process, None, outbox, slot)  # its open problems closed
        finally:
            if process is not None:
                with contextlib.suppress(OSError):
                    process.stdin.close()
                process.wait()
                interrupt.drop_child(process.pid)
            outbox.put((slot.name, -1, None))

    @staticmethod
    def _lost(slot: SlotSpec, unit: units.Unit, tries: int, left: list[Job], why: str,
              work: Dispatch, outbox: queue.Queue) -> None:
        """Jobs a slot's process left without a result: given out once more, then
        infrastructure_error."""
        if swept := proctree.sweep_abandoned():
            outbox.put((slot.name, unit.number, units.Event(
                say=f"killed {len(swept)} process(es) its lost slot left")))
        if tries < _RETRIES:
            outbox.put((slot.name, unit.number, units.Event(
                say=f"lost {len(left)} job(s): {why}; queued again")))
            work.put(unit.rest(left), tries + 1)
        else:
            for result in units.lost(left, why):
                outbox.put((slot.name, unit.number, units.Event(result=result)))

    @staticmethod
    def _unit(process: subprocess.Popen, unit: units.Unit | None, outbox: queue.Queue,
              slot: SlotSpec) -> tuple[list[Job], str]:
        """Send ``unit`` (None: close what the slot holds open), pass its events on; the jobs
        left without a result, and what broke the stream where it was not the process's end
        (else empty)."""
        left = {job.name: job for job in unit.jobs} if unit else {}
        number = unit.number if unit else -1
        broke = ""
        try:
            process.stdin.write(json.dumps(unit.to_dict() if unit else {"finish": True}) + "\n")
            process.stdin.flush()
            for line in process.stdout:
                event = units.Event.from_dict(json.loads(line))
                if event.done:
                    break
                if event.result is not None:
                    left.pop(event.result.name, None)
                elif event.defer is not None:
                    left.pop(event.defer.name, None)
                outbox.put((slot.name, number, event))
        except Exception as exc:  # the process went, or its stream broke: its jobs are left
            broke = f" ({type(exc).__name__}: {str(exc)[:160]})"
        return list(left.values()), broke


def _ended(process: subprocess.Popen) -> str:
    """How a slot's process whose events stopped ended: by itself (its exit status, given a
    few seconds to exit), or killed here because it lived on without answering."""
    try:
        return f"ended (exit status {process.wait(timeout=_EXIT_WAIT_S)})"
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return "stopped sending events and was killed"


def _drain(outbox: queue.Queue, deliver: units.Delivery, running: int, wait_s: float = 10.0
           ) -> None:
    """After kbench's stop: the events of slots that are ending (told to stop), until each
    slot's thread has said it is done or ``wait_s`` has passed."""
    with contextlib.suppress(queue.Empty):
        while running:
            where, number, event = outbox.get(timeout=wait_s)
            if event is None:
                running -= 1
            else:
                deliver(event, where, where)


def _start(slot: SlotSpec, cpus: tuple[int, ...]) -> subprocess.Popen:
    """A slot process, in a session of its own (a terminal's Ctrl-C reaches the driver alone,
    which stops the slots itself)."""
    interrupt.check()
    env = dict(os.environ)
    if slot.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = slot.gpu
    process = subprocess.Popen([sys.executable, "-m", "kbench.grading.running.slots",
                                str(os.getpid())],
                               env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               bufsize=1, start_new_session=True)
    spawn.own(process.pid)
    interrupt.add_child(process.pid)
    if cpus:  # the slot's grading processes, every worker it starts included
        with contextlib.suppress(psutil.Error, OSError):
            psutil.Process(process.pid).cpu_affinity(list(cpus))
    return process


def main(driver: int) -> int:
    """A slot process: units in, events out, on the one stream the driver reads. It stops
    as kbench does (kbench.host.interrupt) when the driver says so or dies, even by kill -9:
    what it was grading is not reported, and its workers' process groups are killed."""
    interrupt.install((signal.SIGTERM, signal.SIGINT), announce=False)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != driver:  # the driver died before that took effect
        return 1
    events = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # nothing else may write to the events' stream
    sys.stdout = sys.stderr

    def emit(event: units.Event) -> None:
        events.write(json.dumps(event.to_dict()) + "\n")

    try:
        for line in sys.stdin:
            data = json.loads(line)
            if data.get("finish"):
                units.finish(emit)
            else:
                units.run(units.Unit.from_dict(data), emit)
            emit(units.Event(done=True))
    except interrupt.Interrupted as stopped:
        return 128 + stopped.signum
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
