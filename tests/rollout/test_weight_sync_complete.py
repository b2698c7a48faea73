"""A weight sync loads every weight the engine has, or fails loudly.

A sync whose names do not match the engine's (a parameter left out, a `base_model.model.` prefix, a PEFT
`modules_to_save` copy, DoRA's magnitude vectors) used to load only part of the weights: vLLM logged it at
most and generated from the previous step's weights for the rest. Every sync now checks its names against the
checkpoint the engine started from (grpo_fast.rollout.weight_check). And `trainer_weights` of a PEFT model is
what `merge_and_unload()` gives: the active `modules_to_save` copy under the base name, DoRA's merged weight
m * (W + s*B@A) / ||W + s*B@A|| (row norm), LoRA's bias; the real vLLM engine then samples with the merged
model's logprobs."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from grpo_fast.core.policy import build_sequence_batch, completion_logprobs
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model, save_tiny
from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.rollout.weight_check import WeightNameCheck, checkpoint_weight_names, synced_names
from grpo_fast.rollout.weight_sync import trainer_weights

PROMPTS = ["(12*7)%10=", "(5*7)%10=", "(431*7)%10="]


def _names(model) -> list[str]:
    return [name for name, _ in model.named_parameters()]


def _peft_model(seed: int = 0, dtype=torch.float32, **lora):
    """The tiny policy with a LoRA adapter whose trainable tensors are all moved away from their
    initialisation (B = 0 and a magnitude equal to the weight norm would make the adapter a no-op)."""
    peft = pytest.importorskip("peft")
    base = build_tiny_model(build_char_tokenizer(), seed=0).to(dtype)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], **lora)
    model = peft.get_peft_model(base, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn(param.shape, generator=gen, dtype=param.dtype))
    return model


def _merged(model):
    return copy.deepcopy(model).merge_and_unload()


# -- trainer_weights of PEFT models ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "lora",
    [
        pytest.param({"use_dora": True}, id="dora"),
        pytest.param({"lora_bias": True}, id="lora_bias"),
        pytest.param({"modules_to_save": ["lm_head", "embed_tokens"]}, id="modules_to_save"),
        pytest.param({"use_dora": True, "modules_to_save": ["lm_head"]}, id="dora+modules_to_save"),
    ],
)
def test_trainer_weights_are_peft_merge_and_unload(lora):
    """fp64: the per-tensor merge and PEFT's in-place merge run the same operations, so the tolerance is
    tight (1e-12); the base model's names, each once, nothing adapter-only."""
    model = _peft_model(dtype=torch.float64, **lora)
    synced = {name: tensor.clone() for name, tensor in trainer_weights(model)}
    merged = _merged(model)
    assert list(synced) == _names(merged) == _names(build_tiny_model(build_char_tokenizer()))
    for name, param in merged.named_parameters():
        torch.testing.assert_close(synced[name], param.detach(), rtol=0, atol=1e-12, msg=name)


def test_dora_sync_is_not_the_plain_lora_merge():
    """The magnitude vector matters: DoRA's merged q_proj differs from W + s*B@A (what ignoring
    `lora_magnitude_vector` gives)."""
    model = _peft_model(dtype=torch.float64, use_dora=True)
    synced = dict(trainer_weights(model))
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    plain = layer.base_layer.weight + layer.get_delta_weight("default")
    assert (synced["model.layers.0.self_attn.q_proj.weight"] - plain).abs().max() > 1e-3


def test_modules_to_save_syncs_the_active_copy_not_the_original():
    model = _peft_model(modules_to_save=["lm_head"])
    wrapper = model.base_model.model.lm_head
    synced = dict(trainer_weights(model))
    assert torch.equal(synced["lm_head.weight"], wrapper.modules_to_save["default"].weight)
    assert not torch.equal(synced["lm_head.weight"], wrapper.original_module.weight)
    with model.disable_adapter():  # no adapter active: the forward uses the original, so does the sync
        assert torch.equal(dict(trainer_weights(model))["lm_head.weight"], wrapper.original_module.weight)


# -- the name check ---------------------------------------------------------------------------------------


def _run(check: WeightNameCheck, names: list[str]) -> list[str]:
    return [name for name, _ in check.stream((n, torch.zeros(1)) for n in names)]


def test_name_check_passes_exactly_the_expected_names():
    check = WeightNameCheck(["a", "b", "c"])
    assert _run(check, ["b", "a", "c"]) == ["b", "a", "c"]
    check.raise_if_incomplete()


def test_name_check_reports_missing_unknown_and_repeated_names():
    check = WeightNameCheck(["a", "b", "c", "d"], source="CKPT")
    assert _run(check, ["a", "x.a", "a", "c"]) == ["a", "c"]  # what the engine receives
    with pytest.raises(RuntimeError) as err:
        check.raise_if_incomplete()
    msg = str(err.value)
    assert "2 of the 4 parameters it expects were not pushed (b, d)" in msg
    assert "1 pushed names are unknown to it (x.a)" in msg
    assert "1 names were pushed more than once (a)" in msg
    assert "CKPT" in msg


