"""A learned reward model as a reward function: a transformers sequence classifier scores each
(prompt, completion) pair.

    reward:
      funcs: [{name: reward_model, path: /models/my-rm, batch_size: 16, in_process: true}]

Where it runs: on a GPU machine give it `in_process: true`, so it runs in the trainer's process, on the
GPU beside the policy, in batches. In a RewardPool worker (the default for a spec) device "auto" means
CPU (the workers stay off the trainer's GPU); the pool sends it up to `batch_size` completions per call
(its `batch_option`), with `reward.timeout` seconds per completion of the call, and a worker loads the
model in its first call.
"""

from __future__ import annotations

import logging
import math
import pickle
from collections.abc import Sequence
from typing import Any

import torch

from grpo_fast.data.tokenizer import load_tokenizer
from grpo_fast.rewards.outcomes import VerifierConfigError
from grpo_fast.rewards.pool import in_worker
from grpo_fast.rewards.registry import reward
from grpo_fast.rewards.text import completion_text

logger = logging.getLogger(__name__)

GPU_ROOM = 3  # device "auto" takes the GPU when its free memory is more than this many times the model's size

_LOADED: dict[tuple[str, str, str], tuple[Any, Any]] = {}  # (path, device, dtype) -> (model, tokenizer)


# A learned reward model pays for what its training data preferred, not for a verified answer; no model is bundled,
# so it ships no samples (the launch checklist says so), and its logits are unbounded (the checklist warns).
@reward("reward_model", kind="other", range=(-math.inf, math.inf), batch_option="batch_size")
def reward_model(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    *,
    path: str | None = None,
    batch_size: int = 16,
    device: str = "auto",
    dtype: str = "auto",
    max_length: int = 1024,
    scale: float = 1.0,
    shift: float = 0.0,
) -> list[float]:
    """`scale * score + shift` for each (prompt, completion), where score is the classifier's logit of its
    single label (num_labels == 1), or label 1's logit minus label 0's (num_labels == 2: log-odds of
    "good"); more labels are a ValueError.

    path: a local directory or hub name of an `AutoModelForSequenceClassification` and its tokenizer,
    loaded once per process and device/dtype (`load_reward_model`). device: "auto" (see
    `load_reward_model`), "cpu", "cuda", "cuda:1" ... dtype: "auto" (the checkpoint's) or a torch dtype
    name ("bfloat16"). batch_size: pairs per forward pass (grouped by length to pad little).

    Text: prompt + completion when both are strings; otherwise (chat prompts, chat completions
    `[{"role": "assistant", "content": ...}]`) the messages through the RM tokenizer's chat template, or
    their contents joined by newlines when it has none. Texts longer than max_length tokens lose their
    beginning: the score is read at the last token, so the end of the completion must stay. Batches are
    right-padded (positions of the real tokens stay those of an unpadded pass), and the model reads the
    score at the last token that is not its pad token.
    """
    if not path:
        raise VerifierConfigError("reward_model: path: the reward model's directory or hub name is required")
    for name, value in (("batch_size", batch_size), ("max_length", max_length)):
        if not isinstance(value, int) or value <= 0:
            raise VerifierConfigError(f"reward_model: {name}: expected a positive integer, got {value!r}")
    model, tokenizer = load_reward_model(path, device, dtype)
    ids = [_encode(tokenizer, p, c, max_length) for p, c in zip(prompts, completions, strict=True)]
    return [scale * s + shift for s in _score(model, ids, batch_size)]


