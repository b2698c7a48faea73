#!/usr/bin/env bash
# The main job on its embedded default: creates .venv/ if missing, then runs the demo training run
# (tiny Qwen2 model built locally, cold-start SFT, GRPO with vLLM rollouts) and prints held-out
# accuracy before and after RL. Results (summary.json, metrics.jsonl, plots/) go to runs/demo or $1.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
# c10 reads its log level when torch starts: its notices (vLLM's NUMA binding on CPU) stay off unless asked for
export TORCH_CPP_LOG_LEVEL="${TORCH_CPP_LOG_LEVEL:-ERROR}"
exec grpo-fast demo --output-dir "${1:-runs/demo}"
