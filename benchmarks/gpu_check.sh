#!/usr/bin/env bash
# GPU bring-up in one command of at most BUDGET_S=480 seconds, the headline numbers first. Every phase runs under
# its own limit (and never past the total), so a phase that overruns costs only its own results. The limits add
# up to 450 s; the first run's times (H200, 2026-12-04) and why its last phases overran are in benchmarks/NOTES.md:
#
#   phase          limit s  what
#   machine           15    nvidia-smi; the peers' wheels from .wheels/ and a pure-Python install of grpo_fast; then
#                           the csrc extension builds for sm_90 in the background (its own limit: BUILD_LIMIT_S=240)
#   gate              35    one correctness gate at a real shape: Triton vs torch, H=3584 V=152064, bf16
#   loss             125    the loss benchmark at the Qwen2.5-7B and Llama-3.1-8B lm_heads, N = 4096 and 16384:
#                           gemm3 (three cuBLAS GEMMs), triton, torch, naive, trl (TRL 1.16's fused head and loss), liger
#   cuda              35    the build awaited and checked (CUDA kernels in grpo_fast._C, else the phase fails), then
#                           the `cuda` backend on the same shapes
#   n65536            40    the loss benchmark at N = 65536 (Qwen2.5-7B): gemm3, triton, cuda; 2 timed runs each
#   gpu_tests         50    the remaining GPU tests (the native backend's first)
#   dw                20    dW accumulation of the chunked backends, isolated (no fwd+bwd steps)
#   step              45    a random-init Qwen2.5-0.5B training step (bench_offload.py): memory per phase with and
#                           without offloading the trainer state (no whole steps: their generation does not fit)
#   trl_step          55    TRL's fused head against grpo_fast's fused loss inside TRL's GRPO step, the same 0.5B model
#   model_kernels     30    the policy's forward+backward with and without Liger's model kernels, 2 timed runs each
#
# Phases run only when ONLY names them (the second, short check of the first run's misses, 195 s with the machine):
#   profile           70    benchmarks/gpu_profile.py at Qwen2.5-7B, N=16384, bf16: device-to-device bandwidth, then
#                           gemm3, triton, torch and trl timed and under torch.profiler (kernels by kind, the GPU's busy
#                           share), the compiled Triton kernels' registers / spills / shared memory
#   native            35    the build awaited and checked; tests/backends/test_native_gpu.py case by case, with a
#                           native backtrace (file, function, line) if anything crashes
#   profile_cuda      25    gpu_profile.py's cuda part (after the build), into the same JSON
#   liger             50    the loss benchmark at Qwen2.5-7B N=16384: gemm3, cuda, liger (its torch.compile included)
#
# $OUT (default /tmp/grpo_fast_gpu_check) gets at most 8 files, none below it: gpu_check.log (all text, appended as
# it goes) and at most 6 JSON files, each rewritten after every measurement so that a kill keeps what finished:
# summary.json (machine, install, build, every phase's limit, seconds and exit status), bench_loss_<dev>.json,
# trainer_step_<dev>.json, trl_step_<dev>.json, dw_accumulation_<dev>.json, model_kernels_<dev>.json; the ONLY
# phases write profile_<dev>.json and bench_loss_<dev>.json (<dev>: cuda; cpu in a dry run). The exit status is 1
# when a phase failed or the budget was broken.
#
# On a machine with an NVIDIA GPU (the peers' wheels from .wheels/ when there is no package index: bash
# scripts/gpu_wheels.sh where there is one; the colocated vLLM path is measured by a training run instead):
#   GRPO_FAST_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_check.sh
# The short second check of a full run's misses (the ONLY phases, 195 s):
#   ONLY="profile native profile_cuda liger" BUDGET_S=195 GRPO_FAST_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_check.sh
# Anywhere, every phase on CPU with tiny shapes and the budget checked (CI: tests/bench/test_gpu_check.py):
#   OUT=/tmp/check bash benchmarks/gpu_check.sh --dry-run
# Only the budget (the phase limits, and the files already in $OUT), nothing run:
#   OUT=/tmp/check bash benchmarks/gpu_check.sh --check-budget
# ONLY="cuda n65536" runs the machine phase and those phases alone (a second, shorter call); BUDGET_S lowers the total.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-run}"
case "$MODE" in
run | --dry-run | --check-budget) ;;
*)
    echo "gpu_check: unknown argument $MODE (expected none, --dry-run or --check-budget)" >&2
    exit 2
    ;;
