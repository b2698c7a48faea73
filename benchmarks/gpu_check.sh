#!/usr/bin/env bash
# Every GPU check in one command: build csrc for sm_90, run the GPU tests, run the loss benchmark
# (every backend vs naive, Liger-Kernel and three cuBLAS GEMMs) and, when present, the trainer's
# memory-offload check. Prints a short summary; results land in $OUT (default /tmp/grpo_fast_gpu_check).
#
#   OUT=results_dir bash benchmarks/gpu_check.sh
#
# Works without network access: liger-kernel, when not installed, is taken from .wheels/ if a wheel is
# there (`pip download --no-deps liger-kernel==0.8.5 -d .wheels` beforehand; .wheels/ is git-ignored).
# JSON results go under benchmarks/results/, headline numbers into README.md.
# Expected wall time on an H200 (an estimate; never run yet): build ~1-1.5 min (sm_90 only), GPU tests
# ~2-3 min (mostly first Triton compiles; the offload test writes offload_h200.json), loss benchmark
# ~1.5-2 min (3 repeats; naive at N=65536 is expected to report "out of memory"). Every phase has its own
# timeout so that one hang cannot stall the rest; REPEATS / SHAPES / *_TIMEOUT override.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/grpo_fast_gpu_check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
SHAPES="${SHAPES:-4096,3584,152064 16384,3584,152064 65536,3584,152064}"
REPEATS="${REPEATS:-3}"
export GRPO_FAST_GPU_OUT="$OUT"  # tests/trainer/test_offload_gpu.py writes its measurements here
start=$(date +%s)
stamp() { echo "[gpu_check +$(( $(date +%s) - start ))s] $*"; }

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if compgen -G ".wheels/*.whl" > /dev/null; then
    pip install -q --no-deps .wheels/*.whl && stamp "installed $(ls .wheels)"
fi

stamp "building grpo_fast (csrc for TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
if ! timeout "${BUILD_TIMEOUT:-180}" pip install --no-deps --no-build-isolation -e . > "$OUT/build.log" 2>&1; then
    stamp "build FAILED (tail of build.log):"; tail -25 "$OUT/build.log"
fi
python -c "import grpo_fast.backends as b, torch; print('backends on cuda:', b.available_backends(torch.device('cuda')))"

stamp "GPU tests"
timeout "${TESTS_TIMEOUT:-270}" python -m pytest -q -m gpu tests -p no:cacheprovider --durations=15 \
    --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.log" 2>&1 || stamp "GPU tests: exit status $?"
tail -40 "$OUT/gpu_tests.log"

stamp "loss benchmark (bf16)"
# shellcheck disable=SC2086  # SHAPES is a list of N,H,V words
timeout "${BENCH_TIMEOUT:-180}" python benchmarks/bench_loss.py --device cuda --dtype bf16 --shapes $SHAPES \
    --repeats "$REPEATS" --out "$OUT/bench_loss_h200.json" 2>&1 | tee "$OUT/bench_loss.txt"

stamp "done; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
