"""What a user asked of a grading run, as typed values checked once, here."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from enum import Enum
from pathlib import Path

from kbench.results.modes import (
    DEFAULT_PROFILE,
    DEFAULT_RULES,
    DEFAULT_TIMING,
    Profile,
    Rules,
    TimingMode,
)


class Device(str, Enum):
    CPU = "cpu"
    CUDA = "cuda"


@dataclass(frozen=True)
class Rigour:
    """How much timing evidence a profile gathers (correctness is the same in every one)."""

    rounds: int  # turns per case with the reference, in the submission's own process
    fresh_rounds: int  # turns for launch-bound cases, each in new processes on both sides
    share: float  # of the task's min/max samples and time budget
    target_ci: float  # times the task's target interval
    compile_baseline: bool  # time torch.compile of the reference too
    kernels: bool  # profile what ran for the custom-kernel share (always under the policy)
    # KernelBench-style trials stop at the profile's time budget per case and side (else
    # KernelBench's 100, however long they take)
    budgeted_trials: bool


# On an H200, five grades' speedups at 16x16384 spread 6 % with all rounds in one process,
# 3.8 % with 3 fresh-process rounds and 3.0 % with 8 (docs/timing.md): quick keeps 3. The
# custom-kernel share's profile took 6 of a quick sample's 26 GPU-slot seconds in a batch of
# real samples on 4 H100s (docs/evidence/h100x4-2026-11-27-timed-batch): quick leaves it to
# --require-custom-kernels. KernelBench's 100 trials of a slow kernel were a quarter of a quick
# batch's GPU-slot time on one H200 (71 of 270 s over 40 level-1 samples, 15 s for one
# sample's 125 ms calls: docs/evidence/h200-2026-12-04b-issue52): quick stops them at its
# time budget, ten trials at least.
RIGOUR = {Profile.FULL: Rigour(rounds=3, fresh_rounds=8, share=1.0, target_ci=1.0,
                               compile_baseline=True, kernels=True, budgeted_trials=False),
          Profile.QUICK: Rigour(rounds=2, fresh_rounds=3, share=0.4, target_ci=2.0,
                                compile_baseline=False, kernels=False, budgeted_trials=True)}


def profile_text(profile: str) -> str:
    """What a timing profile gathered, for the reports' headers."""
    try:
        r = RIGOUR[Profile(profile)]
    except ValueError:  # written by a kbench with other profiles
        return "unknown"
    return (f"{r.rounds} rounds per size alternating with the reference, {r.fresh_rounds} "
            f"fresh-process rounds for launch-bound sizes, {r.share:.0%} of the task's samples "
            "and time budget" + ("" if r.compile_baseline else ", no torch.compile baseline")
            + ("" if r.kernels else ", no custom-kernel share unless required")
            + (", KernelBench-style trials within that time budget" if r.budgeted_trials
               else ""))


class OptionsError(ValueError):
    """Settings that cannot go together; the message names the option."""


