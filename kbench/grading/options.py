"""What a user asked of a grading run, as typed values checked once, here."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path


class Device(str, Enum):
    CPU = "cpu"
    CUDA = "cuda"


class TimingMode(str, Enum):
    EAGER = "eager"  # one call per sample, launch costs included
    GRAPH = "graph"  # CUDA-graph replays of many calls (kbench.worker.timing)


class OptionsError(ValueError):
    """Settings that cannot go together; the message names the option."""


@dataclass(frozen=True)
class Options:
    device: Device
    out_dir: Path
    cache_dir: Path
    jobs: int
    seed: int
    case_indices: list[int] | None = None  # only these cases, and no timing
    cuda_arch: str | None = None
    timing: TimingMode = TimingMode.EAGER
    untimed: bool = False  # correctness only (--no-timing)
    cores: int | None = None  # host cores this process's builds share (None: all of them)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "device", Device(self.device))
        except ValueError:
            raise OptionsError(f"--device {self.device}: expected cpu or cuda") from None
        try:
            object.__setattr__(self, "timing", TimingMode(self.timing))
        except ValueError:
            raise OptionsError(f"--timing {self.timing}: expected eager or graph") from None
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        object.__setattr__(self, "cache_dir", Path(self.cache_dir))
        if self.jobs < 1:
            raise OptionsError(f"--jobs {self.jobs}: expected at least 1")
        if self.cores is not None and self.cores < 1:
            raise OptionsError(f"cores {self.cores}: expected at least 1")
        if self.timing is TimingMode.GRAPH and self.device is not Device.CUDA:
            raise OptionsError("--timing graph: CUDA graphs need --device cuda")

    @property
    def timed(self) -> bool:
        return self.case_indices is None and not self.untimed

    def resumable(self) -> dict:
        """What ``--resume`` must repeat besides the seed."""
        return {"device": self.device.value, "case_indices": self.case_indices,
                "cuda_arch": self.cuda_arch, "timing": self.timing.value,
                "untimed": self.untimed}

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(device=self.device.value, timing=self.timing.value,
                    out_dir=str(self.out_dir), cache_dir=str(self.cache_dir))
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Options:
        return cls(**data)
