"""The text a reward scores is the decode of the completion's whole ids in its prompt's context, in every rollout
mode: completions continued over rounds (rollout.mode partial) are never decoded piece by piece and joined. The
reference is `tokenizers`' own DecodeStream (what vLLM's detokenizer runs) primed with the prompt, over the
completion's ids without the stopping token; tokenizers where a piece's text depends on its neighbours: words
joined with spaces, and a byte-level BPE trained here on multi-byte characters."""

from __future__ import annotations

import pytest
from tokenizers.decoders import DecodeStream

from grpo_fast.core.tiny_models import build_byte_bpe_tokenizer, build_tiny_model, build_word_tokenizer
from grpo_fast.rewards.reward_set import RewardSet
from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.rollout.hf_engine import HFEngine
from grpo_fast.rollout.prompts import PromptEncoder, stop_token_ids
from grpo_fast.trainer import load_config
from grpo_fast.trainer.data_sampler import PromptSampler
from grpo_fast.trainer.rollout_phase import RolloutPhase


def reference_text(tok, prompt: list[int], completion: list[int], stopped: bool) -> str:
    stream = DecodeStream(ids=prompt, skip_special_tokens=True)
    ids = completion[:-1] if stopped else completion
    return "".join(stream.step(tok._tokenizer, t) or "" for t in ids)


class Seen:
    """A reward function that keeps the texts it was given."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.__name__ = "seen"

    def __call__(self, prompts, completions, **_):
        self.texts += completions
        return [float(len(c) % 3) for c in completions]


def _partial_batch(tok, prompts: list[str], segment: int, temperature: float, length: int):
    overrides = ["rollout.mode=partial", f"rollout.partial.segment_tokens={segment}", "rollout.num_generations=2"]
    overrides += [f"rollout.max_completion_length={length}", f"rollout.temperature={temperature}"]
    overrides += [f"run.prompts_per_step={len(prompts)}", "rollout.partial.groups_in_flight=1", "reward.workers=0"]
    cfg = load_config(None, overrides)
    rows = [{"prompt": p} for p in prompts]
    seen = Seen()
    phase = RolloutPhase(
        cfg,
        rows,
        PromptEncoder(tok, cfg.data),
        RewardSet([seen], workers=0),
        PromptSampler(len(rows), 0),
        stop_token_ids(tok, []),
    )
    engine = HFEngine(build_tiny_model(tok, seed=2), tok)
    return phase.collect(engine, step=0), engine, seen


def test_words_keep_their_spaces_over_round_boundaries():
    """Greedy, two tokens a round: the ids are those of one uninterrupted generation, and the text is its text,
    every word apart (joined round texts read 'w29 w34w6 w32')."""
    tok = build_word_tokenizer(40)
    batch, engine, seen = _partial_batch(tok, ["w5 w9 w11", "w7 w3"], segment=2, temperature=0.0, length=9)
    whole = engine.generate(batch.prompt_ids[::2], SamplingSpec(n=1, max_tokens=9, temperature=0.0))
    assert len(batch.completions) == 4
    for prompt, c, (one,) in zip(batch.prompt_ids, batch.completions, [w for w in whole for _ in (0, 1)], strict=True):
        assert c.token_ids == one.token_ids and len(c.token_ids) > 2
        want = reference_text(tok, prompt, c.token_ids, c.finish_reason == "stop")
        assert c.text == want
        assert len(c.text.split()) == sum(t > 2 for t in c.token_ids)  # every word but pad / bos / eos
    assert seen.texts == [c.text for c in batch.completions]


def test_byte_level_bpe_characters_split_over_rounds_decode_whole():
    """Sampled one token a round with a byte-level BPE: characters whose bytes fall in different rounds come out
    whole (decoded alone, the second round's piece starts with U+FFFD)."""
    tok = build_byte_bpe_tokenizer()
    batch, _, seen = _partial_batch(tok, ["café au", "日本語の", "naïve"], segment=1, temperature=1.0, length=12)
    split = 0
    for prompt, c in zip(batch.prompt_ids, batch.completions, strict=True):
        assert c.text == reference_text(tok, prompt, c.token_ids, c.finish_reason == "stop")
        pieces = [tok.decode(c.token_ids[: i + 1]) for i in range(len(c.token_ids))]
        split += sum(p.endswith("\ufffd") for p in pieces[:-1])  # a round boundary inside a character
    assert split > 0, "no character was split over rounds: the test did not exercise the boundary"
    assert seen.texts == [c.text for c in batch.completions]


@pytest.mark.parametrize("build", [lambda: build_word_tokenizer(40), build_byte_bpe_tokenizer], ids=["word", "bpe"])
def test_the_engine_writes_texts_in_the_prompts_context(build):
    """One generation (sync mode's path): the transformers engine's texts are the reference's too."""
    tok = build()
    engine = HFEngine(build_tiny_model(tok, seed=4), tok)
    prompts = [
        tok("w5 w9" if len(tok) == 40 else "café")["input_ids"],
        tok("w7" if len(tok) == 40 else "日本")["input_ids"],
    ]
    groups = engine.generate(prompts, SamplingSpec(n=3, max_tokens=8, temperature=1.0, seed=1))
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            assert c.text == reference_text(tok, prompt, c.token_ids, c.finish_reason == "stop")
