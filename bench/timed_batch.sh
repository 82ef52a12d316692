#!/usr/bin/env bash
# Issue 39's runs on a GPU host, as steps of one device call each, sent back to back on one warm
# machine (state in /tmp/kb). From the repository root, with .whl, .whlkb, .lb (a
# KernelBenchLeaderboard checkout's docs/) and .kb (KernelBench's scripts/, src/) carried:
#
#   bench/timed_batch.sh cold [resume]  kbench on the first FIRST level-1 samples, --profile
#                                       quick, cold; again with "resume" until it has finished
#   bench/timed_batch.sh kb             then KernelBench's evaluator with timing on them, cold,
#                                       in a call of its own (a build it left killed would
#                                       hold torch's lock), and both tools' speedups compared
#   bench/timed_batch.sh again NAME [beside]
#                                       the same samples timed again (builds cached) into
#                                       /tmp/kb/NAME; "beside": while the level-2 samples are
#                                       built cold on every core (bench/build_cost.py, plain)
#   bench/timed_batch.sh compare A B    kbench compare of two of those runs
#   bench/timed_batch.sh load GPU...    two busy processes per core on every core, and on
#                                       each GPU given RUNS (1) grades of l2norm v3-v8 and the
#                                       forged-stopwatch fixtures, all at once (warm builds);
#                                       SIZES="16 16384 8192 8192" times only those sizes
#                                       (on an H200 the forged-stopwatch fixtures are caught at
#                                       8192x8192, not at 4096x4096: the clock's slack);
#                                       PHASES=idle,load each run idle first; each run's
#                                       results in $OUT/runs-gpuN/PHASE-RUN.json
#   bench/timed_batch.sh few PROBLEM... those level-1 problems' samples, --profile quick, cold,
#                                       on one GPU: where each timed sample's seconds went
#   bench/timed_batch.sh bundled PROFILE [CACHE]
#                                       the README's main command (kbench/submissions/) on the
#                                       GPUs visible, each line stamped with its second, into
#                                       $W/bundled-PROFILE; an empty build cache unless CACHE
#                                       names one an earlier step filled; then where each
#                                       submission's and each problem's seconds went
#   bench/timed_batch.sh base PROFILE [CACHE]
#                                       the same by an older tree, carried as .base (here:
#                                       mkdir .base && git archive REV kbench tasks | tar -x
#                                       -C .base), on CACHE's builds (default: bundled-PROFILE's),
#                                       into $W/base-PROFILE; then kbench compare of that run
#                                       and this tree's bundled-PROFILE
#   bench/timed_batch.sh idle           l2norm v3-v8 idle by this tree and by .base's (both
#                                       on their own l2norm task cut to SIZES), kbench compare
#   bench/timed_batch.sh starts         what one worker's start costs (bench/worker_start.py)
#   bench/timed_batch.sh builds SETTING...
#                                       bench/build_cost.py on the first BUILDS (16) level-1
#                                       samples, cold, at each MODE:AT_ONCE:JOBS SETTING
#                                       (plain:16:1 kbench:16:1 ...), figures after each
#   bench/timed_batch.sh serve-build    the first FIRST level-1 samples built once, cold
#                                       (--no-timing), into the serve steps' cache; again in the
#                                       next call where it ran out of time (--resume)
#   bench/timed_batch.sh serve [CLIENTS [grade]]
#                                       those builds (serve-build's, else made or finished first
#                                       in this call) sent to kbench serve by CLIENTS (8)
#                                       clients; with "grade" (the next call): kbench grade of
#                                       them on the same builds, compared; --profile quick
#                                       (bench/serve_batch.py)
#
# Each step stops itself within LIMIT_S (default 560) seconds and leaves its figures in $OUT;
# FIRST (default 100) sets how many of the level-1 samples, in the leaderboard's order.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out} LIMIT_S=${LIMIT_S:-560} W=/tmp/kb SEED=20261127 FIRST=${FIRST:-100}
START=$(date +%s)
left() { local n=$((LIMIT_S - ($(date +%s) - START) - ${1:-0})); echo $((n > 1 ? n : 1)); }
mkdir -p "$OUT" "$W"

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl $(ls .whlkb/*.whl | grep -v tabulate) || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/host.txt"
echo "cores $(nproc); torch $(python3 -c 'import torch; print(torch.__version__)'); commit \
$(git rev-parse --short HEAD 2>/dev/null || echo '(tree)')$(git diff --quiet HEAD 2>/dev/null \
|| echo ' with uncommitted changes')" >> "$OUT/host.txt"

batch() {  # real_batch.py over the first FIRST level-1 samples; $1: kbench's --out, rest: more
    local out=$1; shift
    python3 bench/real_batch.py --leaderboard .lb --work $W --out "$out" --levels 1 --first $FIRST \
        --deadline-s "$(left 20)" "$@"
}

stamped() {  # each line with the seconds since the step began
    python3 -u -c "import sys, time
start = time.time()
for line in sys.stdin:
    print(f'{time.time() - start:7.1f} {line}', end='', flush=True)"
}

laid_out() {  # those samples and their problems under $W, once
    [ -e $W/subs ] || python3 bench/real_batch.py --leaderboard .lb --work $W --levels 1 \
        --first $FIRST --layout-only > /dev/null
}

sized_task() {  # $1's tasks/l2norm.yaml, cut to SIZES (pairs) under $2 where SIZES is set
    local tree=$1 dir=$2
    [ -n "${SIZES:-}" ] || { echo "$PWD/$tree/tasks/l2norm.yaml"; return; }
    mkdir -p "$dir"
    python3 -c "import sys, yaml; t = yaml.safe_load(open('$tree/tasks/l2norm.yaml'))
n = [int(v) for v in sys.argv[1].split()]
t['benchmarks']['cuda'] = [n[i:i + 2] for i in range(0, len(n), 2)]
yaml.safe_dump(t, open('$dir/l2norm.yaml', 'w'))" "$SIZES" || exit 1
    echo "$dir/l2norm.yaml"
}

serve_built() {  # the serve steps' builds (kbench grade --no-timing, cold; resumed where a
    # call before ran out of time), stopped $1 seconds before the step's limit
    local resume=(); [ -e $W/serve-built/kbench.sqlite3 ] && resume=(--resume)
    timeout "$(left "$1")" python3 -m kbench grade $W/subs --task $W/problems --no-timing \
        --cache-dir $W/serve-cache --out $W/serve-built "${resume[@]}" 2>&1 | stamped \
        >> "$OUT/serve-built.log"
    tail -4 "$OUT/serve-built.log"
}

case "${1:-}" in
cold)
    laid_out
    [ -e $W/base.json ] || python3 bench/kb_baseline.py .kb $W/problems/level1 --level 1 \
        --out $W/base.json 2>&1 | tail -25 | tee "$OUT/baseline.log"
    cp $W/base.json "$OUT/"
    resume=(); [ "${2:-}" = resume ] && resume=(--resume)
    batch $W/cold --json "$OUT/real.json" -- --profile quick --seed $SEED "${resume[@]}" \
        > "$OUT/cold.log" 2>&1
    tail -40 "$OUT/cold.log"
    cp $W/cold/results.json "$OUT/cold-results.json" 2>/dev/null
    ;;
kb)
    batch $W/cold --kernelbench .kb --kb-baseline $W/base.json --json "$OUT/real-kb.json" \
        -- --profile quick --seed $SEED --resume > "$OUT/kb.log" 2>&1
    grep -v "^\[\|nvcc\|ninja\|c++ \|warning" "$OUT/kb.log" | tail -60
    cp $W/kernelbench/runs/rb_level1/eval_results.json "$OUT/kb-eval.json" 2>/dev/null
    cp $W/cold/results.json "$OUT/cold-results.json" 2>/dev/null
    ;;
again)
    name=$2 bg=""
    if [ "${3:-}" = beside ]; then
        python3 bench/real_batch.py --leaderboard .lb --work /tmp/kb2 --levels 2 --layout-only \
            > /dev/null
        rm -rf /tmp/bc-beside
        setsid python3 bench/build_cost.py /tmp/kb2/subs --concurrency "$(nproc)" --jobs 2 \
            --mode plain --cache /tmp/bc-beside > "$OUT/beside-builds.log" 2>&1 &
        bg=$!
        sleep 20  # the compilers are running before the timing starts
    fi
    batch $W/$name --json "$OUT/$name.json" -- --profile quick --seed $SEED \
        --cache-dir $W/kbench-cache > "$OUT/$name.log" 2>&1
    [ -n "$bg" ] && { kill -- -"$bg" 2>/dev/null; tail -3 "$OUT/beside-builds.log"; }
    tail -30 "$OUT/$name.log"
    cp $W/$name/results.json "$OUT/$name-results.json" 2>/dev/null
    ;;
compare)
    python3 -m kbench compare $W/$2 $W/$3 2>&1 | tee "$OUT/compare-$2-$3.txt" | tail -60
    ;;
few)
    shift
    laid_out
    t0=$(date +%s)
    timeout "$(left 15)" python3 -m kbench grade "${@/#/$W/subs/level1/}" --task $W/problems \
        --profile quick --seed $SEED --cache-dir $W/few-cache --out $W/few > "$OUT/few.log" 2>&1
    tail -25 "$OUT/few.log"
    cp $W/few/results.json "$OUT/few-results.json" || exit 1
    python3 -c "import json, statistics, sys; sys.path.insert(0, 'bench')
from real_batch import timing_cost
subs = json.load(open(sys.argv[1]))['submissions']
print(*timing_cost(subs, float(sys.argv[2]), 1), sep='\n')
stages = {k for s in subs for k in s.get('stage_s') or {}}
print('stages (mean s):', {k: round(statistics.fmean(s['stage_s'][k] for s in subs
      if k in (s.get('stage_s') or {})), 2) for k in sorted(stages)})" \
        "$OUT/few-results.json" $(( $(date +%s) - t0 ))
    ;;
bundled)
    profile=${2:-full} cache=$W/cache-${3:-bundled-$2}
    [ -n "${3:-}" ] || rm -rf "$cache"
    rm -rf $W/bundled-$profile
    timeout "$(left 15)" python3 -m kbench grade kbench/submissions/ --profile "$profile" \
        --cache-dir "$cache" --out $W/bundled-$profile 2>&1 | stamped > "$OUT/bundled-$profile.log"
    grep -v "^ *[0-9.]* |" "$OUT/bundled-$profile.log" | tail -25
    cp $W/bundled-$profile/results.json "$OUT/bundled-$profile.json" || exit 1
    python3 -c "import json, statistics, sys
run = json.load(open(sys.argv[1]))
for p in run['problems']:
    print(p['name'], p.get('stage_s'))
timed = [s for s in run['submissions'] if 'timing' in s.get('stage_s', {})]
for s in run['submissions']:
    print(s['name'], s['status'], s.get('stage_s'), s.get('timing_s'))
print('timing per timed submission: median', statistics.median(s['stage_s']['timing'] for s in timed),
      'mean', round(statistics.fmean(s['stage_s']['timing'] for s in timed), 2), 'of', len(timed))" \
        "$OUT/bundled-$profile.json"
    ;;
base)
    profile=${2:-quick} cache=$W/cache-${3:-bundled-$2}
    rm -rf $W/base-$profile
    (cd .base && PYTHONPATH=$PWD:${PYTHONPATH:-} timeout "$(left 15)" python3 -m kbench grade \
        kbench/submissions/ --profile "$profile" --cache-dir "$cache" --out $W/base-$profile) \
        2>&1 | stamped > "$OUT/base-$profile.log"
    grep -v "^ *[0-9.]* |" "$OUT/base-$profile.log" | tail -25
    cp $W/base-$profile/results.json "$OUT/base-$profile.json" || exit 1
    python3 -m kbench compare $W/base-$profile/results.json $W/bundled-$profile/results.json \
        2>&1 | tee "$OUT/compare-base-$profile.txt" | tail -40
    ;;
builds)
    shift
    laid_out
    timeout "$(left 10)" python3 bench/build_cost.py $W/subs/level1 --first "${BUILDS:-16}" \
        --settings "$@" --cache /tmp/bc-cache --json "$OUT/build_cost.json" 2>&1 \
        | tee "$OUT/build_cost.log" | grep -v "^  [0-9]*/"
    ;;
starts)
    python3 bench/worker_start.py --device cuda --json "$OUT/starts.json"
    ;;
