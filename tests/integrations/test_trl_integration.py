"""grpo_fast.integrations.trl against TRL 1.16 itself, on CPU with the demo's tiny Qwen2 (fp32, head_dim 32).

(a) a real trl.GRPOTrainer (use_vllm=False): one batch from `_generate_and_score_completions`, made off-policy
    (old and reference logprobs perturbed), then for every loss type both TRL and grpo_fast know, at token and
    sequence level, with KL (bias-corrected), an entropy bonus, two-sided clipping, temperature 0.7 and gradient
    accumulation 2: `trainer.compute_loss(model, inputs)` and the gradients of every parameter, unpatched vs
    `use_grpo_fast(trainer)` (our head, TRL's loss) vs `use_grpo_fast(trainer, loss=True)` (our loss);
(b) the head alone against TRL's add_fused_lm_head on a soft-capped Gemma-2 (labels with -100, shift_labels);
(c) the clear failures: another TRL version, outputs we do not compute, options our loss does not have.

Tolerance: the shared rule (grpo_fast.testing.tolerance) against an fp64 oracle, TRL's own computation with the
model, its reference and the batch in fp64: ours may be off the oracle by twice what TRL's fp32 is, plus 1e-5 times
the quantity's scale. Both sides sum in fp32 with different tilings and orders, which CPUs round differently (a loss
of -0.0495 summed from terms of either sign came out 7.7e-7 apart from TRL on an Intel CPU, 5.7e-7 on an AMD one,
against the 6e-7 a fixed rtol of 1e-5 allowed): the bound follows the peer's own error on the machine at hand.
"""

from __future__ import annotations

import os
import types

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
trl = pytest.importorskip("trl")

from grpo_fast.integrations import trl as integration  # noqa: E402
from grpo_fast.integrations.trl import loss_config, trl_head_options, use_grpo_fast  # noqa: E402
from grpo_fast.loss import LOSS_TYPES  # noqa: E402
from grpo_fast.testing.tolerance import assert_within_rule  # noqa: E402

TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
LOSS_TYPES_BOTH = [name for name in TRL_LOSS_TYPES if name in LOSS_TYPES]


def _within_rule(what: str, ours, trl, oracle) -> None:
    """The tolerance rule for fp32 `ours` against fp32 `trl` (the peer) and the fp64 `oracle`: tensors, dicts of
    tensors by name (gradients) or numbers."""
    if isinstance(oracle, dict):
        for name in oracle:
            _within_rule(f"{what} {name}", ours[name], trl[name], oracle[name])
        return
    as_tensor = lambda v: (v if torch.is_tensor(v) else torch.tensor(float(v))).detach()  # noqa: E731
    assert_within_rule(what, as_tensor(ours), as_tensor(trl), as_tensor(oracle).double(), torch.float32)


def _fp64(models, run):
    """`run()` with `models` in fp64 (their parameters and buffers; fp32 -> fp64 -> fp32 is exact), then back."""
    for model in models:
        model.double()
    try:
        return run()
    finally:
        for model in models:
            model.float()


def _oracle(trainer, inputs):
    """TRL's own loss, gradients and metrics in fp64: the policy, its reference and the batch's floating tensors."""
    batch = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}
    models = [m for m in (trainer.model, getattr(trainer, "ref_model", None)) if m is not None]
    return _fp64(models, lambda: _loss_and_grads(trainer, batch))


# What every TRL trainer of these tests runs with: CPU, fp32, no vLLM, no saving or reporting.
CPU_ARGS = dict(use_vllm=False, use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
                save_strategy="no", disable_tqdm=True)  # fmt: skip


def _reward(completions, **kwargs):
    return [float(len(c) % 3) + 0.1 * c.count("1") for c in completions]


