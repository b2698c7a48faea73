"""The random-init Qwen2 of the benchmarks' model-shape flags (torch and transformers: kept apart from
grpo_fast.bench.common, which torch-free benchmarks import)."""

from __future__ import annotations

import torch

from grpo_fast.core.tiny_models import TinyModelSpec, random_qwen2


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
    embeddings), random-initialised from seed 0, on `device` in train mode."""
    spec = TinyModelSpec(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.intermediate,
        max_position_embeddings=max_positions,
    )
    return random_qwen2(args.vocab, spec, seed=0, attn_implementation="sdpa").to(device).train()
