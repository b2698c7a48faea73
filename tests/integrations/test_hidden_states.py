"""grpo_fast.integrations.hidden on tiny random-init transformers causal LMs (one per architecture, head_dim 32):
fused_logprobs of the helper's hidden states and head equal log_softmax of the model's own `model(...).logits`
(the independent reference: the model runs its head, soft cap and scale itself), divided by a temperature.

Tolerance: the models run in fp64, so both sides agree to rounding: rtol 1e-9, atol 1e-9 on the logprobs
(and on the gradients of the LoRA head). Mixture-of-experts models run in fp32 (no fp64 grouped GEMM): the shared
rule (grpo_fast.testing.tolerance), the model's own fp32 head the peer and its head in fp64 on the same hidden
states the oracle.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from grpo_fast.integrations.hidden import completion_hidden_states, hidden_states, output_head
from grpo_fast.loss import fused_logprobs
from grpo_fast.testing.tolerance import assert_within_rule

TOL = dict(rtol=1e-9, atol=1e-9)
V, H, LAYERS, HEADS = 96, 64, 2, 2  # head_dim = H / HEADS = 32
TEMPERATURE = 0.7

# model_type -> extra config options (the head transforms are set away from their defaults, so they bite).
ARCHITECTURES = {
    "qwen2": {},
    "qwen3": {"head_dim": 32},
    "llama": {},
    "mistral": {"head_dim": 32},
    "gemma": {"head_dim": 32},
    "gemma2": {"head_dim": 32, "final_logit_softcapping": 3.0, "attn_logit_softcapping": 50.0},
    "gemma3_text": {"head_dim": 32, "final_logit_softcapping": 3.0},
    "phi": {},  # lm_head has a bias
    "phi3": {},
    "cohere": {"logit_scale": 0.5},
    "granite": {"logits_scaling": 4.0},
    "olmo2": {},
    "starcoder2": {},
    "olmo": {},
    "olmo3": {},
    "smollm3": {},
    "glm": {"head_dim": 32},
    "glm4": {"head_dim": 32},
    "helium": {"head_dim": 32},
    "stablelm": {},
    "gpt_neox": {},
    "falcon_h1": {"head_dim": 32, "lm_head_multiplier": 0.5},
    "cohere2": {"logit_scale": 0.5},
    "exaone4": {},
    "seed_oss": {"head_dim": 32},
    "minicpm3": {},
    "hunyuan_v1_dense": {"head_dim": 32},
    "arcee": {},
    "ministral": {"head_dim": 32},
    "vaultgemma": {"head_dim": 32, "final_logit_softcapping": 3.0},
    "ernie4_5": {"head_dim": 32},
    "apertus": {},
    "nemotron": {},
    "bitnet": {},
    "lfm2": {},
}
# Mixture-of-experts models: their grouped expert GEMMs have no fp64 kernel, so these run in fp32.
MOE_ARCHITECTURES = {
    "qwen3_moe": {"head_dim": 32, "moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "granitemoe": {"num_local_experts": 4, "num_experts_per_tok": 2, "logits_scaling": 4.0},
}


def _config(model_type: str, tie: bool = False, **extra):
    config_class = transformers.AutoConfig.for_model(model_type).__class__
    options = dict(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=2 * H,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    options.update(ARCHITECTURES.get(model_type, MOE_ARCHITECTURES.get(model_type, {})), **extra)
    config = config_class(**options)
    config._attn_implementation = "sdpa"
    return config


def _model(model_type: str, tie: bool = False, dtype=torch.float64, **extra):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(model_type, tie, **extra)).to(dtype).eval()
    with torch.no_grad():  # logits far from 0, so that the soft cap and the scales matter
        model.get_output_embeddings().weight.mul_(40.0)
        bias = model.get_output_embeddings().bias
        if bias is not None:
            bias.normal_(0.0, 1.0)
    return model


def _batch(seed: int = 1, batch: int = 3, length: int = 11):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, :3] = 0  # left padding, as TRL's prompts have
    mask[2, -2:] = 0  # right padding
    return ids, mask


def _reference(model, ids, mask, keep: int):
    """log p(ids[:, t+1]) for the last `keep` predicted tokens, from the model's own logits."""
    logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep + 1).logits[:, :-1]
    return torch.log_softmax(logits / TEMPERATURE, dim=-1).gather(-1, ids[:, -keep:, None]).squeeze(-1)


def _ours(model, ids, mask, keep: int):
    hidden = completion_hidden_states(model, ids, mask, keep)
    head = output_head(model)
    return fused_logprobs(hidden, head.weight, ids[:, -keep:], TEMPERATURE, bias=head.bias, **head.transform_kwargs())


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_logprobs_match_model_logits(model_type):
    model = _model(model_type)
    ids, mask = _batch()
    with torch.no_grad():
        ours, ref = _ours(model, ids, mask, 6), _reference(model, ids, mask, 6)
    # padding rows are not compared: the model's padded positions are arbitrary
    valid = mask[:, -6:].bool()
    torch.testing.assert_close(ours[valid], ref[valid], **TOL)
    if model_type in ("gemma2", "gemma3_text", "cohere", "cohere2", "granite", "falcon_h1", "vaultgemma"):
        head = output_head(model).head
        assert (head.logit_scale, head.final_logit_softcapping) != (1.0, None), "the transform must be read"


