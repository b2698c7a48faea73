"""`logit_head` on tiny random transformers models whose head does more than h Wᵀ + b, checked against the
model itself: fused_logprobs on the backbone's hidden states and the lm_head weight, with the head transform
that `logit_head(model)` reads, must equal log_softmax(model(ids).logits / T) (the model's forward applies
its own soft cap / scale). Each model's transform is made large enough that ignoring it is off by > 1e-2.

Tolerances: fp64 through the torch backend, 1e-10 · max(1, max |reference|) (only rounding differs; 1e-5 for
xLSTM, whose forward casts its logits to fp32); fp32
through every CPU backend, the rule of grpo_fast.testing.tolerance (at most twice the fp32 model's own error
against the fp64 model, plus 1e-5 · max(1, max |reference|)).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import asdict
from types import SimpleNamespace

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is defined

import pytest  # noqa: E402
import transformers  # noqa: E402

from grpo_fast import GRPOLossConfig, fused_logprobs  # noqa: E402
from grpo_fast.core.policy import backbone, lm_head_params  # noqa: E402
from grpo_fast.loss.head import LogitHead, logit_head, with_model_head  # noqa: E402
from grpo_fast.testing.tolerance import ATOL, assert_within_rule, max_error  # noqa: E402

VOCAB = 97
TEMPERATURE = 0.7
DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
DECODER_GQA = dict(DECODER, num_key_value_heads=1)


def _gemma2():
    config = transformers.Gemma2Config(**DECODER_GQA, head_dim=16, final_logit_softcapping=1.5)
    return transformers.Gemma2ForCausalLM(config), LogitHead(1.0, 1.5)


def _cohere():
    config = transformers.CohereConfig(**DECODER_GQA, logit_scale=0.25, bos_token_id=1, eos_token_id=2)
    return transformers.CohereForCausalLM(config), LogitHead(0.25)


def _granite():
    config = transformers.GraniteConfig(**DECODER_GQA, logits_scaling=4.0)
    return transformers.GraniteForCausalLM(config), LogitHead(0.25)


def _minicpm3():  # hidden states divided by hidden_size / dim_model_base = 4
    lora = dict(q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)
    config = transformers.MiniCPM3Config(**DECODER, num_key_value_heads=2, dim_model_base=8, **lora)
    return transformers.MiniCPM3ForCausalLM(config), LogitHead(0.25)


def _falcon_h1():
    mamba = dict(mamba_d_ssm=32, mamba_n_heads=2, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8)
    config = transformers.FalconH1Config(**DECODER_GQA, lm_head_multiplier=0.5, mamba_chunk_size=8, **mamba)
    return transformers.FalconH1ForCausalLM(config), LogitHead(0.5)


def _xlstm():
    config = transformers.xLSTMConfig(
        vocab_size=VOCAB, hidden_size=64, embedding_dim=64, num_heads=2, num_blocks=1, chunk_size=8
    )
    config.output_logit_soft_cap = 1.5
    return transformers.xLSTMForCausalLM(config), LogitHead(1.0, 1.5)


def _muse_glimmer():  # scale, then soft cap
    text = dict(DECODER_GQA, head_dim=16, final_logit_softcapping=2.0, output_multiplier=0.5, bos_token_id=0)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    config = transformers.MuseGlimmerConfig(text_config=dict(text, eos_token_id=1), vision_config=vision)
    return transformers.MuseGlimmerForConditionalGeneration(config), LogitHead(0.5, 2.0)


def _inkling():  # hidden states divided by logits_mup_width_multiplier; a dense MLP (grouped MoE GEMMs take no fp64)
    attention = dict(head_dim=16, swa_num_attention_heads=2, swa_num_key_value_heads=1, swa_head_dim=16)
    config = transformers.InklingTextConfig(
        **DECODER_GQA, **attention, mlp_layer_types=["dense"], logits_mup_width_multiplier=4.0, rel_extent=16
    )
    return transformers.InklingForCausalLM(config), LogitHead(0.25)


MODELS = {
    "gemma2": _gemma2,
    "cohere": _cohere,
    "granite": _granite,
    "minicpm3": _minicpm3,
    "falcon_h1": _falcon_h1,
    "xlstm": _xlstm,
    "muse_glimmer": _muse_glimmer,
    "inkling": _inkling,
}


def _model(name: str, dtype: torch.dtype):
    """(model in eval mode, the head its config describes); logits of spread ~10 before the head, so that
    the soft caps saturate and the scales matter."""
    torch.manual_seed(0)
    model, head = MODELS[name]()
    model = model.to(dtype).eval()
    with torch.no_grad():
        weight = model.get_output_embeddings().weight
        weight.copy_(torch.randn(weight.shape, dtype=dtype) * (10.0 / weight.shape[1] ** 0.5))
    return model, head


def _ids():
    return torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))


def _model_logprobs(model, ids):
    """([B, T-1] log_softmax(model(ids).logits / T) of the next tokens: the model's own head, materialised;
    the dtype of its logits)."""
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
    logp = torch.log_softmax(logits.double() / TEMPERATURE, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return logp, logits.dtype


def _fused_logprobs(model, ids, backend, **head):
    """[B, T-1] fused_logprobs of the next tokens from the backbone's hidden states and the lm_head."""
    with torch.no_grad():
        hidden = backbone(model)(input_ids=ids, use_cache=False).last_hidden_state[:, :-1]
        weight, bias = lm_head_params(model)
        return fused_logprobs(hidden, weight, ids[:, 1:], TEMPERATURE, backend, bias=bias, **head)