@dataclass(frozen=True)
class Options:
    """The one form of what the user asked, from the command line to a slot (serialised only
    where it crosses into a slot process or a Ray task). Each option's default is its field's,
    here and nowhere else (the modes' in kbench.results.modes, where stored runs read them)."""

    device: Device
    out_dir: Path
    cache_dir: Path
    jobs: int | None  # builds at a time (--build-jobs; None: one per build core)
    seed: int
    case_indices: list[int] | None = None  # only these cases, and no timing
    cuda_arch: str | None = None
    timing: TimingMode = DEFAULT_TIMING
    untimed: bool = False  # correctness only (--no-timing)
    cores: int | None = None  # host cores this process's builds share (None: all of them)
    profile: Profile = DEFAULT_PROFILE
    require_custom_kernels: bool = False  # flag what runs mostly library kernels (CUDA)
    rules: Rules = DEFAULT_RULES
    # The tolerance under KernelBench's rules (None: KernelBench's own for the dtype).
    atol: float | None = None
    rtol: float | None = None
    include_degenerate: bool = False  # degenerate problems count in fast_p and the geomean
    pch: bool = False  # kbench's precompiled torch header for C++ builds (kbench.host.pch)
    # Build also what cannot run on this device (CUDA code on a machine without a GPU): its
    # build errors are found; it is skipped all the same. Off: nvcc's minutes are not spent
    # on a verdict of skipped.
    build_all: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "device", Device(self.device))
        except ValueError:
            raise OptionsError(f"--device {self.device}: expected cpu or cuda") from None
        try:
            object.__setattr__(self, "timing", TimingMode(self.timing))
        except ValueError:
            raise OptionsError(f"--timing {self.timing}: expected eager or graph") from None
        try:
            object.__setattr__(self, "profile", Profile(self.profile))
        except ValueError:
            raise OptionsError(f"--profile {self.profile}: expected full or quick") from None
        try:
            object.__setattr__(self, "rules", Rules(self.rules))
        except ValueError:
            raise OptionsError(f"--rules {self.rules}: expected kbench or kernelbench") from None
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 1:
                raise OptionsError(f"--{name} {value}: expected a tolerance from 0 to 1")
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        object.__setattr__(self, "cache_dir", Path(self.cache_dir))
        if self.jobs is not None and self.jobs < 1:
            raise OptionsError(f"--build-jobs {self.jobs}: expected at least 1")
        if self.cores is not None and self.cores < 1:
            raise OptionsError(f"cores {self.cores}: expected at least 1")
        if self.timing is TimingMode.GRAPH and self.device is not Device.CUDA:
            raise OptionsError("--timing graph: CUDA graphs need --device cuda")
        if self.require_custom_kernels and self.device is not Device.CUDA:
            raise OptionsError("--require-custom-kernels: what ran is profiled on a GPU; "
                               "it needs --device cuda")

    @property
    def rigour(self) -> Rigour:
        return RIGOUR[self.profile]

    @property
    def timed(self) -> bool:
        return self.case_indices is None and not self.untimed

    @property
    def profiles_kernels(self) -> bool:
        """Whether what ran on the GPU is profiled: for the report's custom-kernel share (a
        timed run whose profile includes it) or for the policy that needs it."""
        return self.device is Device.CUDA and (
            self.require_custom_kernels or self.timed and self.rigour.kernels)

    def reuse_key(self) -> dict:
        """What a stored result must have been graded under to stand for this run's (besides
        the same file, problem, kbench and machine software: kbench.results.store.reusable)."""
        return self._stored(REUSE_KEY)

    def resumable(self) -> dict:
        """What ``--resume`` must repeat besides the seed: stored with the run."""
        return self._stored(RESUMED)

    @classmethod
    def unrecorded(cls) -> dict:
        """What a run stored with no value for an option was graded under: its default (a
        kbench from before the option existed did what the default does)."""
        return {f.name: _plain(f.default) for f in fields(cls) if f.name in RESUMED
                and f.default is not MISSING}

    def _stored(self, names: tuple[str, ...]) -> dict:
        data = self.to_dict()
        return {name: data[name] for name in names}

    def to_dict(self) -> dict:
        """Plain JSON values, for a slot process or a Ray task (``from_dict`` on the other
        side) and for the store."""
        return {name: _plain(value) for name, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> Options:
        """From ``to_dict``, or what a user or a stored run gave: an option left out takes
        its default."""
        return cls(**data)


# A stored result stands for a new one only where these were the same (with the same file,
# problem, kbench and machine software); --resume repeats them and the rest of RESUMED.
REUSE_KEY = ("case_indices", "untimed", "timing", "profile", "require_custom_kernels", "rules",
             "atol", "rtol", "build_all")
RESUMED = ("device", "cuda_arch", *REUSE_KEY, "include_degenerate")


def _plain(value: object) -> object:
    return value.value if isinstance(value, Enum) else \
        str(value) if isinstance(value, Path) else value


def default(name: str) -> str:
    """An option's default as the command line spells it (for its help)."""
    value = next(f.default for f in fields(Options) if f.name == name)
    return str(_plain(value))
