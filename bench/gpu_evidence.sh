#!/usr/bin/env bash
# Issue 43's GPU evidence as steps of one device call each (at most ~540 s), sent back to back
# on one warm machine; the calls, their carry lists and expected times are in
# docs/evidence/README.md ("Issue 43: the GPU runs"). From the repository root:
#
#   bench/gpu_evidence.sh pack              # here, once: the DSL wheels, packed into .whl43/
#   bench/gpu_evidence.sh STEP [STEP ...]   # there: the steps in turn, each under its limit
#
# Steps (each writes STEP.log, and STEP.tgz or STEP.json where it has more, under $OUT):
#   kb-warm     warm, in the background, beside kb (its log: warm.log)
#   kb          KernelBench levels 1-3 at their own sizes, resumable: run it again (next call)
#               until its log says every problem has a verdict
#   tests-a     pytest: skeleton, GPU faults, side stream, graph timing, clocks, Triton
#   tests-b     pytest: custom-kernel share, TileLang, CuTe DSL (needs the DSL wheels)
#   bundled-cuda / bundled-dsl / bundled-baselines
#               pytest: one part of the bundled submissions each (bundled-dsl: the TileLang
#               and CuTe DSL l2norms at the full task's sizes; needs the DSL wheels)
#   warm        builds every CUDA C++ source the GPU tests build into $KBENCH_CACHE_DIR
#   par S@G ... on a host of several GPUs: steps side by side, step S on GPU G (or GPUs G,H,..)
#               and its share of the cores (every file they write in par.tgz; par.log says
#               how each ended); kb spreads its lanes over the GPUs it is given
#
# Every step first installs the carried wheels (.whl), kbench itself, and keeps any DSL wheel
# part carried in this call (.whl43/pN) in /tmp/whl43; once every part is there, the DSL
# packages are unpacked into /tmp/dsl and put on PYTHONPATH. The steps of one invocation share
# LIMIT_S seconds (default 540): each stops itself by then (kb's batches 60 s before).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
LIMIT_S=${LIMIT_S:-540}
export KBENCH_CACHE_DIR=${KBENCH_CACHE_DIR:-/tmp/kbc} PYTHONUNBUFFERED=1
WHEELS=/tmp/whl43 DSL=/tmp/dsl KBID=/tmp/kbid
START=$(date +%s)

# Seconds left of LIMIT_S, less $1, at least 1 (timeout 0 would mean no limit at all).
left() { local n=$((LIMIT_S - ($(date +%s) - START) - ${1:-0})); echo $((n > 1 ? n : 1)); }

