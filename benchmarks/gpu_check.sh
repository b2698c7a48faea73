#!/usr/bin/env bash
# Every GPU check in one command: build csrc for sm_90 (falling back to a pure-Python install if the build
# fails, so the Triton and torch backends are still measured), run the GPU tests (which also measure the
# trainer's memory per phase with and without state offload), run the loss benchmark (every backend vs
# naive, Liger-Kernel and three cuBLAS GEMMs), the dW-accumulation variants of the chunked backends, the
# policy's forward+backward with and without Liger's model kernels (sdpa / flash_attention_2), and print a
# short summary. Results land in $OUT (default /tmp/grpo_fast_gpu_check) as each phase ends, so a phase
# that runs out of time leaves the others' files.
#
#   OUT=results_dir bash benchmarks/gpu_check.sh            # on a CUDA machine, about 11 minutes at most
#   OUT=results_dir bash benchmarks/gpu_check.sh --dry-run  # any machine: every phase on CPU, tiny shapes
#
# The dry run executes each phase's command line on CPU (tiny shapes, no build, no nvidia-smi), so paths,
# imports and JSON writing are tested by CI. Without network access, the peers come from .wheels/ when
# wheels are there (`pip download --no-deps liger-kernel==0.8.5 trl==1.16.0 accelerate -d .wheels`;
# git-ignored); the benchmark's trl variant also needs datasets and pandas, else it reports its ImportError.
# Then: JSON results go under benchmarks/results/, headline numbers into README.md and benchmarks/NOTES.md.
# Per-phase limits (seconds): BUILD_TIMEOUT 150, TESTS_TIMEOUT 150, BENCH_TIMEOUT 150, DW_TIMEOUT 90,
# MODEL_TIMEOUT 120; SHAPES and REPEATS override the loss benchmark's.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY_RUN=0
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
OUT="${OUT:-/tmp/grpo_fast_gpu_check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export GRPO_FAST_GPU_OUT="$OUT"  # tests/trainer/test_offload_gpu.py writes offload_h200.json here
GPU_TESTS="tests/backends/test_native_gpu.py tests/backends/test_triton_gpu.py tests/trainer/test_offload_gpu.py
    tests/trainer/test_model_kernels.py"
if [ "$DRY_RUN" = 1 ]; then
    DEVICE=cpu DTYPE=fp32 SHAPES="${SHAPES:-256,64,512}" REPEATS="${REPEATS:-1}"
    DW_ARGS=(--shape 64,32,512 --repeats 1 --warmup 0)
    MODEL_ARGS=(--tiny --repeats 1)
else
    DEVICE=cuda DTYPE=bf16 SHAPES="${SHAPES:-4096,3584,152064 16384,3584,152064 65536,3584,152064}"
    REPEATS="${REPEATS:-3}"
    DW_ARGS=(--shape 16384,3584,152064 --repeats 5)
    MODEL_ARGS=(--repeats 5)
fi
start=$(date +%s)
stamp() { echo "[gpu_check +$(( $(date +%s) - start ))s] $*"; }

if [ "$DRY_RUN" = 1 ]; then
    echo "dry run on $(uname -m), no GPU" > "$OUT/gpu.txt"
else
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    if compgen -G ".wheels/*.whl" > /dev/null; then
        python3 -m pip install -q --no-deps .wheels/*.whl && stamp "installed $(ls .wheels)"
    fi
    stamp "building grpo_fast (csrc for TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
    if ! timeout "${BUILD_TIMEOUT:-150}" python3 -m pip install --no-deps --no-build-isolation -e . \
        > "$OUT/build.log" 2>&1; then
        stamp "build FAILED (tail of build.log below); installing without the extension"
        tail -25 "$OUT/build.log"
        GRPO_FAST_SKIP_EXT=1 timeout 120 python3 -m pip install --no-deps --no-build-isolation -e . \
            >> "$OUT/build.log" 2>&1 || stamp "pure-Python install FAILED too"
    fi
fi
python3 - "$DEVICE" <<'EOF' | tee "$OUT/backends.txt"
import sys, torch
from grpo_fast.backends import available_backends, get_backend
device = torch.device(sys.argv[1])
print("backends on", device.type, available_backends(device), "auto ->", get_backend("auto", device).name)
EOF

stamp "GPU tests"
# shellcheck disable=SC2086  # GPU_TESTS is a list of files
timeout "${TESTS_TIMEOUT:-150}" python3 -m pytest -q $GPU_TESTS -p no:cacheprovider --durations=10 \
    --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.log" 2>&1 || stamp "GPU tests: exit status $?"
tail -25 "$OUT/gpu_tests.log"
if [ "$DRY_RUN" = 1 ]; then
    python3 benchmarks/bench_offload.py --device cpu --tiny --out "$OUT/offload_dry_run.json" > "$OUT/offload.log" 2>&1 \
        || stamp "offload smoke test: exit status $?"
fi

stamp "loss benchmark ($DTYPE on $DEVICE)"
# shellcheck disable=SC2086  # SHAPES is a list of N,H,V words
timeout "${BENCH_TIMEOUT:-150}" python3 benchmarks/bench_loss.py --device "$DEVICE" --dtype "$DTYPE" --shapes $SHAPES \
    --repeats "$REPEATS" --out "$OUT/bench_loss_$DEVICE.json" > "$OUT/bench_loss.txt" 2>&1 \
    || stamp "loss benchmark: exit status $?"
tail -20 "$OUT/bench_loss.txt"

stamp "dW accumulation of the chunked backends (bf16 on $DEVICE)"
timeout "${DW_TIMEOUT:-90}" python3 benchmarks/bench_dw_accumulation.py --device "$DEVICE" "${DW_ARGS[@]}" \
    --out "$OUT/dw_accumulation_$DEVICE.json" > "$OUT/dw_accumulation.txt" 2>&1 \
    || stamp "dW accumulation benchmark: exit status $?"
tail -16 "$OUT/dw_accumulation.txt"

stamp "policy forward+backward with and without Liger's model kernels, sdpa / flash_attention_2 ($DEVICE)"
timeout "${MODEL_TIMEOUT:-120}" python3 benchmarks/bench_model_kernels.py --device "$DEVICE" "${MODEL_ARGS[@]}" \
    --out "$OUT/model_kernels_$DEVICE.json" > "$OUT/model_kernels.txt" 2>&1 \
    || stamp "model kernels benchmark: exit status $?"
tail -12 "$OUT/model_kernels.txt"

stamp "done; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
