"""The vLLM engine asks vLLM for token ids only (`detokenize=False`) and decodes the completion texts itself,
in one batch: the texts must be the ones vLLM's incremental detokenizer (`tokenizers`' DecodeStream primed
with the prompt, special tokens skipped, the stopping token left out) would have written. Checked here
against DecodeStream itself on tokenizers trained locally (byte-level BPE with multi-byte characters, and a
SentencePiece-style decoder that strips a leading space only at the start of a text), and against real
vLLM on the tiny model."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers.decoders import DecodeStream

from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.rollout.texts import decode_completions

TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "héllo wörld, ünïcödé façade naïve café",
    "日本語のテキストと emoji 🙂🚀 mixed in",
    "def f(x):\n    return x * 7 % 10\n",
    "  leading spaces and\ttabs  ",
] * 4
SPECIAL = ["<s>", "</s>", "<|im_end|>"]


def _byte_level_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TEXT, trainer)
    return tok


def _sentencepiece_style() -> Tokenizer:
    """Llama-2-like decoding: "▁" -> " ", then the text's first space stripped."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[*SPECIAL, "<unk>"])
    tok.train_from_iterator(TEXT, trainer)
    return tok


def _vllm_text(tok: Tokenizer, prompt: list[int], completion: list[int]) -> str:
    """What vLLM's FastIncrementalDetokenizer accumulates (skip_special_tokens=True)."""
    stream = DecodeStream(ids=prompt, skip_special_tokens=True)
    return "".join(stream.step(tok, t) or "" for t in completion)


def _cases(tok: Tokenizer, rng: random.Random, count: int = 200) -> list[tuple[list[int], list[int]]]:
    special = [tok.token_to_id(s) for s in SPECIAL]
    cases = []
    for _ in range(count):
        ids = tok.encode(rng.choice(TEXT) + rng.choice(TEXT)).ids
        # A prompt is encoded text: it ends on a whole character (a completion may not).
        cut = rng.choice([i for i in range(1, len(ids)) if not tok.decode(ids[:i]).endswith("\ufffd")])
        end = rng.randrange(cut, len(ids) + 1)  # may end inside a multi-byte character
        prompt, completion = [special[0], *ids[:cut]], ids[cut:end]
        if rng.random() < 0.3:  # a chat turn's end inside the completion, skipped like any special token
            completion.insert(rng.randrange(len(completion) + 1), special[2])
        cases.append((prompt, completion))
    return cases


@pytest.mark.parametrize("build", [_byte_level_bpe, _sentencepiece_style], ids=["byte_level_bpe", "sentencepiece"])
def test_batch_decode_matches_vllms_incremental_detokenizer(build):
    tok = build()
    cases = _cases(tok, random.Random(0))
    got = decode_completions(tok, cases)
    want = [_vllm_text(tok, p, c) for p, c in cases]
    assert got == want
    # The context matters: decoded alone, SentencePiece-style completions lose their leading space.
    if build is _sentencepiece_style:
        alone = [tok.decode(c, skip_special_tokens=True) for _, c in cases]
        assert alone != want


def test_decode_of_nothing():
    tok = _byte_level_bpe()
    assert decode_completions(tok, []) == []
    assert decode_completions(tok, [([1, 2], [])]) == [""]


def test_real_vllm_texts_match_its_own_detokenizer(vllm_engine, tiny_dir):
    """The engine's texts (batch-decoded) against vLLM's own (detokenize=True) for the same seeded requests."""
    import vllm

    from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
    from grpo_fast.rollout.weight_sync import trainer_weights

    tok = build_char_tokenizer()
    vllm_engine.load_weights(trainer_weights(build_tiny_model(tok, seed=0)))
    assert vllm_engine._decoder is not None  # the char tokenizer is a fast one: batch decoding is used
    prompts = [tok(p)["input_ids"] for p in ("(12*7)%10=", "(345*7)%10=", "mul 7 mod 10:")]
    spec = SamplingSpec(
        n=4, max_tokens=12, temperature=1.0, stop_token_ids=(tok.eos_token_id, tok.convert_tokens_to_ids("=")), seed=3
    )
    groups = vllm_engine.generate(prompts, spec)
    params = [
        vllm.SamplingParams(
            n=4, max_tokens=12, temperature=1.0, stop_token_ids=list(spec.stop_token_ids), seed=3 + 4 * i, logprobs=0
        )
        for i in range(len(prompts))
    ]
    outs = vllm_engine.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    stopped = 0
    for group, out in zip(groups, outs, strict=True):
        for c, o in zip(group, sorted(out.outputs, key=lambda x: x.index), strict=True):
            assert c.token_ids == list(o.token_ids)
            assert c.text == o.text
            assert c.logprobs == [step[t].logprob for t, step in zip(o.token_ids, o.logprobs, strict=True)]
            stopped += c.finish_reason == "stop"
    assert stopped  # some completions ended on a stop token, which neither text includes