def _build(output_dir: str, peft_config=None):
    """A real GRPOTrainer on the tiny Qwen2 and one off-policy batch of its own rollouts."""
    from datasets import Dataset

    from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    args = trl.GRPOConfig(
        output_dir=output_dir,
        **CPU_ARGS,
        fp16=False,
        per_device_train_batch_size=6,
        gradient_accumulation_steps=1,
        num_generations=3,
        max_completion_length=12,
        temperature=0.7,
        beta=0.0,
        logging_steps=1,
        max_steps=1,
        seed=0,
    )
    prompts = [{"prompt": f"{a}*7=" if a % 2 else f"{a} times 7 is"} for a in range(12, 30)]
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[_reward],
        args=args,
        train_dataset=Dataset.from_list(prompts),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = trainer._generate_and_score_completions(batch)
    # the random model rarely stops: end some completions early (right padding), so the reductions differ
    lengths = torch.tensor([12, 5, 9, 12, 3, 7])
    inputs["completion_mask"] = inputs["completion_mask"] * (torch.arange(12) < lengths[:, None])
    mask = inputs["completion_mask"].bool()
    inputs["num_items_in_batch"] = mask.sum().float() + 4.0  # a global count other than this batch's
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attn, inputs["completion_ids"].shape[1]
        )
    generator = torch.Generator().manual_seed(1)
    noise = lambda s: s * torch.randn(logp.shape, generator=generator) * mask  # noqa: E731
    inputs["old_per_token_logps"] = logp + noise(0.3)
    inputs["ref_per_token_logps"] = logp + noise(0.2)
    inputs["advantages"] = inputs["advantages"] + 0.3 * torch.randn(mask.shape[0], generator=generator)
    return trainer, inputs


@pytest.fixture(scope="module")
def grpo(tmp_path_factory):
    return _build(str(tmp_path_factory.mktemp("trl")))


def _configure(trainer, loss_type: str, level: str) -> None:
    """Set the trainer's loss options as GRPOTrainer.__init__ would from a GRPOConfig."""
    clipped = loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
    trainer.loss_type = loss_type
    trainer.importance_sampling_level = level
    trainer.epsilon_low = 0.2
    trainer.epsilon_high = 1.6 if loss_type == "cispo" else 0.28
    trainer.args.delta = 1.5 if clipped else None
    trainer.beta = 0.04
    trainer.args.use_bias_correction_kl = True
    trainer.args.sapo_temperature_pos, trainer.args.sapo_temperature_neg = 0.8, 1.3
    trainer.args.vespo_k_pos, trainer.args.vespo_lambda_pos = 1.5, 2.5
    trainer.args.vespo_k_neg, trainer.args.vespo_lambda_neg = 2.5, 1.5
    trainer.entropy_coef, trainer._entropy_bonus_enabled = 0.01, True
    trainer.current_gradient_accumulation_steps = 2
    trainer.model.train()


def _loss_and_grads(trainer, inputs):
    model = trainer.model
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    for values in trainer._metrics["train"].values():
        values.clear()
    loss = trainer.compute_loss(model, inputs)
    grads = torch.autograd.grad(loss, list(params.values()))
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if v}
    return loss.detach(), dict(zip(params, grads, strict=True)), metrics


CASES = [(t, level) for t in LOSS_TYPES_BOTH for level in ("token", "sequence")]


@pytest.mark.parametrize(("loss_type", "level"), CASES, ids=[f"{t}-{lv}" for t, lv in CASES])
def test_grpo_trainer_loss_and_gradients_match_trl(grpo, loss_type, level):
    trainer, inputs = grpo
    _configure(trainer, loss_type, level)
    loss_trl, grads_trl, metrics_trl = _loss_and_grads(trainer, inputs)
    assert loss_trl.abs() > 1e-4
    loss_64, grads_64, metrics_64 = _oracle(trainer, inputs)

    with use_grpo_fast(trainer, backend="auto") as patch:
        assert len(patch.models) == 1  # no ref_model (beta was 0 at init; the batch carries reference logps)
        assert trl_head_options(trainer.model) is None  # TRL's head is out of the way
        loss_head, grads_head, metrics_head = _loss_and_grads(trainer, inputs)
    _within_rule("our head: loss", loss_head, loss_trl, loss_64)
    _within_rule("our head: gradient", grads_head, grads_trl, grads_64)
    _within_rule("our head: entropy", metrics_head["entropy"], metrics_trl["entropy"], metrics_64["entropy"])

    with use_grpo_fast(trainer, loss=True):
        loss_ours, grads_ours, metrics_ours = _loss_and_grads(trainer, inputs)
    _within_rule("our loss: loss", loss_ours, loss_trl, loss_64)
    _within_rule("our loss: gradient", grads_ours, grads_trl, grads_64)
    for key in ("entropy", "kl"):
        _within_rule(f"our loss: {key}", metrics_ours[key], metrics_trl[key], metrics_64[key])
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        if key in metrics_trl:  # shares of flagged tokens (of sequences at sequence level): counts, nearly exact
            assert metrics_ours[key] == pytest.approx(metrics_trl[key], rel=1e-6, abs=0), key

    # restored: TRL's own head and loss again
    assert "_compute_loss" not in trainer.__dict__
    assert trl_head_options(trainer.model) is not None


