"""The fingerprint of the C++/CUDA sources grpo_fast._C is compiled from (csrc/).

setup.py compiles the fingerprint of csrc/ into the extension (`_C.sources_hash()`); importing the native backends
compares it with the fingerprint of the csrc/ beside the package (an editable install, a source checkout), so that
an extension built from other sources is never used without a word: it is used (its kernels are whole), with a
warning that says how to rebuild it. An installed wheel has no csrc/ beside it, and nothing to compare.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SUFFIXES = (".cpp", ".h", ".cu", ".cuh")
REBUILD = "pip install --no-build-isolation -e . in the repository (scripts/env.sh does it when csrc/ changes)"


def sources_hash(csrc: Path) -> str:
    """16 hex digits of the SHA-256 of every source file under `csrc` (relative path and bytes, in path order)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in csrc.rglob("*") if p.suffix in SUFFIXES and p.is_file()):
        digest.update(path.relative_to(csrc).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def stale_extension(built: str | None, csrc: Path) -> str | None:
    """Why an extension whose compiled-in fingerprint is `built` (None: it has none, built before fingerprints) is
    stale against the sources in `csrc`; None when it is not, or when there is no `csrc` to compare with."""
    if not csrc.is_dir():
        return None
    current = sources_hash(csrc)
    if built == current:
        return None
    built_from = "carries no fingerprint of its sources" if built is None else f"was built from sources {built}"
    return (
        f"grpo_fast._C is stale: it {built_from}, and {csrc} now holds sources {current}; the cpu and cuda backends "
        f"run the old kernels until it is rebuilt: {REBUILD}"
    )
