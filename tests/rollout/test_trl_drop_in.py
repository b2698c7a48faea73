"""A run with tools prepares its tokenizer as TRL 1.16's GRPOTrainer does: the response template TRL knows for its
chat template, TRL's prefix-preserving training template in place of one that is not, chat_template_kwargs in every
rendering. Real tokenizer (a byte-level BPE trained locally) with Qwen3's chat template as TRL ships it."""

from __future__ import annotations

import pytest
from scripted_chat import build_bpe_chat_tokenizer

trl = pytest.importorskip("trl")


class Quiz:
    """TRL's environment pattern: reset() builds the prompt from the row, get_reward() (async) scores the state."""

    resets: list[dict] = []

    def reset(self, **row) -> str:
        Quiz.resets.append(row)
        self.target, self.said = row["target"], None
        return f"say {row['target']}"

    def answer(self, value: int) -> str:
        """Gives the answer.

        Args:
            value: The answer.
        """
        self.said = value
        return "noted"

    async def get_reward(self) -> float:
        return float(self.said == self.target)


def test_a_tool_run_prepares_the_tokenizer_as_trl_does(tmp_path):
    """A Qwen3 tokenizer without a response template, whose chat template is not prefix-preserving: the run gets
    the response template TRL sets and renders every prompt with TRL's training template and the run's
    chat_template_kwargs (the reference: TRL's own functions and Qwen3's enable_thinking rendering)."""
    from scripted_chat import QWEN3_SPECIAL, qwen3_template
    from trl.chat_template_utils import get_training_chat_template
    from trl.chat_template_utils import qwen3_template as trl_response_template

    from grpo_fast.rollout.prompts import PromptEncoder, stop_token_ids
    from grpo_fast.rollout.rollouts import build_rollouts
    from grpo_fast.trainer import load_config

    tok = build_bpe_chat_tokenizer(["Does the gene BRCA1 interact?", "answer", "value"], special=QWEN3_SPECIAL)
    tok.chat_template = qwen3_template()
    config = load_config(None, ["data.chat_template_kwargs={enable_thinking: false}"])
    prompts = PromptEncoder(tok, config.data)
    rollouts = build_rollouts(config.rollout, prompts, tok, stop_token_ids(tok, []), tools=[Quiz().answer])
    assert tok.response_template == trl_response_template
    assert prompts.chat_template == get_training_chat_template(tok) and prompts.chat_template != tok.chat_template
    ids = rollouts.chat.prompt_ids([{"role": "user", "content": "Does the gene BRCA1 interact?"}], [])
    assert tok.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # enable_thinking: false
    assert prompts.encode("Does the gene BRCA1 interact?") == ids  # every prompt of the run, the same way
