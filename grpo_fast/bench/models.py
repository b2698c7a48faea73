"""The random-init Qwen2 models of the model benchmarks: named shapes and the model-shape flags (torch and
transformers, kept apart from grpo_fast.bench.common, which torch-free benchmarks import)."""

from __future__ import annotations

import torch

from grpo_fast.core.tiny_models import TinyModelSpec, random_causal_lm

NAMED_SHAPES: dict[str, tuple[int, TinyModelSpec]] = {
    # Qwen2.5-0.5B (494M parameters with the tied embedding)
    "qwen2.5-0.5b": (
        151936,
        TinyModelSpec(896, 24, 14, 2, 4864, max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1e6),
    ),
    "tiny": (512, TinyModelSpec(64, 2, 4, 2, 176, max_position_embeddings=1024, tie_word_embeddings=True)),
}
"""name -> (vocabulary, shape) of the random-init Qwen2 models the model benchmarks run ("tiny": CPU smoke runs)."""


def add_model_shape_arguments(parser, device: bool = True) -> None:
    """--device (unless `device` is False) and the random-init Qwen2's shape flags (defaults: 4 layers,
    hidden 512, vocabulary 32k)."""
    if device:
        parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=1408)
    parser.add_argument("--vocab", type=int, default=32000)


def model_from_shape_arguments(args, max_positions: int, device):
    """A Qwen2ForCausalLM of the shape flags of `add_model_shape_arguments` (sdpa attention, untied
    embeddings), random-initialised from seed 0 on `device` itself (not on the host and copied: seconds of host
    time per process for a 0.5B model), in train mode."""
    spec = shape_of(args, max_positions)
    with torch.device(device):
        return random_causal_lm(args.vocab, spec, seed=0, attn_implementation="sdpa").train()


def shape_of(flags, max_positions: int) -> TinyModelSpec:
    """The shape named by an object's `hidden`, `layers`, `heads`, `kv_heads` and `intermediate` (the shape flags,
    or a benchmark config with the same fields), untied embeddings."""
    return TinyModelSpec(
        flags.hidden,
        flags.layers,
        flags.heads,
        flags.kv_heads,
        flags.intermediate,
        max_position_embeddings=max_positions,
    )
