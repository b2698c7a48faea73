"""grpo_fast.kernels in a source tree: the repository's top-level kernels/ folder.

setup.py installs kernels/ itself as this package (this file is not installed). In a source tree — an editable
install, or a copy of the repository on PYTHONPATH — this file points the package at the kernels/ folder beside this
tree's grpo_fast/, so that a copy imports its own kernels, never another tree's (an editable install's finder maps
grpo_fast.kernels to the tree it was installed from).
"""

from pathlib import Path

__path__ = [str(Path(__file__).resolve().parents[2] / "kernels")]
