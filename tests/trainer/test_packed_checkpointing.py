"""Packed micro-batches under gradient checkpointing (TRL's GRPOConfig turns it on by default). A checkpointed
layer's forward runs again in the backward, after `packed_hidden` has given the model its own attention back, so
the per-sequence path would be recomputed as another attention: torch's checkpoint check stopped the step. The
packed rows of a checkpointed model take the model's own attention with the block-diagonal mask instead, the same
in the forward and its recomputation."""

from __future__ import annotations

import pytest
from tiny_trainer import tiny_trainer

from grpo_fast.core.packed_attention import attention_path
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model


def test_a_checkpointed_model_packs_with_the_block_diagonal_mask_and_trains(tmp_path):
    trainer = tiny_trainer(tmp_path, "model.gradient_checkpointing=true", "run.packing=true", "run.max_steps=1")
    try:
        metrics = trainer.train()
    finally:
        trainer.close()
    assert trainer.step == 1 and metrics["train/backbone_tokens"] > 0
    model = build_tiny_model(build_char_tokenizer())
    assert attention_path(model) == "per_sequence"
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert attention_path(model) == "block_mask"
    with pytest.raises(ValueError, match="run.packed_attention: per_sequence does not run under"):
        attention_path(model, "per_sequence")
