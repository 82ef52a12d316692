"""The command line's arguments for grading: `kbench grade`'s and `kbench serve`'s, which
share every setting a verdict or a figure depends on."""

from __future__ import annotations

import argparse
from pathlib import Path

from kbench.cli import grade_command, serve_command
from kbench.grading.options import Profile, Rules, TimingMode, default


def grade_parser(sub) -> None:
    parser = sub.add_parser("grade", help="build, check, time and rank submissions")
    parser.add_argument("paths", nargs="+", help="submission files, or folders of them (*.py)")
    grading_options(parser)
    parser.add_argument("--case", type=int, action="append", dest="cases", metavar="K",
                        help="run only correctness case K (repeatable) and skip timing; "
                        "with --seed this reproduces a reported failure")
    parser.add_argument("--include-degenerate", action="store_true",
                        help="count degenerate problems (output of rounding noise, constant, or "
                        "independent of its inputs or weights: graded all the same) in fast_p "
                        "and the geometric mean; by default they are counted apart")
    parser.add_argument("--leaderboard", action="store_true", help="print the whole "
                        "leaderboard at the end (it is written to leaderboard.md in any case; "
                        "printed anyway for several problems)")
    parser.add_argument("--resume", action="store_true", help="finish the newest interrupted "
                        "run of this task in --out: same seed and options, only what is missing")
    parser.add_argument("--force", action="store_true", help="grade again even files whose "
                        "result on this device and software is already stored")
    parser.set_defaults(handler=grade_command.grade)


def serve_parser(sub) -> None:
    parser = sub.add_parser("serve", help="grade candidates sent over HTTP (a reward function "
                            "for training loops and agents): POST /v1/jobs, GET /v1/jobs/ID")
    grading_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: "
                        "127.0.0.1; 0.0.0.0 for workers on other machines, behind TLS or on a "
                        "private network: the token travels in the clear)")
    parser.add_argument("--port", type=int, default=8707, help="port (default: 8707; 0: a "
                        "free one, printed)")
    parser.add_argument("--token-file", type=Path, help="a file holding the token clients "
                        "send as 'Authorization: Bearer TOKEN' (default: $KBENCH_SERVE_TOKEN; "
                        "without one, kbench serve does not start)")
    parser.add_argument("--max-source-kib", type=int, default=256, help="largest candidate "
                        "source accepted, in KiB (default: 256)")
    parser.add_argument("--per-client", type=int, default=64, help="candidates one client may "
                        "have waiting (default: 64); clients are served in turn")
    parser.add_argument("--batch", type=int, default=16, help="candidates built and graded "
                        "together, their builds side by side (default: 16)")
    parser.set_defaults(handler=serve_command.serve)


def grading_options(parser: argparse.ArgumentParser) -> None:
    """What the problems are, where and how they are graded."""
    parser.add_argument("--task", help="a task (name, YAML or KernelBench problem file) or a "
                        "folder of problems (default: the bundled tasks/, each submission "
                        "matched by its name's prefix, e.g. l2norm_v1.py -> l2norm)")
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        help="where to run (default: cuda when a GPU is visible, else cpu)")
    out_option(parser)
    parser.add_argument("--build-jobs", "--jobs", type=int, dest="jobs",
                        help="builds at a time, on one pool for the whole run (default: one per "
                        "core not kept for timing: an extension's .cu file compiles in one "
                        "serial nvcc chain, so a build keeps about one core busy)")
    parser.add_argument("--seed", type=int, help="run seed; shapes and values follow from it "
                        "(default: a fresh one, printed and recorded)")
    cache_option(parser)
    parser.add_argument("--cuda-arch", help="TORCH_CUDA_ARCH_LIST for builds (default: the GPU's, "
                        "else $TORCH_CUDA_ARCH_LIST, else 9.0)")
    parser.add_argument("--timing", choices=[m.value for m in TimingMode],
                        help="eager: one call per sample, launch overhead included; graph: "
                        "CUDA-graph replays of many calls on rotating inputs, the kernels alone "
                        f"(CUDA only). Default: {default('timing')}")
    parser.add_argument("--no-timing", action="store_true", help="check correctness only")
    parser.add_argument("--profile", choices=[p.value for p in Profile],
                        help="full: every round and sample the task asks for, and the "
                        "torch.compile baseline; quick: for screening thousands, fewer rounds, "
                        f"samples and fresh processes, the same correctness. Default: "
                        f"{default('profile')}")
    parser.add_argument("--require-custom-kernels", action="store_true",
                        help="flag a submission whose profiled GPU time is mostly torch's "
                        "library kernels (ATen, cuBLAS, cuDNN), or that launched none of its "
                        "own (CUDA only; the share is reported either way)")
    parser.add_argument("--rules", choices=[r.value for r in Rules],
                        help="whose correctness verdict ranks: kbench's (many sizes and draws, "
                        "float64 truth, cheat checks) or KernelBench's (the problem's own sizes "
                        "and get_inputs under its seeds, allclose, 5 trials; faster). "
                        "KernelBench problem files get both verdicts either way. Default: "
                        f"{default('rules')}")
    parser.add_argument("--atol", type=float, help="absolute tolerance under KernelBench's "
                        "rules (default: KernelBench's for the dtype: 1e-4 float32, 1e-2 "
                        "16-bit; its v0 used 1e-2)")
    parser.add_argument("--rtol", type=float, help="relative tolerance under KernelBench's "
                        "rules (default: as --atol)")
    parser.add_argument("--pch", action="store_true", help="build the C++ side of load_inline "
                        "with kbench's own precompiled torch header (the same binaries, less "
                        "compiler time where several submissions share flags; off by default "
                        "until measured on real CUDA batches: docs/scaling.md)")
    parser.add_argument("--build-all", action="store_true", help="build also what cannot run "
                        "on this device (CUDA code on a machine without a GPU), to find its "
                        "build errors: it is skipped all the same (default: not built)")
    parser.add_argument("--gpus", help="GPUs to grade on, one evaluation slot each, e.g. 0,3 "
                        "(default: every visible GPU)")
    parser.add_argument("--slots", type=int, default=1, help="evaluation slots with --device "
                        "cpu (default: 1)")
    parser.add_argument("--executor", choices=["local", "ray"], default="local",
                        help="local: this host's slots (default); ray: a Ray cluster, each "
                        "build a task on a node with CPUs (kbench_build nodes where any), each "
                        "unit a task holding a GPU (or a CPU)")
    parser.add_argument("--address", help="with --executor ray: the cluster's address (default: "
                        "$RAY_ADDRESS, else a Ray instance started on this host)")


def out_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path,
                        help="report folder (default: the checkout's reports/)")


def cache_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-dir", type=Path, help="build cache (default: "
                        "$KBENCH_CACHE_DIR or ~/.cache/kbench)")
