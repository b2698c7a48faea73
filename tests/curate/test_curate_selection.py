"""Rejection-sampling selection rules, the chunk journal a killed sampler resumes from, and the pass-rate
band filter."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_fast.curate.filtering import filter_pass_rates
from grpo_fast.curate.journal import append_chunk, read_complete_chunks
from grpo_fast.curate.pass_rates import PromptSamples
from grpo_fast.curate.rejection import SelectionRules, select_completions
from grpo_fast.rollout.base import Completion


def _samples(specs: list[tuple[str, int, bool, str]]) -> PromptSamples:
    """specs: (text, number of tokens, correct, finish_reason) per completion."""
    completions = [Completion(list(range(n)), [], text, reason) for text, n, _, reason in specs]
    correct = torch.tensor([ok for _, _, ok, _ in specs])
    rewards = correct.float()
    return PromptSamples(0, completions, rewards[:, None], rewards, correct)


def test_only_correct_finished_unique_shortest_first():
    samples = _samples(
        [
            ("wrong", 1, False, "stop"),
            ("long  answer 7", 9, True, "stop"),
            ("cut off", 2, True, "length"),
            ("answer 7", 4, True, "stop"),
            ("long answer 7", 9, True, "stop"),  # a duplicate of 1 up to whitespace
            ("other 7", 4, True, "stop"),
        ]
    )
    assert select_completions(samples, SelectionRules(max_per_prompt=0)) == [3, 5, 1]
    assert select_completions(samples, SelectionRules(max_per_prompt=2)) == [3, 5]
    assert select_completions(samples, SelectionRules(max_per_prompt=0, prefer_shortest=False)) == [1, 3, 5]
    assert select_completions(samples, SelectionRules(max_per_prompt=0, dedupe=False)) == [3, 5, 1, 4]
    keep_cut = SelectionRules(max_per_prompt=0, drop_truncated=False)
    assert select_completions(samples, keep_cut) == [2, 3, 5, 1]


def test_language_rule_drops_mixed_reasoning_and_keeps_bare_answers():
    samples = _samples(
        [
            ("<think>add the numbers first</think> 7", 5, True, "stop"),
            ("<think>先把数字相加 then carry</think> 7", 5, True, "stop"),
            ("7", 1, True, "stop"),
        ]
    )
    rules = SelectionRules(max_per_prompt=0, prefer_shortest=False, language="en")
    assert select_completions(samples, rules) == [0, 2]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"max_per_prompt": -1}, "max_per_prompt"), ({"min_language_share": 2.0}, "min_language_share")],
)
def test_selection_rules_reject_bad_values(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SelectionRules(**kwargs)
    with pytest.raises(ValueError, match="unknown"):
        SelectionRules(language="klingon")


def test_journal_keeps_complete_chunks_only(tmp_path):
    path = tmp_path / "records.jsonl"
    sizes = {0: 2, 1: 2, 2: 1}
    append_chunk(path, [{"chunk": 0, "i": 0}, {"chunk": 0, "i": 1}])
    append_chunk(path, [{"chunk": 2, "i": 4, "reward": float("nan")}])
    with open(path, "a") as f:  # chunk 1 killed half-way: one record and a torn line
        f.write(json.dumps({"chunk": 1, "i": 2}) + "\n" + '{"chunk": 1, "i"')
    records = read_complete_chunks(path, sizes.__getitem__)
    assert [r["i"] for r in records] == [0, 1, 4]
    assert records[2]["reward"] is None  # NaN is written as null
    assert [json.loads(line)["i"] for line in path.read_text().splitlines()] == [0, 1, 4]
    append_chunk(path, [{"chunk": 1, "i": 2}, {"chunk": 1, "i": 3}])
    assert sorted(r["i"] for r in read_complete_chunks(path, sizes.__getitem__)) == [0, 1, 2, 3, 4]


def test_filter_keeps_the_band(tmp_path):
    rates = [0.0, 0.125, 0.5, 0.875, 1.0, 0.1, 0.9, 0.05]
    src = tmp_path / "pass_rates.jsonl"
    src.write_text(
        "".join(
            json.dumps({"pass_rate": p, "row": {"prompt": f"p{i}", "answer": i}}) + "\n" for i, p in enumerate(rates)
        )
    )
    out = tmp_path / "kept.jsonl"
    summary = filter_pass_rates(src, out, 0.1, 0.9, tmp_path / "hist.png")
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in kept] == ["p1", "p2", "p3", "p5", "p6"]
    assert kept[0] == {"prompt": "p1", "answer": 1}  # the dataset row itself, loadable by `train`
    assert (summary["kept"], summary["too_easy"], summary["too_hard"]) == (5, 1, 2)
    assert (tmp_path / "hist.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="low/high"):
        filter_pass_rates(src, out, 0.9, 0.1)
    with pytest.raises(FileNotFoundError, match="grpo-fast sample"):
        filter_pass_rates(tmp_path / "missing.jsonl", out)
    before = src.read_text()
    with pytest.raises(ValueError, match="output: .* is the pass_rates file it reads"):  # it replaced its input
        filter_pass_rates(src, tmp_path / "." / "pass_rates.jsonl")
    assert src.read_text() == before
