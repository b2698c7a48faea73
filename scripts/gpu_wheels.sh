#!/usr/bin/env bash
# Downloads, into .wheels/ (git-ignored), the Python 3.12 wheels that benchmarks/gpu_check.sh installs on a GPU
# machine without a package index that has torch, triton, transformers, accelerate, pandas, pyarrow, xxhash, fsspec
# and peft but none of these:
#   liger-kernel 0.8.5   the Liger rows of the loss benchmark (LigerFusedLinearGRPOLoss)
#   trl 1.16.0           TRL's fused LM head (trl.kernels) and GRPOTrainer (its loss, and the training-step
#                        comparison of benchmarks/bench_trl_integration.py)
#   datasets, dill, multiprocess
#                        trl/trainer/utils.py imports datasets, and TRL's head imports that module in its
#                        backward; datasets needs dill and multiprocess, the image has the rest of its needs
# The versions are those of the CPU environment the tests run in. Every wheel is pure Python (no platform tag to
# match). The script fails if they come to more than 64 MiB (they are 2.7 MiB). Then:
#
#   bash scripts/gpu_wheels.sh            # once, on a machine with network access
#   bash benchmarks/gpu_check.sh          # on the GPU machine, with .wheels/ copied beside the repository
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${WHEELS_DIR:-.wheels}"
PYTHON="${PYTHON:-python3}"
WHEELS=(liger-kernel==0.8.5 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)
LIMIT=$((64 << 20))

mkdir -p "$DEST"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --dest "$DEST" "${WHEELS[@]}"
for spec in "${WHEELS[@]}"; do
    name="${spec%%==*}"
    found=$(find "$DEST" -maxdepth 1 -iname "${name//-/_}-${spec##*==}-*.whl" | wc -l)
    [ "$found" = 1 ] || { echo "gpu_wheels: expected one wheel of $spec in $DEST, found $found" >&2; exit 1; }
done
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
wheel_bytes=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
ls -l "$DEST"
echo "gpu_wheels: wheels $((wheel_bytes >> 10)) KiB + working tree $((tree_bytes >> 10)) KiB of the 64 MiB that travel"
[ $((wheel_bytes + tree_bytes)) -lt "$LIMIT" ] || { echo "gpu_wheels: over the 64 MiB carry limit" >&2; exit 1; }