esac
DRY_RUN=0
SLACK=1
if [ "$MODE" = --dry-run ]; then
    DRY_RUN=1
    SLACK=3 # CPUs are slower: a dry run's phases get 3x their limits (the declared ones must still fit BUDGET_S)
fi
OUT="${OUT:-/tmp/grpo_fast_gpu_check}"
BUDGET_S="${BUDGET_S:-480}"
BUILD_LIMIT_S="${BUILD_LIMIT_S:-240}"
PHASES="machine:15 gate:35 loss:125 cuda:35 n65536:40 gpu_tests:50 dw:20 step:45 trl_step:55 model_kernels:30"
ON_DEMAND="profile:70 native:35 profile_cuda:25 liger:50" # run only when ONLY names them
START=$(date +%s)

runs() { # whether phase $1 is part of this run: the machine always, others as ONLY says (every one of PHASES without it)
    [ "$1" = machine ] && return 0
    if [ -n "${ONLY:-}" ]; then [[ " $ONLY " == *" $1 "* ]]; else [[ " $PHASES " == *" $1:"* ]]; fi
}

check_budget() { # at most 8 files, 6 of them JSON, none below $OUT; the limits of the phases run and the time within BUDGET_S
    local files json deep limits=0 elapsed=$(($(date +%s) - START)) problems=()
    files=$(find "$OUT" -type f | wc -l)
    json=$(find "$OUT" -type f -name '*.json' | wc -l)
    deep=$(find "$OUT" -mindepth 2 -type f | wc -l)
    for p in $PHASES $ON_DEMAND; do runs "${p%%:*}" && limits=$((limits + ${p##*:})); done
    ((files <= 8)) || problems+=("$files files in $OUT (at most 8 come back)")
    ((json <= 6)) || problems+=("$json JSON files (at most 6)")
    ((deep == 0)) || problems+=("$deep files below $OUT")
    ((limits <= BUDGET_S)) || problems+=("the phase limits add up to ${limits}s > ${BUDGET_S}s")
    ((elapsed <= SLACK * BUDGET_S)) || problems+=("${elapsed}s elapsed > $((SLACK * BUDGET_S))s")
    if ((${#problems[@]})); then
        echo "BUDGET BROKEN: ${problems[*]}"
        return 1
    fi
    echo "budget kept: $files files ($json JSON) in $OUT, phase limits ${limits}s, ${elapsed}s of $((SLACK * BUDGET_S))s"
}

if [ "$MODE" = --check-budget ]; then
    mkdir -p "$OUT"
    check_budget
    exit
fi
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: >"$LOG"
WORK="$(mktemp -d)" # phase table, facts, build log: scratch, not results
trap 'rm -rf "$WORK"' EXIT
export OUT WORK DRY_RUN LOG BUILD_LIMIT_S
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore TRL_EXPERIMENTAL_SILENCE=1
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
if [ "$DRY_RUN" = 1 ]; then
    export DEV=cpu TRITON_INTERPRET=1 # the triton rows run through the interpreter
else
    export DEV=cuda
fi

log() { echo "[gpu_check +$(($(date +%s) - START))s] $*" | tee -a "$LOG"; }
fact() { printf '%s\t%s\n' "$1" "$2" >>"$WORK/facts.tsv"; } # KEY VALUE: a line of summary.json's "facts"
export -f fact

limit_of() { for p in $PHASES $ON_DEMAND; do [ "${p%%:*}" = "$1" ] && echo "${p##*:}"; done; }

write_summary() {
    python3 - "$WORK" "$OUT/summary.json" "$BUDGET_S" "$DRY_RUN" "$(($(date +%s) - START))" <<'EOF'
import json, os, sys
work, path, budget, dry_run, elapsed = sys.argv[1:]
def commit():  # as the benchmarks' stamps: git's, else GRPO_FAST_COMMIT (a copy of the tree without .git)
    try:
        from grpo_fast.machine import git_commit
        return git_commit()
    except ImportError:
        return os.environ.get("GRPO_FAST_COMMIT")
def rows(name, keys):
    try:
        return [dict(zip(keys, line.rstrip("\n").split("\t", len(keys) - 1))) for line in open(f"{work}/{name}")]
    except FileNotFoundError:
        return []
facts = {r["key"]: r["value"] for r in rows("facts.tsv", ("key", "value"))}
phases = [r | {k: int(r[k]) for k in ("limit_s", "seconds")} for r in rows("phases.tsv", ("phase", "limit_s", "seconds", "status"))]
summary = {"check": "gpu_check", "dry_run": dry_run == "1", "budget_s": int(budget), "elapsed_s": int(elapsed),
           "limit_slack": 3 if dry_run == "1" else 1,
           "commit": commit(), "facts": facts, "phases": phases}
with open(path + ".tmp", "w") as f:
    json.dump(summary, f, indent=1)
os.replace(path + ".tmp", path)
EOF
}

# phase NAME FUNCTION: FUNCTION in a child bash under min(NAME's limit, what is left of BUDGET_S), its output
# appended to the log; PHASE_LIMIT tells it its limit. What must outlive it goes to $WORK/env (sourced after).
phase() {
    local name=$1 body=$2 limit left t0 status
    if ! runs "$name"; then # a phase of the full run left out by ONLY is listed; an on-demand one is not
        [[ " $PHASES " == *" $name:"* ]] && printf '%s\t0\t0\tnot run (ONLY)\n' "$name" >>"$WORK/phases.tsv"
        return
    fi
    limit=$((SLACK * $(limit_of "$name")))
    left=$((SLACK * BUDGET_S - ($(date +%s) - START)))
    ((limit > left)) && limit=$left
    if ((limit < 5)); then
        log "$name: not run, ${left}s left of $((SLACK * BUDGET_S))s"
        printf '%s\t%s\t0\tnot run (budget)\n' "$name" "$(limit_of "$name")" >>"$WORK/phases.tsv"
        write_summary
        return
    fi
    log "$name (limit ${limit}s)"
    t0=$(date +%s)
    PHASE_LIMIT=$((limit - 3)) timeout --kill-after=3 $((limit - 3)) bash -c "$body" 2>&1 | tee -a "$LOG"
    status=${PIPESTATUS[0]}
    [ "$status" = 124 ] && status="timed out"
    printf '%s\t%s\t%s\t%s\n' "$name" "$(limit_of "$name")" "$(($(date +%s) - t0))" "$status" >>"$WORK/phases.tsv"
    [ -f "$WORK/env" ] && source "$WORK/env"
    write_summary
    log "$name: exit status $status after $(($(date +%s) - t0))s"
}

machine() {
    if [ "$DRY_RUN" = 1 ]; then
        uname -a && nproc && python3 --version
        fact machine "dry run: $(uname -m), $(nproc) CPUs, no GPU, no install, no build"
        echo "true" >"$WORK/build_cmd" # stands in for the build below
        return
    fi
    nvidia-smi || return 1
    fact gpu "$(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader)"
    fact nvcc "$(nvcc --version | tail -1)"
    fact python "$(python3 --version)"
    if compgen -G ".wheels/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .wheels/*.whl &&
            echo "export PYTHONPATH=/tmp/site\${PYTHONPATH:+:\$PYTHONPATH}" >>"$WORK/env" &&
            fact wheels "$(cd .wheels && ls *.whl | tr '\n' ' ')"
    else
        fact wheels "none in .wheels/ (scripts/gpu_wheels.sh): liger and trl rows need them installed already"
    fi
    if GRPO_FAST_SKIP_EXT=1 python3 -m pip install -q --no-deps --no-build-isolation -e .; then
        fact install "pip install -e . (pure Python)"
    else
        ln -sfn ../kernels grpo_fast/kernels
        echo "export PYTHONPATH=$PWD\${PYTHONPATH:+:\$PYTHONPATH}" >>"$WORK/env"
        fact install "pip install -e . failed: PYTHONPATH=$PWD, grpo_fast/kernels -> ../kernels"
    fi
    echo "GRPO_FAST_REQUIRE_CUDA=1 MAX_JOBS=6 python3 setup.py build_ext --inplace" >"$WORK/build_cmd"
}

gate() {
    python3 -m pytest -q -p no:cacheprovider tests/backends/test_triton_gpu.py::test_grpo_loss_triton_vs_torch_real_shape
}

bench_loss() { # the loss benchmark into bench_loss_$DEV.json (merged after the first call), no PNG
    python3 benchmarks/bench_loss.py --device "$DEV" --out "$OUT/bench_loss_$DEV.json" --no-png \
        --time-limit "$((PHASE_LIMIT - 5))" "$@"
}

loss() {
    if [ "$DRY_RUN" = 1 ]; then
        bench_loss --shapes 128,32,256 --repeats 1 --variants gemm3 triton torch naive trl liger
    else
        bench_loss --models qwen2.5-7b llama-3.1-8b --tokens 4096 16384 --repeats 5 --variant-timeout 60 \
            --variants gemm3 triton torch naive trl liger
    fi
}

await_build() { # wait for the background build; its log and result once; fails unless _C has its CUDA kernels
    while [ ! -f "$WORK/build_status" ]; do sleep 1; done
    local kind
    kind=$(grep -m1 'grpo_fast._C:' "$WORK/build.log")
    if [ ! -f "$WORK/build_reported" ]; then
        cat "$WORK/build.log"
        fact build "exit status $(cat "$WORK/build_status"); ${kind:-no extension built}"
        : >"$WORK/build_reported"
    fi
    [ "$DRY_RUN" = 1 ] && return
    if [ "$(cat "$WORK/build_status")" != 0 ] || [[ "$kind" != *"C++ + CUDA kernels"* ]]; then
        echo "ASSERTION: grpo_fast._C was not built with its CUDA kernels (see the build log above)"
        return 1
    fi
}

cuda() { # the build awaited and checked, then the cuda backend
    await_build || return 1
    if [ "$DRY_RUN" = 1 ]; then
        echo "dry run: no CUDA kernels to benchmark (the n65536 phase merges rows into the loss JSON)"
        return
    fi
    bench_loss --models qwen2.5-7b llama-3.1-8b --tokens 4096 16384 --repeats 5 --variants cuda --update
}

step() { # the offload round trips only: the whole steps' generation (transformers, 0.5B) does not fit the limit
    if [ "$DRY_RUN" = 1 ]; then
        python3 benchmarks/bench_offload.py --device cpu --tiny --steps 1 --out "$OUT/trainer_step_$DEV.json"
    else
        python3 benchmarks/bench_offload.py --device cuda --steps 0 --out "$OUT/trainer_step_$DEV.json"
    fi
}

trl_step() { # each variant is an interpreter of its own (imports, model, TRL's trainer, Triton compiles): two of them
    local out=(--out "$OUT/trl_step_$DEV.json")
    if [ "$DRY_RUN" = 1 ]; then
        python3 benchmarks/bench_trl_integration.py --device cpu --layers 1 --hidden 32 --heads 2 --kv-heads 1 \
            --intermediate 64 --vocab 512 --batch 2 --prompt-len 4 --completion-len 8 --repeats 1 --warmup 0 \
            --variants ours_loss "${out[@]}"
    else
        python3 benchmarks/bench_trl_integration.py --device cuda --dtype bf16 --preset qwen2.5-0.5b --batch 8 \
            --prompt-len 128 --completion-len 512 --repeats 2 --warmup 1 --variants trl ours_loss "${out[@]}"
    fi
}

n65536() {
    if [ "$DRY_RUN" = 1 ]; then
        bench_loss --shapes 256,32,256 --repeats 1 --variants gemm3 cpu --update
        return
    fi
    local variants=(gemm3 triton cuda) # cuda: a row saying so when the extension has no CUDA kernels
    bench_loss --models qwen2.5-7b --tokens 65536 --repeats 2 --variant-timeout 15 --variants "${variants[@]}" --update
}

gpu_tests() { # what the gate and the step phase ran already is left out
    python3 -m pytest -v -p no:cacheprovider -m gpu --durations=5 tests/backends/test_native_gpu.py \
        tests/backends/test_triton_gpu.py tests/trainer/test_offload_gpu.py tests/trainer/test_model_kernels.py \
        --deselect tests/backends/test_triton_gpu.py::test_grpo_loss_triton_vs_torch_real_shape \
        --deselect tests/trainer/test_offload_gpu.py::test_no_failures \
        --deselect tests/trainer/test_offload_gpu.py::test_round_trip_exact_and_memory_drops
}

dw() { # the isolated accumulation only: the fwd+bwd steps (backends x modes at the full shape) did not fit
    local shape=(--shape 16384,3584,152064 --repeats 2 --skip step)
    [ "$DRY_RUN" = 1 ] && shape=(--shape 64,32,512 --repeats 1 --warmup 0)
    python3 benchmarks/bench_dw_accumulation.py --device "$DEV" "${shape[@]}" --out "$OUT/dw_accumulation_$DEV.json"
}

model_kernels() {
    local size=(--repeats 2)
    [ "$DRY_RUN" = 1 ] && size=(--tiny --repeats 1)
    python3 benchmarks/bench_model_kernels.py --device "$DEV" "${size[@]}" --out "$OUT/model_kernels_$DEV.json"
}

gpu_profile() {
    local shape=(--model qwen2.5-7b --tokens 16384)
    [ "$DRY_RUN" = 1 ] && shape=(--shape 64,32,256 --repeats 1 --copy-gib 0.25)
    python3 benchmarks/gpu_profile.py --device "$DEV" "${shape[@]}" --out "$OUT/profile_$DEV.json" "$@"
}

profile() { # everything that needs no build, while it runs
    gpu_profile --parts bandwidth gemm3 triton torch trl
}

native() { # the native backend's GPU tests one by one, a native backtrace if one crashes (LD_PRELOAD'ed handler)
    await_build || return 1
    local tracer=() status compiler
    compiler=$(command -v gcc || command -v cc)
    if [ -n "$compiler" ] && "$compiler" -shared -fPIC -O1 -o "$WORK/segv_trace.so" -x c - -ldl <<'CEOF'; then
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
static void on_fault(int sig) { /* each frame: its object and offset in it, for addr2line */
    void *frames[64];
    int n = backtrace(frames, 64);
    for (int i = 0; i < n; ++i) {
        Dl_info info;
        if (dladdr(frames[i], &info) && info.dli_fname)
            fprintf(stderr, "NATIVE_FRAME %s 0x%lx %s\n", info.dli_fname,
                    (unsigned long)((char *)frames[i] - (char *)info.dli_fbase), info.dli_sname ? info.dli_sname : "?");
    }
    signal(sig, SIG_DFL);
    raise(sig);
}
__attribute__((constructor)) static void install(void) { signal(SIGSEGV, on_fault); signal(SIGBUS, on_fault); }
CEOF
        tracer=(env "LD_PRELOAD=$WORK/segv_trace.so")
    fi
    # pytest's faulthandler prints the Python frames first, then hands the signal on to this handler
    ${tracer[@]+"${tracer[@]}"} python3 -m pytest -v -p no:cacheprovider -m gpu tests/backends/test_native_gpu.py 2>&1 |
        tee "$WORK/native.log"
    status=${PIPESTATUS[0]}
    grep '^NATIVE_FRAME' "$WORK/native.log" | while read -r _ file offset symbol; do
        echo "frame: $(addr2line -f -C -i -e "$file" "$offset" 2>/dev/null | paste -sd' ') [$symbol in $file]"
    done | tee "$WORK/native_frames.txt"
    return "$status"
}

profile_cuda() {
    await_build || return 1
    if [ "$DRY_RUN" = 1 ]; then
        gpu_profile --parts cpu --update
    else
        gpu_profile --parts cuda --update
    fi
}

liger() { # Liger's Qwen N=16384 row (it died in torch.compile in the first run) against gemm3 and cuda, one run
    await_build || return 1
    if [ "$DRY_RUN" = 1 ]; then
        bench_loss --shapes 64,32,256 --repeats 1 --variants gemm3 cpu liger --update
    else
        bench_loss --models qwen2.5-7b --tokens 16384 --repeats 5 --variant-timeout 45 --variants gemm3 cuda liger \
            --update
    fi
}

export -f machine gate bench_loss loss await_build cuda step trl_step n65536 gpu_tests dw model_kernels
export -f gpu_profile profile native profile_cuda liger
log "gpu_check $([ "$DRY_RUN" = 1 ] && echo "dry run on CPU" || echo "on $(hostname)"), commit ${GRPO_FAST_COMMIT:-unknown}"
phase machine machine
# The extension builds while the gate and the loss benchmark run; the cuda phase waits for it.
(
    timeout "$BUILD_LIMIT_S" bash -c "$(cat "$WORK/build_cmd")" >"$WORK/build.log" 2>&1
    echo $? >"$WORK/build_status.tmp" && mv "$WORK/build_status.tmp" "$WORK/build_status" # whole, once there
) &
for name in gate loss cuda n65536 gpu_tests dw step trl_step model_kernels profile native profile_cuda liger; do
    phase "$name" "$name"
done
wait
# The headline, last: the loss table, the profile, the native tests' outcome (and a crash's frames), the phases.
[ -f "$OUT/bench_loss_$DEV.json" ] && python3 benchmarks/tables.py --show "$OUT/bench_loss_$DEV.json" 2>&1 | tee -a "$LOG"
[ -f "$OUT/profile_$DEV.json" ] && python3 benchmarks/gpu_profile.py --show "$OUT/profile_$DEV.json" 2>&1 | tee -a "$LOG"
if [ -f "$WORK/native.log" ]; then
    grep -E '^(FAILED|ERROR) |Fatal Python error|^=+ .*(passed|failed|error|skipped)' "$WORK/native.log" | tail -30 | tee -a "$LOG"
    [ -s "$WORK/native_frames.txt" ] && head -40 "$WORK/native_frames.txt" | tee -a "$LOG"
fi
awk -F'\t' '{printf "%-14s limit %4ss  ran %4ss  %s\n", $1, $2, $3, $4}' "$WORK/phases.tsv" | tee -a "$LOG"
budget=$(check_budget)
status=$?
log "$budget"
fact budget "$budget"
write_summary
((status == 0)) || exit 1
if awk -F'\t' '$4 != "0" && $4 != "not run (ONLY)" {failed = 1} END {exit !failed}' "$WORK/phases.tsv"; then
    log "a phase failed or did not run (see above)"
    exit 1
fi