serve-build)
    laid_out
    serve_built 10
    ;;
serve)
    # sent by CLIENTS clients to kbench serve and kept (this call), on serve-build's builds
    # (made first here where that step did not run); "grade" as $3: kbench grade of them on
    # those builds, compared (the next call, on the same warm machine); both --profile quick
    laid_out
    args=($W/subs --task $W/problems --out $W/serve --clients "${2:-8}" --cache-dir $W/serve-cache)
    if [ "${3:-}" = grade ]; then
        timeout "$(left 10)" python3 bench/serve_batch.py "${args[@]}" --only grade \
            -- --profile quick 2>&1 | tee "$OUT/serve.txt"
        cp $W/serve/serve_batch.json "$OUT/"; tail -30 $W/serve/grade.log > "$OUT/grade-tail.log"
    else
        rm -rf $W/serve
        serve_built 240  # with serve-build's finished: its results reused, seconds
        timeout "$(left 10)" python3 bench/serve_batch.py "${args[@]}" --only serve \
            -- --profile quick 2>&1 | tee "$OUT/serve.txt"
        cp $W/serve/serve_sent.json "$OUT/"; tail -30 $W/serve/serve.log > "$OUT/serve-tail.log"
    fi
    ;;
idle)
    # l2norm v3-v8 idle, by this tree and then by .base's on its own l2norm task, both cut to
    # SIZES, same seed, each on builds of its own (CACHE: this tree's); then kbench compare
    for tree in . .base; do
        name=$([ $tree = . ] && echo tree || echo base)
        task=$(sized_task $tree $W/idle-$name) cache=$W/idle-cache-$name
        [ $tree = . ] && cache=${CACHE:-$cache}  # CACHE: this tree's builds from an earlier step
        (cd $tree && PYTHONPATH=$PWD:${PYTHONPATH:-} timeout "$(left 15)" python3 -m kbench \
            grade "$OLDPWD"/kbench/submissions/l2norm_v[3-8].py --task "$task" --profile quick \
            --seed $SEED --cache-dir $cache --out $W/idle-$name) \
            2>&1 | stamped > "$OUT/idle-$name.log"
        tail -12 "$OUT/idle-$name.log"
        cp $W/idle-$name/results.json "$OUT/idle-$name.json" || exit 1
    done
    python3 -m kbench compare $W/idle-base/results.json $W/idle-tree/results.json 2>&1 \
        | tee "$OUT/compare-idle.txt" | tail -30
    ;;
