#!/usr/bin/env bash
# The main job on its embedded default: creates .venv/ if missing, then runs the CPU loss
# benchmark (grpo_fast vs the naive full-logits path) and prints its table.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec grpo-fast bench-loss "$@"
