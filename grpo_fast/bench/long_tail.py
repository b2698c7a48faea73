"""A task with a long tail of completion lengths, for the partial- and asynchronous-rollout benchmark.

Prompts are the demo's "(a*7)%10=". The cold-start teacher answers with the digit and signs off, "d ok" (five
tokens of the character tokenizer with EOS), right only `correct_fraction` of the time (else d + 1, as the demo's
teacher). On the hard prompts, the `long_share` with the largest operands, it "thinks" in filler before signing
off, ending 160 to 40 tokens short of the token limit: as often right as on the others, so length is neither paid
nor punished, and which prompts get long answers stays a property of the prompt. After SFT the tiny model stops
after five tokens on most prompts and thinks to near (or past) the limit on about one in ten: a synchronous step
then waits for its longest completion. The reward is 1 for the right digit in a completion
that signed off (one cut at the limit did not), so RL has the demo's signal to learn from.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from grpo_fast.core.tiny_models import TinyModelSpec, build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.registry import Sample, reward
from grpo_fast.rewards.text import completion_text
from grpo_fast.sft.in_memory import sft_train

FILLER = "hmm "
"""What the teacher writes while it "thinks" (repeated past the token limit)."""
MODEL_SPEC = TinyModelSpec(max_position_embeddings=1024)


@dataclass(frozen=True)
class LongTailTask:
    train_rows: list[dict]
    eval_rows: list[dict]
    teacher_pairs: list[tuple[str, str]]


SIGN_OFF = "ok"


def answer_text(digit: int, thinking: str = "") -> str:
    """The digit first (as in the demo), then the thinking, if any, then the sign-off."""
    return f"{digit} {thinking}{SIGN_OFF}"


_ANSWER = re.compile(r"\s*(\d) ")


@reward(
    kind="accuracy",
    range=(0.0, 1.0),
    samples=(
        Sample("right", answer_text(4), {"answer": "4"}, True),
        Sample("right after thinking", answer_text(4, FILLER * 8), {"answer": "4"}, True),
        Sample("wrong digit", answer_text(5), {"answer": "4"}, False),
        Sample("cut off while thinking", "4 " + FILLER * 8, {"answer": "4"}, False),
    ),
)
def final_digit_reward(prompts, completions, answer, **_) -> list[float]:
    """1.0 when the completion starts with the right digit and ends with the sign-off, else 0.0."""
    out = []
    for c, a in zip(completions, answer, strict=True):
        text = completion_text(c)
        match = _ANSWER.match(text)
        signed = text.rstrip().endswith(SIGN_OFF)
        out.append(float(match is not None and signed and match.group(1) == str(a).strip()))
    return out


def is_hard(prompt: str, long_share: float) -> bool:
    """The prompts the teacher thinks long about: operands in the top `long_share` of their range, "(9xx*7)"
    for 0.1 (a property of the prompt, so that RL has no reason to move the share of long completions)."""
    operand = int(prompt[1:].split("*")[0])
    return operand >= 1000 * (1 - long_share)


def long_tail_task(
    seed: int,
    limit: int,
    num_train: int = 800,
    num_eval: int = 100,
    correct_fraction: float = 0.3,
    long_share: float = 0.1,
) -> LongTailTask:
    """Train and held-out rows (disjoint prompts) and the teacher's (prompt, completion) pairs; `limit`: the
    completion token limit the long demonstrations run near."""
    rng = random.Random(seed)
    task = dict(modulus=10, max_operand=1000, ops="*", fixed_b=7)
    eval_rows = modular_arithmetic_dataset(num_eval, seed=seed + 1, **task)
    train_rows = modular_arithmetic_dataset(num_train, seed=seed + 2, exclude={r["prompt"] for r in eval_rows}, **task)
    pairs = []
    for row in train_rows:
        answer = int(row["answer"])
        digit = answer if rng.random() < correct_fraction else (answer + 1) % 10
        repeats = rng.randrange((limit - 160) // len(FILLER), (limit - 40) // len(FILLER))
        thinking = FILLER * repeats if is_hard(row["prompt"], long_share) else ""
        pairs.append((row["prompt"], answer_text(digit, thinking)))
    return LongTailTask(train_rows, eval_rows, pairs)


def cold_start_model(task: LongTailTask, seed: int, steps: int = 150, lr: float = 3e-3):
    """(model, tokenizer): the tiny model after SFT on the teacher's pairs."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, MODEL_SPEC, seed=seed)
    sft_train(model, tokenizer, task.teacher_pairs, steps=steps, batch_size=32, lr=lr, seed=seed)
    return model, tokenizer