load)
    shift
    task=$(sized_task . $W/sizes)
    files=(kbench/submissions/l2norm_v[3-8].py tests/fixtures/cpu_timing/l2norm_tampers_stopwatch.py
           tests/fixtures/cpu_timing/l2norm_pads_empty_pass.py tests/fixtures/gpu_timing/*.py)
    cache=${CACHE:-/tmp/ulc}  # CACHE: an earlier step's build cache (l2norm v3-v8 built there)
    timeout "$(left 400)" python3 -m kbench grade "${files[@]}" --task $task --no-timing \
        --cache-dir "$cache" --out /tmp/ulc-warm > "$OUT/load-warm.log" 2>&1
    busy=$(( 2 * $(nproc) / $# ))
    for gpu in "$@"; do
        CUDA_VISIBLE_DEVICES=$gpu timeout "$(left 15)" python3 bench/under_load.py "${files[@]}" \
            --device cuda --runs "${RUNS:-1}" --phases "${PHASES:-load}" --busy $busy \
            --keep "$OUT/runs-gpu$gpu" -- --task $task \
            --profile quick \
            --cache-dir "$cache" > "$OUT/load-gpu$gpu.log" 2>&1 &
    done
    wait
    tail -n 25 "$OUT"/load-gpu*.log
    ;;
*)
    echo "usage: $0 cold [resume] | kb | again NAME [beside] | compare A B | load GPU... |" \
        "few PROBLEM... | bundled PROFILE [CACHE] | base PROFILE [CACHE] | idle |" \
        "builds SETTING... | starts | serve-build | serve [CLIENTS [grade]]" >&2
    exit 2
    ;;
esac