def load_reward_model(path: str, device: str = "auto", dtype: str = "auto") -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) of `path`, loaded on the first call of this process for (path, device,
    dtype), then from a module cache (a pool worker loads it once).

    device "auto": CPU in a RewardPool worker; else the GPU
    when CUDA is available and its free memory exceeds GPU_ROOM times the model's size; else CPU. A log
    line says which and why. The model's `config.pad_token_id` is set when missing (the tokenizer's pad
    token, else its eos token): sequence classifiers find the last token of each padded row with it.

    Its weights load as transformers loads them: safetensors, or `.bin` files with `torch.load(weights_only=True)`,
    and no code of the directory (no `trust_remote_code`). A model that cannot be loaded, or whose options are
    invalid, raises VerifierConfigError (an InfrastructureError: loud, never the completions' failure).
    """
    key = (str(path), device, dtype)
    if key not in _LOADED:
        _LOADED[key] = _load(str(path), device, dtype)
    return _LOADED[key]


def _load(path: str, device: str, dtype: str) -> tuple[Any, Any]:
    from transformers import AutoModelForSequenceClassification

    if device != "auto":
        try:
            torch.device(device)
        except RuntimeError as err:
            raise VerifierConfigError(
                f"reward_model: device: expected 'auto' or a torch device, got {device!r}"
            ) from err
    if dtype != "auto" and not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise VerifierConfigError(f"reward_model: dtype: expected 'auto' or a torch dtype name, got {dtype!r}")
    try:
        tokenizer = load_tokenizer(path)
        model = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=dtype if dtype == "auto" else getattr(torch, dtype)
        )
    except (OSError, ValueError, pickle.UnpicklingError) as exc:
        reason = " ".join(str(exc).split())[:500]
        raise VerifierConfigError(
            f"reward_model: path: {path} cannot be loaded ({type(exc).__name__}: {reason})"
        ) from exc
    tokenizer.truncation_side = "left"  # keep the end of the completion (see reward_model)
    labels = model.config.num_labels
    if labels > 2:
        raise VerifierConfigError(f"reward_model: {path} has {labels} labels; expected 1 (a score) or 2 (bad, good)")
    if model.config.pad_token_id is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise VerifierConfigError(
                f"reward_model: {path}: neither the model config nor the tokenizer names a pad or eos token"
            )
        model.config.pad_token_id = pad
    target, why = _pick_device(device, model)
    model.to(target).eval()
    logger.info("reward_model: %s (%d label(s), %s) on %s: %s", path, labels, model.dtype, target, why)
    return model, tokenizer


def _pick_device(device: str, model) -> tuple[str, str]:
    """(device for `model`, why) for the `device` option (see load_reward_model)."""
    if device != "auto":
        return device, "as configured"
    if in_worker():
        return "cpu", "a worker process (give the spec in_process: true to use the trainer's GPU)"
    if not torch.cuda.is_available():
        return "cpu", "no CUDA device"
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    free, _ = torch.cuda.mem_get_info()
    if free > GPU_ROOM * size:
        return "cuda", f"{free / 2**30:.1f} GiB free on the GPU for a {size / 2**30:.2f} GiB model"
    return "cpu", f"only {free / 2**30:.1f} GiB free on the GPU for a {size / 2**30:.2f} GiB model (x{GPU_ROOM} needed)"


def _encode(tokenizer, prompt: Any, completion: Any, max_length: int) -> list[int]:
    """Token ids of one (prompt, completion), at most max_length, the end kept (see reward_model)."""
    if isinstance(prompt, str) and isinstance(completion, str):
        text, special = prompt + completion, True
    else:
        messages = _messages(prompt, "user") + _messages(completion, "assistant")
        if tokenizer.chat_template:
            text, special = tokenizer.apply_chat_template(messages, tokenize=False), False  # the template has them
        else:
            text, special = "\n".join(completion_text(m) for m in messages), True
    return tokenizer(text, add_special_tokens=special, truncation=True, max_length=max_length)["input_ids"]


def _messages(value: Any, role: str) -> list[dict]:
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)


@torch.inference_mode()
def _score(model, ids: list[list[int]], batch_size: int) -> list[float]:
    """Scores of token-id rows, batch_size rows per forward pass, right-padded with the model's pad id."""
    scores = [0.0] * len(ids)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    pad = model.config.pad_token_id
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        width = max(len(ids[i]) for i in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, i in enumerate(batch):
            input_ids[row, : len(ids[i])] = torch.tensor(ids[i])
            mask[row, : len(ids[i])] = 1
        logits = model(input_ids=input_ids.to(model.device), attention_mask=mask.to(model.device)).logits.float()
        values = logits[:, 0] if logits.shape[1] == 1 else logits[:, 1] - logits[:, 0]  # [B]
        for i, value in zip(batch, values.tolist(), strict=True):
            scores[i] = value
    return scores