def test_peft_lora_grpo_trainer_matches_trl(tmp_path):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    trainer, inputs = _build(str(tmp_path), peft_config=config)
    assert isinstance(trainer.model, peft.PeftModel)
    with torch.no_grad():  # LoRA's B starts at 0: move it, so that the adapters matter
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.3)
    for loss_type in ("grpo", "dapo"):
        _configure(trainer, loss_type, "token")
        loss_trl, grads_trl, _ = _loss_and_grads(trainer, inputs)
        assert len(grads_trl) == 8 and all(".lora_" in name for name in grads_trl)
        loss_64, grads_64, _ = _oracle(trainer, inputs)
        with use_grpo_fast(trainer, loss=True):
            loss_ours, grads_ours, _ = _loss_and_grads(trainer, inputs)
        _within_rule(f"peft {loss_type}: loss", loss_ours, loss_trl, loss_64)
        _within_rule(f"peft {loss_type}: gradient", grads_ours, grads_trl, grads_64)


def test_rloo_trainer_head_matches_trl(tmp_path):
    """RLOOTrainer uses the same head entry point: our head under its own loss."""
    from datasets import Dataset

    from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model, save_tiny

    tokenizer = build_char_tokenizer()
    model_dir = save_tiny(build_tiny_model(tokenizer, seed=1), tokenizer, tmp_path / "model")  # beta > 0: a ref
    args = trl.RLOOConfig(
        output_dir=str(tmp_path / "out"),
        **CPU_ARGS,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        temperature=0.8,
        beta=0.05,
    )
    trainer = trl.RLOOTrainer(
        model=str(model_dir),
        reward_funcs=[_reward],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": f"{a}+1="} for a in range(8)]),
        processing_class=tokenizer,
    )
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))
    generator = torch.Generator().manual_seed(3)  # off the leave-one-out zero: a loss far from 0
    inputs["advantages"] = inputs["advantages"] + torch.randn(inputs["advantages"].shape, generator=generator)
    inputs["old_logps"] = inputs["old_logps"] + 0.2 * torch.randn(inputs["old_logps"].shape, generator=generator)
    trainer.current_gradient_accumulation_steps = 1
    loss_trl, grads_trl, _ = _loss_and_grads(trainer, inputs)
    assert loss_trl.abs() > 1e-3
    loss_64, grads_64, _ = _oracle(trainer, inputs)
    with use_grpo_fast(trainer) as patch:
        assert len(patch.models) == 2  # the policy and the reference model (beta > 0)
        loss_ours, grads_ours, _ = _loss_and_grads(trainer, inputs)
    _within_rule("rloo: loss", loss_ours, loss_trl, loss_64)
    _within_rule("rloo: gradient", grads_ours, grads_trl, grads_64)
    with pytest.raises(TypeError, match="GRPOTrainer"):
        use_grpo_fast(trainer, loss=True)


def test_loss_config_maps_grpo_config(grpo):
    trainer, _ = grpo
    _configure(trainer, "dapo", "sequence")
    config = loss_config(trainer)
    assert (config.loss_type, config.importance_sampling_level, config.beta) == ("dapo", "sequence", 0.04)
    assert (config.epsilon_low, config.epsilon_high, config.delta) == (0.2, 0.28, 1.5)
    assert (config.temperature, config.entropy_coef, config.max_completion_length) == (0.7, 0.01, 12)


