"""The text a reward scores, from token ids: a completion's ids decoded as one sequence in its prompt's context, the
way vLLM's incremental detokenizer writes it (special tokens skipped, the stopping token left out).

A completion generated in pieces (partial rollouts' rounds, the engine process's) is decoded once, whole: decoding
each piece alone and joining the texts loses what depends on the neighbours (a word-level decoder's spaces between
pieces, a byte-level BPE character whose bytes fall on both sides of a boundary, which becomes U+FFFD).
"""

from __future__ import annotations

from grpo_fast.rollout.base import Completion

DECODE_CONTEXT_TOKENS = 4
"""Prompt tokens decoded ahead of a completion (then cut off): vLLM's detokenizer decodes a completion in its
prompt's context, which decides e.g. the leading space a SentencePiece ("Metaspace") decoder gives the first
token; a few tokens settle it, as they do in vLLM's own incremental detokenizer."""


def rust_tokenizer(tokenizer):
    """The `tokenizers.Tokenizer` behind a transformers fast tokenizer (what vLLM's fast detokenizer decodes with),
    or None for a slow tokenizer."""
    try:
        import tokenizers
    except ImportError:  # pragma: no cover - transformers requires it
        return None
    inner = getattr(tokenizer, "_tokenizer", None)
    return inner if isinstance(inner, tokenizers.Tokenizer) else None


def decode_completions(tokenizer, items: list[tuple[list[int], list[int]]]) -> list[str]:
    """Texts of (prompt ids, completion ids) pairs, special tokens skipped, as vLLM's incremental
    detokenizer (`tokenizers`' DecodeStream primed with the prompt) writes them: the completion decoded after
    the prompt's last DECODE_CONTEXT_TOKENS tokens, minus those tokens' own text. Like the stream, a text
    never ends in an incomplete character (U+FFFD): the tokens since the last complete one are left out.
    Where the context's text is not a prefix of the whole (a character split between prompt and
    completion), the completion decoded alone. tokenizer: a `tokenizers.Tokenizer`, or anything with its
    decode(ids, skip_special_tokens=) and decode_batch(lists, skip_special_tokens=)."""
    if not items:
        return []
    contexts = [prompt[-DECODE_CONTEXT_TOKENS:] for prompt, _ in items]
    whole = tokenizer.decode_batch(
        [c + ids for c, (_, ids) in zip(contexts, items, strict=True)], skip_special_tokens=True
    )
    heads = tokenizer.decode_batch(contexts, skip_special_tokens=True)
    texts = []
    for context, (_, ids), full, head in zip(contexts, items, whole, heads, strict=True):
        if not full.startswith(head):
            context, head = [], ""
            full = tokenizer.decode(ids, skip_special_tokens=True)
        cut = len(ids)
        while full.endswith("\ufffd") and cut > 0:  # rare: a truncated multi-byte character
            cut -= 1
            full = tokenizer.decode(context + ids[:cut], skip_special_tokens=True)
        texts.append(full[len(head) :] if full.startswith(head) else "")
    return texts


class _SlowDecoder:
    """decode / decode_batch of a transformers slow tokenizer, as `decode_completions` calls them."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch: list[list[int]], skip_special_tokens: bool) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]


class CompletionTexts:
    """Sets the text of completions from their ids with a transformers tokenizer (see module doc)."""

    def __init__(self, tokenizer) -> None:
        self.decoder = rust_tokenizer(tokenizer) or _SlowDecoder(tokenizer)

    def __call__(self, prompt_ids: list[list[int]], completions: list[Completion], stop_ids=()) -> None:
        """Decodes completion i ([N]) in the context of prompt_ids[i] ([N] lists) and sets its `text`; the token
        that stopped it (its last, when finish_reason is "stop") is left out, as vLLM leaves it out. A multi-turn
        completion's text is its episode's final answer (grpo_fast.rollout.base.ToolEpisode.answer)."""
        plain = [(p, c) for p, c in zip(prompt_ids, completions, strict=True) if c.episode is None]
        items = [(p, c.token_ids[:-1] if c.finish_reason == "stop" else c.token_ids) for p, c in plain]
        for (_, c), text in zip(plain, decode_completions(self.decoder, items), strict=True):
            c.text = text
        for c in completions:
            if c.episode is not None:
                c.text = c.episode.answer
