"""The interface every backend implements."""

from __future__ import annotations

from pathlib import Path

from kbench.host.toolchain import Toolchain
from kbench.results.verdict import Verdict


class Backend:
    name = "?"
    jit = False  # compiles at a kernel's first launch (kbench.grading.building.build warms it)

    def claims(self, source: str) -> bool:
        """Is this submission (its source text, never imported here) written for me?"""
        raise NotImplementedError

    def unavailable(self, toolchain: Toolchain, environment_problem: str | None,
                    source: str = "") -> Verdict | None:
        """Why it cannot be built on this machine at all (checked before building)."""
        return None

    def cannot_run(self, device: str, toolchain: Toolchain) -> Verdict | None:
        """Why, built, it cannot run on ``device``."""
        return None

    def unbuilt(self, device: str, toolchain: Toolchain, source: str) -> Verdict | None:
        """Its verdict without a build, where building it here costs much and could end in
        no other verdict than one it has already (it cannot run here); None: build it."""
        return None

    def env(self, toolchain: Toolchain, folder: Path, cores: int) -> dict[str, str]:
        """What its build and its worker process add to the environment: its own build
        folder (content-addressed, see kbench.host.build_dirs) and the cores a build may use. The
        toolchain's variables too: a C++ extension compiles with the same compiler set-up."""
        return {**toolchain.env(), "TORCH_EXTENSIONS_DIR": str(folder), "MAX_JOBS": str(cores)}