def test_patched_trainer_trains(grpo):
    trainer, _ = grpo
    _configure(trainer, "dapo", "token")
    trainer.beta = 0.0
    trainer.current_gradient_accumulation_steps = 1
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with use_grpo_fast(trainer, loss=True):
        trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


# ------------------------------------------------------------------------------------------------------------------
# (b) the head alone
# ------------------------------------------------------------------------------------------------------------------


def _gemma2(seed=0):
    import transformers

    config = transformers.Gemma2Config(
        vocab_size=80,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        final_logit_softcapping=4.0,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    model = transformers.Gemma2ForCausalLM(config).train()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    return model


@pytest.mark.parametrize("shifted", [False, True], ids=["labels", "shift_labels"])
def test_head_matches_trl_fused_head_softcap(shifted):
    from trl.trainer.utils import add_fused_lm_head

    model = _gemma2()
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    ids = torch.randint(3, 80, (3, 10), generator=torch.Generator().manual_seed(2))
    labels = ids.clone()
    labels[:, :4] = -100
    labels[1, -2:] = -100
    key = "shift_labels" if shifted else "labels"

    def run():
        out = model(input_ids=ids, fused_lm_head=True, **{key: labels})
        total = out.log_probs.sum() + 0.3 * out.entropy.sum()
        return out, torch.autograd.grad(total, [p for p in model.parameters()])

    theirs, grads_theirs = run()
    oracle, grads_oracle = _fp64([model], run)
    trainer = types.SimpleNamespace(model=model, ref_model=None)
    with use_grpo_fast(trainer):
        ours, grads_ours = run()
    for name in ("log_probs", "entropy", "loss"):
        _within_rule(name, getattr(ours, name), getattr(theirs, name), getattr(oracle, name))
    assert torch.equal(ours.label_mask, theirs.label_mask)
    by_name = lambda grads: dict(zip([n for n, _ in model.named_parameters()], grads, strict=True))  # noqa: E731
    _within_rule("head: gradient", by_name(grads_ours), by_name(grads_theirs), by_name(grads_oracle))


# ------------------------------------------------------------------------------------------------------------------
# (c) clear failures
# ------------------------------------------------------------------------------------------------------------------


def test_other_trl_versions_are_refused(monkeypatch):
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(RuntimeError, match=r"TRL 1\.16\.x"):
        use_grpo_fast(types.SimpleNamespace(model=None, ref_model=None))


def test_unsupported_outputs_fail_or_are_skipped():
    from trl.trainer.utils import add_fused_lm_head

    policy, ref = _gemma2(), _gemma2(seed=1)
    add_fused_lm_head(policy, outputs=("log_probs", "entropy", "is_top1"))  # SFTTrainer's request
    add_fused_lm_head(ref)
    trainer = types.SimpleNamespace(model=policy, ref_model=ref)
    with pytest.raises(NotImplementedError, match="is_top1"):
        use_grpo_fast(trainer)
    assert trl_head_options(ref) is not None  # nothing was patched
    with use_grpo_fast(trainer, skip_unsupported=True) as patch:
        assert [name for name, _ in patch.skipped] == ["model"]
        assert [m for m, _ in patch.models] == [ref]
        assert trl_head_options(ref) is None
    assert trl_head_options(ref) is not None
    with pytest.raises(ValueError, match="no TRL fused LM head"):
        use_grpo_fast(types.SimpleNamespace(model=_gemma2(), ref_model=None))


def test_unsupported_loss_options_fail_clearly(grpo):
    trainer, _ = grpo
    _configure(trainer, "grpo", "token")
    trainer.top_entropy_quantile = 0.5
    try:
        with pytest.raises(NotImplementedError, match="top_entropy_quantile"):
            use_grpo_fast(trainer, loss=True)
    finally:
        trainer.top_entropy_quantile = 1.0
    assert trl_head_options(trainer.model) is not None  # nothing was patched
    with pytest.raises(ValueError, match="fused_lm_head"), use_grpo_fast(trainer):
        trainer.model(input_ids=torch.ones(1, 3, dtype=torch.long), fused_lm_head="logits")
    assert integration.HIDDEN == "grpo_fast:hidden"
