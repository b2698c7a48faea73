"""Which verified-correct completions of a prompt go into the rejection-sampled SFT set.

Only correct completions are candidates (see pass_rates). Then, in this order: truncated ones are dropped
(they never finished their answer); with `language` set, completions whose reasoning mixes languages are
dropped (the language-consistency reward's share below `min_language_share`; a completion with no
letters at all has nothing to judge and stays); duplicates (same text up to whitespace) keep their first
occurrence; the shortest come first when `prefer_shortest` (else sampling order); at most
`max_per_prompt` are kept (0: all).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_fast.curate.pass_rates import PromptSamples
from grpo_fast.rewards.language import language_share


@dataclass(frozen=True)
class SelectionRules:
    max_per_prompt: int = 1
    prefer_shortest: bool = True
    dedupe: bool = True
    drop_truncated: bool = True
    language: str | None = None
    min_language_share: float = 0.95

    def __post_init__(self) -> None:
        if self.max_per_prompt < 0:
            raise ValueError(f"max_per_prompt: expected >= 0 (0 keeps all), got {self.max_per_prompt}")
        if not 0.0 <= self.min_language_share <= 1.0:
            raise ValueError(f"min_language_share: expected a share in [0, 1], got {self.min_language_share}")
        if self.language is not None:
            language_share("", self.language)  # raises ValueError naming an unknown language


def select_completions(samples: PromptSamples, rules: SelectionRules) -> list[int]:
    """Indices into samples.completions of the completions to keep, in the order they are kept."""
    kept = [j for j, c in enumerate(samples.completions) if bool(samples.correct[j])]
    if rules.drop_truncated:
        kept = [j for j in kept if not samples.completions[j].truncated]
    if rules.language is not None:
        kept = [j for j in kept if _readable(samples.completions[j].text, rules)]
    if rules.dedupe:
        seen: set[str] = set()
        unique = []
        for j in kept:
            key = " ".join(samples.completions[j].text.split())
            if key not in seen:
                seen.add(key)
                unique.append(j)
        kept = unique
    if rules.prefer_shortest:
        kept.sort(key=lambda j: len(samples.completions[j].token_ids))  # stable: ties keep sampling order
    return kept[: rules.max_per_prompt] if rules.max_per_prompt else kept


def _readable(text: str, rules: SelectionRules) -> bool:
    share = language_share(text, rules.language)
    return share is None or share >= rules.min_language_share
