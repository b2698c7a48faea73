#!/usr/bin/env bash
# The test command: creates .venv/ if missing, installs everything, runs lint and the test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m slow`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
# bubblewrap, for the code sandbox's unprivileged backend; its tests skip where it cannot be installed.
command -v bwrap >/dev/null || (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 || true
cd "$ROOT"
ruff check .
python -m pytest -q -m "not slow and not gpu" "$@"