pack() {  # here, with network: the DSL wheels for cp312 manylinux x86_64, as parts of 55 MiB
    local tmp=/tmp/pack43 platforms=""
    for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35; do platforms+=" --platform manylinux_${n}_x86_64"; done
    rm -rf "$tmp" .whl43 && mkdir -p "$tmp/wheels" .whl43
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp $platforms -d "$tmp/wheels" tilelang==0.1.15 \
        "apache-tvm-ffi==0.1.12" torch-c-dlpack-ext==0.1.5 z3-solver==4.15.4.0 \
        nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 || return 1
    python3 -m pip install -q --no-deps --no-compile --no-index --target "$tmp/site" \
        --python-version 3.12 --implementation cp $platforms --only-binary=:all: \
        "$tmp"/wheels/*.whl || return 1
    rm -rf "$tmp/site/bin"  # console scripts and z3's own binary: nothing here runs them
    tar -cf - -C "$tmp/site" . | xz -9 -T0 > "$tmp/dsl.tar.xz" || return 1
    local parts=$(( ($(stat -c %s "$tmp/dsl.tar.xz") + 52428799) / 52428800 ))  # 50 MiB at most
    (cd "$tmp" && split -n "$parts" -d dsl.tar.xz dsl.tar.xz.part \
        && sha256sum dsl.tar.xz.part* > dsl.sha256)
    local k=1
    for part in "$tmp"/dsl.tar.xz.part*; do
        mkdir -p ".whl43/p$k" && cp "$part" "$tmp/dsl.sha256" ".whl43/p$k/" && k=$((k + 1))
    done
    ls -l "$tmp"/wheels .whl43/*
}

setup() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
    python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
    mkdir -p "$WHEELS"
    for part in .whl43/p*/; do [ -d "$part" ] && cp -n "$part"* "$WHEELS"/; done
    if [ ! -e "$DSL/.done" ] && [ -e "$WHEELS/dsl.sha256" ] \
        && (cd "$WHEELS" && sha256sum --quiet -c dsl.sha256 >/dev/null 2>&1); then
        echo "unpacking the DSL wheels ($(cat "$WHEELS"/dsl.tar.xz.part* | wc -c) bytes)"
        rm -rf "$DSL" && mkdir -p "$DSL"
        # the parts, then any wheel carried beside them, unpacked as pip would lay them out
        if cat "$WHEELS"/dsl.tar.xz.part* | python3 -c "import sys, tarfile; \
tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('$DSL')"; then
            for wheel in "$WHEELS"/*.whl; do
                [ ! -e "$wheel" ] || python3 -m zipfile -e "$wheel" "$DSL" || exit 1
            done
            touch "$DSL/.done"
        fi
    fi
    if [ -e "$DSL/.done" ]; then
        export PYTHONPATH=/tmp/site:$DSL:$DSL/nvidia_cutlass_dsl/dsl_packages
    else
        echo "DSL wheels: parts here: $(ls "$WHEELS" 2>/dev/null | tr '\n' ' ')(not all yet)"
    fi
    python3 -c "import importlib.util as u; print('tilelang', bool(u.find_spec('tilelang')), \
'cutlass', bool(u.find_spec('cutlass')))"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    echo "cores $(nproc), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
}

warm() {  # every CUDA C++ build the GPU tests make, case 0 of a short task each
    local dir=/tmp/warm43
    rm -rf "$dir" && mkdir -p "$dir"
    python3 -m kbench new l2norm skeleton --dir "$dir" >/dev/null
    python3 - "$dir" <<'EOF'
import sys, yaml
raw = yaml.safe_load(open("tasks/l2norm.yaml"))
raw["limits"]["case_s"] = 10  # the hanging kernel's case
open(sys.argv[1] + "/l2norm.yaml", "w").write(yaml.safe_dump(raw))
EOF
    local files=(kbench/submissions/l2norm_v{1,3,4,5,6,7,8}.py tests/fixtures/gpu/l2norm_illegal_address.py
                 tests/fixtures/gpu/l2norm_kernel_hang.py "$dir/l2norm_skeleton.py")
    timeout -s INT -k 30 "$(left)" python3 -m kbench grade "${files[@]}" --task "$dir/l2norm.yaml" \
        --no-timing --case 0 --out "$dir/out" 2>&1 | grep -E "built|not built|^\[|kbench:"
}

kb() {  # KernelBench levels 1-3, own sizes; the verdicts so far in $KBID/identity.json
    mkdir -p "$KBID"
    [ -e "$KBID/identity.json" ] || [ ! -e .kbid/identity.json ] || cp .kbid/identity.json "$KBID/"
    local out="$KBID/out-$(date +%s)"
    python3 bench/kernelbench_identity.py .kbprob --levels 1 2 3 --device cuda --own-sizes \
        --shards "${KB_SHARDS:-6}" --batch "${KB_BATCH:-10}" ${KB_GPUS:+--gpus "$KB_GPUS"} \
        --deadline-s "$(left 60)" --results "$KBID/identity.json" --out "$out"
    cp "$KBID/identity.json" "$OUT/kb.json"
    tar -czf "$OUT/kb.tgz" -C "$out" --exclude='*.sqlite*' --exclude=index.html . 2>/dev/null
}

gpu_tests() {  # pytest on tests/test_gpu.py, tests named by -k "$2"; the reports in $OUT/$1.tgz
    local base=/tmp/pt-$1
    rm -rf "$base"
    timeout -s INT -k 30 "$(left 10)" python3 -m pytest -m gpu tests/test_gpu.py -v -s -rA \
        --durations=0 -p no:cacheprovider --basetemp="$base" -k "$2" --junitxml="$OUT/$1.xml"
    local code=$?
    (cd "$base" 2>/dev/null && find . \( -name results.json -o -name leaderboard.md \) -print0 \
        | tar -czf "$OUT/$1.tgz" --null -T -)
    return $code
}

par() {  # each "STEP@G[,H...]" on those GPUs and their cores, side by side; files in par.tgz
    local spec pids=() main=$OUT
    local per=$(($(nproc) / $(nvidia-smi -L | wc -l)))  # cores a GPU
    OUT=$main/par && mkdir -p "$OUT"
    for spec in "$@"; do
        (
            gpus=${spec#*@} cores=""
            for g in ${gpus//,/ }; do cores+="${cores:+,}$((g * per))-$((g * per + per - 1))"; done
            export CUDA_VISIBLE_DEVICES=$gpus KB_GPUS=$gpus
            taskset -cp "$cores" "$BASHPID" >/dev/null || python3 -c "import os; \
os.sched_setaffinity($BASHPID, [c for r in '$cores'.split(',') \
for a, b in [map(int, r.split('-'))] for c in range(a, b + 1)])" || exit 1
            run_step "${spec%@*}" >"$OUT/${spec%@*}.log" 2>&1
            echo "${spec%@*} on GPU(s) $gpus (cores $cores): exit $? after $(($(date +%s) - START)) s"
        ) &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
    tar -czf "$main/par.tgz" -C "$main" par && rm -rf "$OUT"
    OUT=$main
}

run_step() {
    case "$1" in
    warm) warm ;;
    kb) kb ;;
    kb-warm)
        warm >"$OUT/warm.log" 2>&1 &
        local builder=$!
        kb
        wait "$builder"
        echo "warm builds: $(grep -c built "$OUT/warm.log") line(s) in warm.log" ;;
    tests-a) gpu_tests tests-a "skeleton or faults or side_stream or graph_timing or clocks or triton_is" ;;
    tests-b) gpu_tests tests-b "custom_kernel_share or tilelang_graded or cute_dsl" ;;
    bundled-cuda | bundled-dsl | bundled-baselines)
        local part=${1#bundled-}
        [ "$part" = cuda ] || [ "$part" = dsl ] && part=l2norm_$part
        gpu_tests "$1" "bundled and $part" ;;
    par) shift; par "$@" ;;
    *) echo "unknown step $1 (see the top of $0)"; return 2 ;;
    esac
}

[ "${1:-}" = pack ] && { pack; exit $?; }
[ $# -gt 0 ] || { sed -n 2,26p "$0"; exit 2; }
mkdir -p "$OUT"
setup > >(tee "$OUT/setup.log") 2>&1  # not in a pipe: its exports stay in this shell
if [ "$1" = par ]; then
    run_step "$@" 2>&1 | tee "$OUT/par.log"
    exit "${PIPESTATUS[0]}"
fi
status=0
for step in "$@"; do
    start=$(date +%s)
    echo "== $step ($(date -u +%FT%TZ))"
    run_step "$step" 2>&1 | tee "$OUT/$step.log"
    code=${PIPESTATUS[0]}
    echo "== $step: exit $code after $(($(date +%s) - start)) s" | tee -a "$OUT/$step.log"
    [ "$code" = 0 ] || status=$code
done
exit $status