@pytest.mark.parametrize("model_type", list(MOE_ARCHITECTURES))
def test_moe_logprobs_match_model_logits_fp32(model_type):
    model = _model(model_type, dtype=torch.float32)
    ids, mask = _batch()
    oracle_model = copy.deepcopy(model)  # the same fp32 backbone; its head in fp64 on the fp32 hidden states
    oracle_model.get_output_embeddings().double().register_forward_pre_hook(lambda _, args: (args[0].double(),))
    with torch.no_grad():
        ours, ref = _ours(model, ids, mask, 6), _reference(model, ids, mask, 6)
        oracle = _reference(oracle_model, ids, mask, 6)
    valid = mask[:, -6:].bool()
    assert oracle.dtype == torch.float64
    assert_within_rule("logprobs", ours[valid], ref[valid], oracle[valid], torch.float32)


@pytest.mark.parametrize("model_type", ["qwen2", "gemma", "cohere"])
def test_tied_embeddings(model_type):
    model = _model(model_type, tie=True)
    head = output_head(model)
    assert head.weight is model.get_input_embeddings().weight
    ids, mask = _batch(seed=2)
    with torch.no_grad():
        torch.testing.assert_close(_ours(model, ids, mask, 5), _reference(model, ids, mask, 5), **TOL)


@pytest.mark.parametrize("keep", [0, 1, 4, "tensor"])
def test_logits_to_keep_is_transformers(keep):
    model = _model("qwen2")
    ids, mask = _batch(seed=3)
    keep = torch.tensor([0, 3, 7]) if keep == "tensor" else keep
    with torch.no_grad():
        hidden = hidden_states(model, ids, mask, logits_to_keep=keep)
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep).logits
        head = output_head(model)
        torch.testing.assert_close(hidden @ head.weight.T, logits, **TOL)


def test_bad_arguments_name_themselves():
    model = _model("qwen2")
    ids, mask = _batch()
    with pytest.raises(ValueError, match="logits_to_keep"):
        hidden_states(model, ids, mask, logits_to_keep=-1)
    with pytest.raises(ValueError, match="num_completion_tokens"):
        completion_hidden_states(model, ids, mask, ids.shape[1])
    with pytest.raises(TypeError, match="model"):
        output_head(torch.nn.Linear(2, 2))


# ------------------------------------------------------------------------------------------------------------------
# PEFT
# ------------------------------------------------------------------------------------------------------------------


def _peft_model(target_modules, dropout=0.0, **options):
    peft = pytest.importorskip("peft")
    model = _model("qwen2")
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=target_modules, **options)
    model = peft.get_peft_model(model, config)
    with torch.no_grad():  # LoRA's B starts at 0: move it so the adapters change the output
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    return model


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["q_proj", "lm_head"]], ids=["backbone", "lm_head"])
def test_peft_lora_logprobs_and_gradients(targets):
    model = _peft_model(targets)
    model.train()  # no dropout in the tiny model; training mode exercises the dropout check
    ids, mask = _batch(seed=4)
    valid = mask[:, -5:].bool()
    params = [p for n, p in model.named_parameters() if p.requires_grad]
    ours = _ours(model, ids, mask, 5)
    grads_ours = torch.autograd.grad(ours[valid].sum(), params)
    ref = _reference(model, ids, mask, 5)
    grads_ref = torch.autograd.grad(ref[valid].sum(), params)
    torch.testing.assert_close(ours[valid], ref[valid], **TOL)
    for got, want in zip(grads_ours, grads_ref, strict=True):
        torch.testing.assert_close(got, want, **TOL)
    if "lm_head" in targets:  # the adapter on the head is in the effective weight
        base = model.get_base_model().lm_head.get_base_layer().weight
        assert not torch.equal(output_head(model).weight, base)


def test_peft_modules_to_save_head():
    model = _peft_model(["q_proj"], modules_to_save=["lm_head"])
    with torch.no_grad():
        model.get_base_model().lm_head.modules_to_save["default"].weight.mul_(1.5)
    ids, mask = _batch(seed=5)
    valid = mask[:, -5:].bool()
    with torch.no_grad():
        torch.testing.assert_close(_ours(model, ids, mask, 5)[valid], _reference(model, ids, mask, 5)[valid], **TOL)


def test_peft_unsupported_heads_raise():
    model = _peft_model(["lm_head"], dropout=0.1).train()
    with pytest.raises(NotImplementedError, match="lora_dropout"):
        output_head(model)
    model.eval()  # dropout is the identity in eval mode
    output_head(model)
    with pytest.raises(NotImplementedError, match="DoRA"):
        output_head(_peft_model(["lm_head"], use_dora=True))
    peft = pytest.importorskip("peft")
    prefix = peft.get_peft_model(_model("qwen2"), peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2))
    with pytest.raises(NotImplementedError, match="prompt-learning"):
        hidden_states(prefix, *_batch())
