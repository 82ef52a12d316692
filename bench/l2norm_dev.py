"""Development helper for the l2norm_v4..v7 submissions (docs/l2norm-kernels.md).

    PYTHONPATH=. python bench/l2norm_dev.py --out /tmp/dev [--parts build,check,sweep]

build: compiles the submissions in parallel, each into the folder `kbench grade` would
use (same KBENCH_CACHE_DIR, toolchain and hash), so a grade afterwards does not compile again.
check: every launch path of v6 (forced with l2norm_config) and the automatic choice of v4-v7
on edge shapes, every dtype, strided and misaligned inputs, against float64.
sweep: times forced v6 configurations on the benchmark shapes (cold L2 before every call,
a spin kernel ahead of the start event as kbench does), next to eager F.normalize and
v4-v7 as shipped. These are quick single-process numbers to choose thresholds; the
numbers that count are kbench's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kbench.host.build_dirs import build_dir  # noqa: E402
from kbench.host.toolchain import find_toolchain  # noqa: E402
from kbench.reference.l2norm import make_inputs  # noqa: E402

SUBS = ["l2norm_v4", "l2norm_v5", "l2norm_v6", "l2norm_v7", "l2norm_v8"]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}


def log(*args) -> None:
    print(*args, flush=True)


def build_env(name: str) -> tuple[dict, Path]:
    tc = find_toolchain()
    cache = Path(os.environ.get("KBENCH_CACHE_DIR") or Path.home() / ".cache/kbench").resolve()
    src = ROOT / "kbench" / "submissions" / f"{name}.py"
    folder = build_dir(cache, src, tc)
    folder.mkdir(parents=True, exist_ok=True)
    return {**tc.env(), "TORCH_EXTENSIONS_DIR": str(folder)}, src


def load(name: str):
    env, src = build_env(name)
    os.environ.update(env)
    spec = importlib.util.spec_from_file_location(name, src)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_all(out: Path) -> None:
    procs = []
    for name in SUBS:
        logf = open(f"/tmp/build_{name}.log", "w")  # noqa: SIM115
        cmd = [sys.executable, __file__, "--build-one", name]
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
        procs.append((name, time.time(), logf, proc))
    for name, start, logf, p in procs:
        rc = p.wait()
        logf.close()
        log(f"build {name}: rc={rc} {time.time() - start:.0f}s")
        if rc:
            log(Path(f"/tmp/build_{name}.log").read_text()[-3000:])


# ---------------------------------------------------------------------------------------------
def reference(x: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    norm = x64.norm(dim=1, keepdim=True)
    return torch.where(norm > 0, x64 / norm, torch.zeros_like(x64))


def compare(y: torch.Tensor, x: torch.Tensor) -> str | None:
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != x.dtype:
        return f"bad output {type(y)} {getattr(y, 'shape', None)} {getattr(y, 'dtype', None)}"
    ref = reference(x)
    tol = TOL[x.dtype]
    rms = ref.pow(2).mean().sqrt() if ref.numel() else 0
    err = (y.double() - ref).abs()
    bound = tol * rms + tol * ref.abs()
    bad = ~(err <= bound)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        return (f"{int(bad.sum())} bad, first flat {i}: got {y.flatten()[i].item()} "
                f"want {ref.flatten()[i].item()}")
    return None


def variants(x: torch.Tensor):
    """(label, tensor) views of the same values with other layouts."""
    rows, dim = x.shape
    yield "contig", x
    for pad in (3, 4, 8):
        wide = torch.zeros(rows, dim + pad, dtype=x.dtype, device=x.device)
        wide[:, :dim] = x
        yield f"rowpad{pad}", wide[:, :dim]
    flat = torch.zeros(rows * dim + 1, dtype=x.dtype, device=x.device)
    flat[1:] = x.flatten()
    yield "offset1", flat[1:].view(rows, dim)
    yield "transposed", x.t().contiguous().t()
    yield "expanded", x[:1].expand(rows, dim)


def check(out: Path) -> None:
    mods = {}
    for name in SUBS:
        try:
            mods[name] = load(name)
        except Exception:
            log(f"load {name} FAILED\n{traceback.format_exc()}")
    failures = []
    count = 0
    dists = ["normal", "zero_rows", "row_scaled", "tiny", "large", "uniform"]
    shapes = [(1, 1), (1, 4096), (4096, 1), (7, 33), (5, 1023), (3, 1001), (16, 16384),
              (2, 100003), (1, 2), (3, 3), (17, 5), (130, 7), (64, 1024), (1000, 257),
              (33, 65535), (3, 131072), (1, 131071), (1, 1048576), (2, 1048573), (1, 9000001),
              (300, 20000), (4097, 4093)]
    dtypes = [torch.float32, torch.float16, torch.bfloat16]

    def run(tag, fn, x):
        nonlocal count
        count += 1
        try:
            y = fn(x)
            torch.cuda.synchronize()
            msg = compare(y, x)
        except Exception as exc:  # noqa: BLE001
            msg = f"raised {exc!r}"[:300]
        if msg and "co-resident" in msg:
            log(f"skip {tag}: {msg[:120]}")
            return
        if msg:
            failures.append(f"{tag}: {msg}")
            log(f"FAIL {tag}: {msg}")

    for si, shape in enumerate(shapes):
        for di, dtype in enumerate(dtypes):
            dist = dists[(si + di) % len(dists)]
            x = make_inputs(shape, str(dtype).split(".")[1], dist, 1000 + si, "cuda")[0]
            for name, m in mods.items():
                run(f"{name} {shape} {dtype} {dist}", m.l2norm.l2norm_forward, x)
            if "l2norm_v6" in mods and shape[0] * shape[1] <= 4_000_000:
                v6 = mods["l2norm_v6"].l2norm
                for label, xv in variants(x):
                    if label == "contig":
                        continue
                    for name, m in mods.items():
                        run(f"{name} {shape} {dtype} {label}", m.l2norm.l2norm_forward, xv)
    # float64 through the automatic choice
    for shape in [(5, 1023), (3, 100003), (4096, 1), (16, 16384), (1, 1048576)]:
        x = torch.randn(shape, dtype=torch.float64, device="cuda")
        for name, m in mods.items():
            run(f"{name} {shape} float64", m.l2norm.l2norm_forward, x)
    if "l2norm_v6" in mods:
        v6 = mods["l2norm_v6"].l2norm
        forced = []
        for lanes in (1, 2, 4, 8, 16, 32):
            for vecs in (4, 8):
                for shape in [(37, 5), (100, 63), (50, 257), (9, 1030), (4096, 1)]:
                    forced.append((shape, (0, 256, vecs, 1, lanes, 3)))
        for th in (128, 256, 512):
            for vecs in (4, 8):
                for splits in (1, 2, 3, 4, 8, 16):
                    for shape in [(5, 1023), (3, 100003), (7, 33), (2, 16384), (1, 1)]:
                        forced.append((shape, (1, th, vecs, splits, 1, 3)))
        for th, vecs in ((128, 4), (256, 8), (512, 8)):
            for splits in (1, 2, 5, 64, 300):
                for shape in [(1, 1048576), (3, 1001), (4, 70000)]:
                    forced.append((shape, (2, th, vecs, splits, 1, 3)))
        for flags in (0, 1, 2):
            forced.append(((3, 100003), (1, 256, 8, 4, 1, flags)))
            forced.append(((65, 1000), (0, 256, 8, 1, 32, flags)))
        for shape, cfg in forced:
            for dtype in dtypes:
                if shape[0] * shape[1] > 100_000 and dtype != torch.float32 and cfg[0] != 2:
                    continue
                x = make_inputs(shape, str(dtype).split(".")[1], "zero_rows" if shape[0] > 2
                                else "normal", 7, "cuda")[0]
                run(f"v6 forced {cfg} {shape} {dtype}", lambda t, c=cfg: v6.l2norm_config(t, *c), x)
                if cfg[0] == 1 and cfg[3] in (3, 8):
                    wide = torch.zeros(shape[0], shape[1] + 5, dtype=dtype, device="cuda")
                    wide[:, 1:shape[1] + 1] = x
                    run(f"v6 forced {cfg} {shape} {dtype} offset-view",
                        lambda t, c=cfg: v6.l2norm_config(t, *c), wide[:, 1:shape[1] + 1])
        for shape in [(16, 16384), (1, 1048576), (4096, 4096), (65536, 1024), (8192, 8192),
                      (32768, 65535), (4096, 1), (1, 9000001), (300, 20000), (7, 33)]:
            for dtype in dtypes:
                probe = torch.empty(1, shape[1], dtype=dtype, device="cuda").expand(*shape)
                log(f"choice {shape} {dtype}: {v6.l2norm_choice(probe)}")
    log(f"check: {count} runs, {len(failures)} failures")
    (out / "check.json").write_text(json.dumps({"runs": count, "failures": failures}, indent=1))


# ---------------------------------------------------------------------------------------------
class Timer:
    def __init__(self) -> None:
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.flush = torch.empty(2 * l2 // 4 + 1024, dtype=torch.float32, device="cuda")

    def median_ms(self, fn, x, reps: int) -> float:
        fn(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            self.flush.zero_()
            torch.cuda._sleep(100_000)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn(x)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        times.sort()
        return times[len(times) // 2]


def sweep(out: Path) -> None:
    mods = {name: load(name) for name in SUBS}
    v6 = mods["l2norm_v6"].l2norm
    timer = Timer()
    results = []
    # copy bandwidth, 1 GiB as kbench does (read + write counted)
    src = torch.empty(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    ms = timer.median_ms(dst.copy_, src, 20)
    copy_gbps = 2 * src.numel() * 4 / ms / 1e6
    log(f"copy: {ms:.4f} ms {copy_gbps:.0f} GB/s")
    del src, dst
    C = lambda *c: c  # noqa: E731  (mode, threads, vecs, splits, lanes, flags)
    plan = {
        (32768, 65535): [C(1, 512, 8, 4, 1, 3), C(1, 256, 8, 8, 1, 3), C(1, 512, 4, 8, 1, 3),
                         C(1, 128, 8, 16, 1, 3), C(1, 256, 4, 16, 1, 3),
                         C(1, 512, 8, 4, 1, 0), C(1, 512, 8, 4, 1, 1), C(1, 512, 8, 4, 1, 2),
                         C(1, 256, 8, 8, 1, 0)],
        (1, 1048576): [C(2, 256, 8, 128, 1, 3), C(2, 256, 4, 256, 1, 3), C(2, 128, 8, 256, 1, 3),
                       C(2, 128, 4, 512, 1, 3), C(2, 512, 8, 64, 1, 3), C(2, 512, 4, 132, 1, 3),
                       C(2, 256, 8, 256, 1, 3), C(2, 128, 4, 528, 1, 3),
                       C(1, 512, 8, 16, 1, 3)],
        (16, 16384): [C(1, 512, 8, 1, 1, 3), C(1, 128, 8, 4, 1, 3), C(1, 256, 4, 4, 1, 3),
                      C(1, 128, 4, 8, 1, 3), C(1, 128, 4, 16, 1, 3), C(2, 128, 4, 8, 1, 3),
                      C(2, 128, 4, 16, 1, 3), C(2, 128, 4, 32, 1, 3), C(1, 128, 4, 8, 1, 0)],
        (8192, 8192): [C(1, 256, 8, 1, 1, 3), C(1, 512, 4, 1, 1, 3), C(1, 128, 8, 2, 1, 3),
                       C(1, 256, 4, 2, 1, 3), C(1, 128, 4, 4, 1, 3), C(1, 256, 8, 1, 1, 0),
                       C(1, 256, 8, 1, 1, 1), C(1, 256, 8, 1, 1, 2)],
        (65536, 1024): [C(0, 256, 8, 1, 32, 3), C(1, 128, 4, 1, 1, 3), C(1, 128, 8, 1, 1, 3),
                        C(0, 256, 8, 1, 32, 0), C(0, 256, 8, 1, 32, 1), C(0, 256, 8, 1, 32, 2)],
        (4096, 4096): [C(1, 128, 8, 1, 1, 3), C(1, 256, 4, 1, 1, 3), C(1, 512, 4, 1, 1, 3),
                       C(1, 128, 4, 2, 1, 3), C(1, 128, 8, 1, 1, 0), C(1, 128, 8, 1, 1, 1),
                       C(1, 128, 8, 1, 1, 2)],
    }
    for shape, configs in plan.items():
        rows, dim = shape
        big = rows * dim > 100_000_000
        reps = 8 if big else 30
        x = torch.randn(shape, device="cuda")
        gb = 2 * x.numel() * 4 / 1e9

        def record(label, fn, x=x, reps=reps, gb=gb, shape=shape, rows=rows, dim=dim):
            try:
                ms = timer.median_ms(fn, x, reps)
                gbps = gb / ms * 1e3
                results.append({"shape": shape, "label": label, "ms": ms, "gbps": gbps,
                                "pct_copy": 100 * gbps / copy_gbps})
                log(f"{rows}x{dim} {label:40s} {ms:9.4f} ms {gbps:7.0f} GB/s "
                    f"{100 * gbps / copy_gbps:5.1f}%")
            except Exception as exc:  # noqa: BLE001
                log(f"{rows}x{dim} {label}: FAILED {exc!r}"[:400])

        record("eager F.normalize", lambda t: F.normalize(t, p=2.0, dim=1,
                                                          eps=torch.finfo(t.dtype).tiny))
        for name, m in mods.items():
            record(f"{name} auto", m.l2norm.l2norm_forward)
        log(f"   v6 auto choice: {v6.l2norm_choice(x)}")
        for cfg in configs:
            record(f"v6 {cfg}", lambda t, c=cfg: v6.l2norm_config(t, *c))
        del x
        torch.cuda.empty_cache()
    (out / "sweep.json").write_text(json.dumps({"copy_gbps": copy_gbps, "results": results},
                                               indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("/tmp/l2norm_dev"))
    ap.add_argument("--parts", default="build,check,sweep")
    ap.add_argument("--build-one")
    args = ap.parse_args()
    if args.build_one:
        load(args.build_one)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    log(torch.cuda.get_device_name(0), torch.__version__)
    for part, fn in (("build", build_all), ("check", check), ("sweep", sweep)):
        if part in parts:
            start = time.time()
            try:
                fn(args.out)
            except Exception:
                log(f"{part} FAILED\n{traceback.format_exc()}")
            log(f"== {part}: {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