@pytest.mark.parametrize("name", MODELS)
def test_head_of_each_model_matches_its_logits_fp64(name):
    model, head = _model(name, torch.float64)
    assert logit_head(model) == head
    assert logit_head(model.config) == head
    ids = _ids()
    reference, logits_dtype = _model_logprobs(model, ids)  # xLSTM's forward returns fp32 logits: 1e-5 there
    ours = _fused_logprobs(model, ids, "torch", **asdict(logit_head(model)))
    bound = ATOL[logits_dtype] * max(1.0, reference.abs().max().item())
    assert max_error(ours, reference) <= bound
    assert max_error(_fused_logprobs(model, ids, "torch"), reference) > 1e-2  # the head matters here


def _backends():
    for name, module in (("torch", None), ("cpu", "native"), ("triton", "triton")):
        try:
            if module is not None:
                importlib.import_module(f"grpo_fast.backends.{module}")
        except ImportError:
            continue
        yield name


@pytest.mark.parametrize("backend", list(_backends()))
@pytest.mark.parametrize("name", ["gemma2", "muse_glimmer", "cohere"])
def test_head_in_every_backend_fp32(name, backend):
    model, head = _model(name, torch.float32)
    ids = _ids()
    ours = _fused_logprobs(model, ids, backend, **asdict(head))
    peer, _ = _model_logprobs(model, ids)  # the fp32 model's own logits
    oracle, _ = _model_logprobs(model.double(), ids)
    assert_within_rule(f"{name} logp ({backend})", ours, peer, oracle, torch.float32)


def test_trainer_loss_step_uses_the_head():
    """The GRPO loss step's config and logprobs carry the model's soft cap (a Gemma-2 policy)."""
    from grpo_fast.core.policy import build_sequence_batch
    from grpo_fast.trainer.config import load_config
    from grpo_fast.trainer.loss_step import LossStep

    model, head = _model("gemma2", torch.float32)
    overrides = ["rollout.num_generations=2", "run.micro_batch_size=2", f"rollout.temperature={TEMPERATURE}"]
    config = load_config(None, overrides)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    step = LossStep(config, model, optimizer, scheduler, pad_token_id=0)
    assert (step.loss_config.logit_scale, step.loss_config.final_logit_softcapping) == (1.0, 1.5)
    ids = _ids()
    batch = build_sequence_batch([row[:3].tolist() for row in ids], [row[3:].tolist() for row in ids], 0)
    reference = _model_logprobs(model.double(), ids)[0][:, 2:]  # the completion tokens ids[:, 3:]
    ours = step.logprobs(model.float(), batch)
    torch.testing.assert_close(ours.double(), reference, rtol=0, atol=1e-4)


def test_with_model_head_fills_in_and_rejects_a_conflict():
    model, head = _model("muse_glimmer", torch.float32)
    config = with_model_head(GRPOLossConfig(temperature=TEMPERATURE), model)
    assert (config.logit_scale, config.final_logit_softcapping, config.temperature) == (0.5, 2.0, TEMPERATURE)
    agreeing = with_model_head(GRPOLossConfig(final_logit_softcapping=2.0), model)
    assert agreeing == with_model_head(GRPOLossConfig(), model)
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        with_model_head(GRPOLossConfig(final_logit_softcapping=30.0), model)


def test_config_reading_follows_trl():
    """TRL's reading order and conventions, on configs alone (the models need not be built)."""
    assert logit_head(transformers.Gemma2Config()) == LogitHead(1.0, 30.0)
    assert logit_head(transformers.Gemma3TextConfig()) == LogitHead(1.0, None)
    assert logit_head(transformers.CohereConfig()) == LogitHead(0.0625, None)
    assert logit_head(transformers.LlamaConfig()) == LogitHead()
    assert logit_head(transformers.MptConfig()) == LogitHead()  # logit_scale None: no scale
    assert logit_head(SimpleNamespace(model_type="hyperclovax", logits_scaling=2.0)) == LogitHead(2.0)  # multiplies
    assert logit_head(SimpleNamespace(model_type="granite", logits_scaling=2.0)) == LogitHead(0.5)
    # logit_scale wins over logits_scaling (TRL's order)
    assert logit_head(SimpleNamespace(model_type="x", logit_scale=3.0, logits_scaling=2.0)) == LogitHead(3.0)


def test_inexpressible_heads_raise():
    sliced = transformers.InklingTextConfig(vocab_size=128, unpadded_vocab_size=100)
    with pytest.raises(NotImplementedError, match="unpadded_vocab_size"):
        logit_head(sliced)
    with pytest.raises(NotImplementedError, match="logit_scale"):
        logit_head(transformers.MptConfig(logit_scale="inv_sqrt_d_model"))
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        logit_head(SimpleNamespace(model_type="x", final_logit_softcapping=0.0))
