#!/usr/bin/env bash
# Every GPU check in one call of the device tool: build csrc for sm_90, run the GPU tests, run the
# loss benchmark (every backend vs naive, Liger-Kernel and three cuBLAS GEMMs) and, when present,
# the trainer's memory-offload check. Prints a short summary; results land in $OUT.
#
# Prepare on the CPU machine (the GPU machine has no network; Liger travels as a wheel):
#   pip download --no-deps liger-kernel==0.8.5 -d .wheels        # .wheels/ is git-ignored
# Call:  run(command="bash benchmarks/gpu_check.sh", carry=[".wheels"], timeout_s=540)
# Then commit $OUT's JSON under benchmarks/results/ and put the headline numbers in README.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/grpo_fast_gpu_check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}"
SHAPES="${SHAPES:-4096,3584,152064 16384,3584,152064 65536,3584,152064}"
start=$(date +%s)
stamp() { echo "[gpu_check +$(( $(date +%s) - start ))s] $*"; }

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if compgen -G ".wheels/*.whl" > /dev/null; then
    pip install -q --no-deps .wheels/*.whl && stamp "installed $(ls .wheels)"
fi

stamp "building grpo_fast (csrc for TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
if ! pip install --no-deps --no-build-isolation -e . > "$OUT/build.log" 2>&1; then
    stamp "build FAILED (tail of build.log):"; tail -25 "$OUT/build.log"
fi
python -c "import grpo_fast.backends as b, torch; print('backends on cuda:', b.available_backends(torch.device('cuda')))"

stamp "GPU tests"
python -m pytest -q -m gpu tests -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.log" 2>&1
tail -15 "$OUT/gpu_tests.log"

stamp "loss benchmark (bf16)"
# shellcheck disable=SC2086  # SHAPES is a list of N,H,V words
python benchmarks/bench_loss.py --device cuda --dtype bf16 --shapes $SHAPES --repeats 5 \
    --out "$OUT/bench_loss_h200.json" 2>&1 | tee "$OUT/bench_loss.txt"

if [ -f benchmarks/bench_offload.py ]; then
    stamp "trainer offload (GPU memory per phase)"
    python benchmarks/bench_offload.py --out "$OUT/offload_h200.json" 2>&1 | tail -20
fi
stamp "done; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
