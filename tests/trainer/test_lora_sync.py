"""LoRA policies sync to the rollout engine as merged base weights under the base model's HF names."""

import pytest
import torch

from grpo_fast.demo.tiny import build_char_tokenizer, build_tiny_model
from grpo_fast.rollout.weight_sync import trainer_weights

peft = pytest.importorskip("peft")


def test_trainer_weights_of_a_lora_model_are_the_merged_base_weights():
    base = build_tiny_model(build_char_tokenizer(), seed=0)
    original = {name: param.detach().clone() for name, param in base.named_parameters()}
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # B starts at zero (a no-op adapter): make the adapter change the weights
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)

    # Copy each tensor as it is yielded, as the engine does while it loads: they are the live (merged) weights.
    synced = {name: tensor.clone() for name, tensor in trainer_weights(lora)}
    assert list(synced) == list(original)
    for name, param in lora.base_model.model.named_parameters():  # the model itself is untouched
        if "lora_" not in name:
            torch.testing.assert_close(param.detach(), original[name.replace(".base_layer", "")], rtol=0, atol=0)

    merged = lora.merge_and_unload()
    for name, param in merged.named_parameters():
        torch.testing.assert_close(synced[name], param.detach(), rtol=1e-6, atol=1e-6)
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert (synced[q_proj] - original[q_proj]).abs().max() > 1e-3, "the adapter must reach the synced weights"
