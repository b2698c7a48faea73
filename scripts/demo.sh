#!/usr/bin/env bash
# The main job on its embedded default: creates .venv/ if missing, then runs the demo training run
# (tiny Qwen2 model built locally, cold-start SFT, GRPO with vLLM rollouts) and prints held-out
# accuracy before and after RL. Results (summary.json, metrics.jsonl, plots/) go to runs/demo or $1.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec grpo-fast demo --output-dir "${1:-runs/demo}"
