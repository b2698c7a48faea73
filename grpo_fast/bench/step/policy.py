"""The policy and the prompts every contender trains on: the demo's tiny model, or a random-init Qwen2 whose EOS
probability is tuned so that completion lengths are mixed (see grpo_fast.bench.step)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import torch

from grpo_fast.bench.models import shape_of
from grpo_fast.bench.step.configs import StepConfig
from grpo_fast.core.tiny_models import (
    TinyModelSpec,
    build_char_tokenizer,
    build_tiny_model,
    build_word_tokenizer,
    random_causal_lm,
    save_tiny,
)
from grpo_fast.data.tasks import modular_arithmetic_dataset


def tune_eos(model, eos_id: int, target: float, seed: int = 0, shift_scale: float = 4.0) -> dict:
    """Makes EOS come out with mean probability `target` per token (see the module doc): a shared component
    a*u in every embedding row (a = shift_scale x the rows' mean norm), then c*u added to the lm_head's EOS
    row, c by bisection on the mean EOS probability over random contexts (the last hidden states do not depend
    on the lm_head, so they are computed once). Returns what was done and the resulting probabilities."""
    g = torch.Generator().manual_seed(seed + 1)
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    vocab, hidden = head.shape
    u = torch.randn(hidden, generator=g)
    u /= u.norm()
    with torch.no_grad():
        shift = shift_scale * float(emb.norm(dim=1).mean())
        emb.add_(shift * u)
        ids = torch.randint(3, vocab, (4, 256), generator=g)
        h = model.model(input_ids=ids).last_hidden_state.reshape(-1, hidden).float()
        proj = h @ u
        others = h @ head.float().T
        others[:, eos_id] = -math.inf
        lse = torch.logsumexp(others, dim=-1)
        base = h @ head[eos_id].float()

        def p_eos(c: float) -> torch.Tensor:
            return torch.sigmoid(base + c * proj - lse)

        lo, hi = 0.0, 1.0
        while float(p_eos(hi).mean()) < target and hi < 1e4:
            hi *= 2
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if float(p_eos(mid).mean()) < target else (lo, mid)
        coef = (lo + hi) / 2
        head[eos_id].add_(coef * u.to(head.dtype))
        p = model(input_ids=ids).logits.float().softmax(-1)[..., eos_id].flatten()
    return {
        "method": "embedding rows += a*u, lm_head[eos] += c*u (u: a random unit direction)",
        "shift_a": shift,
        "eos_coef_c": coef,
        "target_eos_prob": target,
        "eos_prob_mean": float(p.mean()),
        "eos_prob_p10": float(p.quantile(0.1)),
        "eos_prob_p90": float(p.quantile(0.9)),
    }


def expected_length(cfg: StepConfig, p: float | None) -> float | None:
    """Mean completion length (EOS included) for a constant EOS probability p after min_completion_length."""
    if p is None:
        return None
    free = cfg.max_completion_length - cfg.min_completion_length
    return cfg.min_completion_length + (1 - (1 - p) ** free) / p if free > 0 else float(cfg.max_completion_length)


def build_policy(cfg: StepConfig, path: Path) -> dict:
    """Writes the config's policy and tokenizer to `path` (a Hugging Face directory both trainers load);
    returns its description (shape, parameter count, EOS tuning)."""
    if cfg.model == "tiny":
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, TinyModelSpec(), seed=cfg.seed)
    else:
        tokenizer = build_word_tokenizer(cfg.vocab)
        spec = shape_of(cfg, max_positions=max(1024, cfg.max_model_len))
        model = random_causal_lm(cfg.vocab, spec, seed=cfg.seed, tokenizer=tokenizer)
    model.eval()
    eos = tune_eos(model, tokenizer.eos_token_id, cfg.eos_prob, cfg.seed) if cfg.eos_prob else None
    save_tiny(model, tokenizer, path)
    c = model.config
    return {
        "path": str(path),
        "architecture": type(model).__name__,
        "layers": c.num_hidden_layers,
        "hidden": c.hidden_size,
        "intermediate": c.intermediate_size,
        "heads": c.num_attention_heads,
        "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        "kv_heads": c.num_key_value_heads,
        "vocab": c.vocab_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "float32",
        "eos_tuning": eos,
        "expected_completion_length": expected_length(cfg, eos["eos_prob_mean"] if eos else None),
    }


def dataset_rows(cfg: StepConfig) -> list[dict]:
    """The training prompts (identical for every contender): modular arithmetic for tiny, random words else."""
    if cfg.model == "tiny":
        return modular_arithmetic_dataset(cfg.num_prompts, seed=2, ops="*", fixed_b=7, max_operand=1000)
    rng = random.Random(cfg.seed + 7)
    return [
        {"prompt": " ".join(f"w{rng.randrange(3, cfg.vocab)}" for _ in range(cfg.prompt_tokens))}
        for _ in range(cfg.num_prompts)
    ]
