"""LoRA policies sync to the rollout engine as merged base weights under the base model's HF names."""

import pytest
import torch

from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
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


def test_lora_reference_is_the_base_without_dropout(tmp_path):
    """beta > 0 with a PEFT model: no deep copy; the reference is the policy with adapters disabled, computed
    in eval mode even though the policy is training (its dropout must not make the KL noisy)."""
    from grpo_fast.core.policy import build_sequence_batch, completion_logprobs
    from grpo_fast.trainer import GRPOTrainer, load_config

    tok = build_char_tokenizer()
    base = build_tiny_model(tok, seed=0)
    for module in base.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5  # dropout in training mode
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for name, p in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)  # adapters that change the logprobs
    opts = ["rollout.engine=hf", "loss.beta=0.1", "run.tensorboard=false", f"run.output_dir={tmp_path}"]
    trainer = GRPOTrainer(
        lora, ["exact_match"], [{"prompt": "1", "answer": "1"}], load_config(None, opts), tokenizer=tok
    )
    assert trainer.loss_step.ref_model is None
    batch = build_sequence_batch([[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14, 15]], tok.pad_token_id)
    lora.train()
    ref = trainer.loss_step.reference_logprobs(batch)
    assert lora.training
    base_copy = build_tiny_model(tok, seed=0).eval()
    with torch.no_grad():
        expected = completion_logprobs(base_copy, batch)
    mask = batch.completion_mask  # padding positions carry no logprob
    torch.testing.assert_close(ref[mask], expected[mask], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        policy = completion_logprobs(lora.eval(), batch)
    assert (policy - expected).abs().max() > 1e-3
