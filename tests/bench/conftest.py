"""What the benchmark tests share: loading a script of benchmarks/ (or setup.py) as a module, its __main__ block
not run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def load_script():
    """load_script(path relative to the repository, module name) -> the module."""

    def load(relative: str, name: str):
        spec = importlib.util.spec_from_file_location(name, ROOT / relative)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
