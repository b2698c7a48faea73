"""Think/answer format bonus and the overlong / length penalties."""

from __future__ import annotations

import pytest

from grpo_fast.rewards import length_penalty, overlong_penalty, think_format


@pytest.mark.parametrize(
    ("completion", "ok"),
    [
        ("<think>reasoning</think> answer", True),
        ("\n<think>a\nb</think>\n\\boxed{3}", True),
        ("<think>reasoning</think>", False),
        ("answer <think>late</think> x", False),
        ("<think>a</think><think>b</think> x", False),
        ("<think>unclosed answer", False),
        ("plain answer", False),
    ],
)
def test_think_format(completion, ok):
    assert think_format(["p"], [completion]) == [0.2 if ok else 0.0]


def test_think_format_answer_pattern_and_bonus():
    completions = ["<think>r</think><answer>4</answer>", "<think>r</think> 4"]
    assert think_format(["p"] * 2, completions, answer_pattern=r"<answer>.+</answer>", bonus=0.1) == [0.1, 0.0]
    with pytest.raises(ValueError, match="bonus"):
        think_format(["p"], ["x"], bonus=0.5)


def test_overlong_penalty_is_linear_over_the_buffer_in_tokens():
    lengths = [0, 60, 80, 90, 100, 150]
    rewards = overlong_penalty(
        ["p"] * 6, ["x"] * 6, max_completion_length=100, overlong_buffer=20, completion_lengths=lengths
    )
    assert rewards == pytest.approx([0.0, 0.0, 0.0, -0.5, -1.0, -1.0])
    ids = [[1] * 90]
    assert overlong_penalty(["p"], ["x"], max_completion_length=100, overlong_buffer=20, completion_ids=ids) == [
        pytest.approx(-0.5)
    ]


def test_overlong_penalty_counts_characters_or_tokenizer_tokens():
    class WordTokenizer:
        def encode(self, text):
            return text.split()

    text = "a " * 90  # 180 characters, 90 tokens
    limits = {"max_completion_length": 200, "overlong_buffer": 40}
    assert overlong_penalty(["p"], [text], **limits) == [pytest.approx(-0.5)]
    assert overlong_penalty(["p"], [text], **limits, tokenizer=WordTokenizer()) == [pytest.approx(0.0)]
    with pytest.raises(ValueError, match="overlong_buffer"):
        overlong_penalty(["p"], ["x"], max_completion_length=10, overlong_buffer=0)


def test_length_penalty():
    rewards = length_penalty(["p"] * 3, ["x"] * 3, target_length=100, completion_lengths=[50, 100, 150])
    assert rewards == pytest.approx([0.0, 0.0, -0.5])
