"""grpo_fast._C carries the fingerprint of the csrc/ it was compiled from; importing the native backends compares it
with the csrc/ beside the package and warns, saying how to rebuild, when they differ (an extension built from older
sources was used without a word)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from grpo_fast.backends.sources import sources_hash, stale_extension

native = pytest.importorskip("grpo_fast.backends.native", reason="grpo_fast._C not built")
CSRC = Path(__file__).resolve().parents[2] / "csrc"


def test_the_built_extension_carries_the_fingerprint_of_this_csrc():
    assert native.CSRC == CSRC
    assert native._C.sources_hash() == sources_hash(CSRC), "grpo_fast._C is stale: rebuild it (pip install -e .)"
    assert native.STALE is None


def test_a_changed_source_in_a_copy_makes_the_extension_stale_with_a_warning(tmp_path, caplog):
    copy = tmp_path / "csrc"
    shutil.copytree(CSRC, copy)
    assert native.check_sources(copy) is None and sources_hash(copy) == sources_hash(CSRC)
    source = copy / "cpu" / "epilogue_cpu.h"
    source.write_text(source.read_text() + "\n// changed\n")
    caplog.set_level(logging.WARNING, logger="grpo_fast.backends.native")
    stale = native.check_sources(copy)
    built, now = native._C.sources_hash(), sources_hash(copy)
    assert built != now and f"was built from sources {built}, and {copy} now holds sources {now}" in stale
    assert "pip install --no-build-isolation -e ." in stale and caplog.records[-1].getMessage() == stale


def test_a_build_without_a_fingerprint_is_stale_and_no_csrc_is_nothing_to_compare(tmp_path):
    assert "carries no fingerprint of its sources" in stale_extension(None, CSRC)
    assert stale_extension("0123456789abcdef", tmp_path / "no_csrc") is None  # an installed wheel