def test_name_check_lists_the_first_names_only():
    check = WeightNameCheck([f"w{i:02d}" for i in range(20)])
    _run(check, [])
    with pytest.raises(RuntimeError, match=r"20 of the 20 .* \(w00, w01, w02, w03, w04, \.\.\. 15 more\)"):
        check.raise_if_incomplete()


def test_checkpoint_weight_names_of_a_saved_model(tmp_path):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok)
    path = save_tiny(model, tok, tmp_path / "single")
    assert checkpoint_weight_names(str(path)) == set(_names(model))
    # A sharded checkpoint: the index's weight map (only it is read).
    (path / "model.safetensors").rename(path / "model-00001-of-00001.safetensors")
    weight_map = {name: "model-00001-of-00001.safetensors" for name in ["x.weight", "y.bias"]}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert checkpoint_weight_names(str(path)) == {"x.weight", "y.bias"}
    # pytorch_model.bin only
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    torch.save({"p.weight": torch.zeros(2)}, bin_dir / "pytorch_model.bin")
    assert checkpoint_weight_names(str(bin_dir)) == {"p.weight"}
    with pytest.raises(RuntimeError, match="no weight files"):
        checkpoint_weight_names(str(tmp_path))


def test_synced_names_leave_out_what_a_sync_never_pushes():
    """A checkpoint may carry rotary inv_freq buffers and, with tied embeddings, an lm_head copy of the input
    embedding: neither is a trainer parameter, so a complete sync does not push them."""
    saved = {"model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"}
    assert synced_names(saved, tied_embeddings=True) == {"model.embed_tokens.weight"}
    assert synced_names(saved, tied_embeddings=False) == {"model.embed_tokens.weight", "lm_head.weight"}


# -- the real vLLM engine ---------------------------------------------------------------------------------


def _engine_vs_model(engine, model, tok) -> float:
    """Largest |vLLM sampling logprob - model logprob| over seeded samples (fp32)."""
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    spec = SamplingSpec(n=4, max_tokens=6, temperature=1.0, stop_token_ids=(tok.eos_token_id,), seed=7)
    flat = [c for group in engine.generate(prompts, spec) for c in group]
    batch = build_sequence_batch([p for p in prompts for _ in range(4)], [c.token_ids for c in flat], tok.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(model, batch, backend="torch")
    return max(float((lp[i, : len(c.token_ids)] - torch.tensor(c.logprobs)).abs().max()) for i, c in enumerate(flat))


def test_engine_expects_the_checkpoint_names(vllm_engine, tiny_dir):
    assert vllm_engine.weight_names == set(_names(build_tiny_model(build_char_tokenizer())))
    assert str(tiny_dir) in vllm_engine.weight_names_source


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(lambda w: [(n, t) for n, t in w if n != "model.layers.1.self_attn.q_proj.weight"], id="dropped"),
        pytest.param(lambda w: [("base_model.model." + n, t) for n, t in w], id="prefixed"),
        pytest.param(lambda w: [*w, w[0]], id="repeated"),
    ],
)
def test_a_mismatched_sync_fails_and_blocks_generation(vllm_engine, mangle):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=0)
    vllm_engine.load_weights(trainer_weights(model))
    assert _engine_vs_model(vllm_engine, model, tok) < 1e-4

    other = build_tiny_model(tok, seed=1)
    with pytest.raises(RuntimeError, match="incomplete weight sync") as err:
        vllm_engine.load_weights(mangle(list(trainer_weights(other))))
    assert "stale weights" in str(err.value)
    with pytest.raises(RuntimeError, match="last weight sync failed"):
        vllm_engine.generate([tok("1")["input_ids"]], SamplingSpec())

    vllm_engine.load_weights(trainer_weights(other))  # a complete sync brings the engine back
    assert _engine_vs_model(vllm_engine, other, tok) < 1e-4


@pytest.mark.parametrize(
    "lora",
    [
        pytest.param({"use_dora": True}, id="dora"),
        pytest.param({"modules_to_save": ["lm_head"]}, id="modules_to_save"),
    ],
)
def test_vllm_samples_from_the_merged_peft_model(vllm_engine, lora):
    """After syncing a PEFT policy, vLLM's sampling logprobs are the merged model's (and the PEFT model's own
    forward's), within 1e-4 in fp32."""
    tok = build_char_tokenizer()
    model = _peft_model(**lora)
    vllm_engine.load_weights(trainer_weights(model))
    merged = _merged(model).eval()
    assert _engine_vs_model(vllm_engine, merged, tok) < 1e-4
    assert _engine_vs_model(vllm_engine, model.eval(), tok) < 1e-4
    assert _engine_vs_model(vllm_engine, build_tiny_model(tok, seed=0), tok) > 1e-2  # the adapter reached vLLM
