"""The parameters of one fuzz case, drawn from its seed: which entry point, shapes, dtype, layout, mask,
loss type and every option, and the kind of each per-token input.

A case is (backend, seed). The parameters are a JSON-able dict drawn with `random.Random(seed)`, so that a
seed names the same case on every backend, except that the Triton backend (slow under TRITON_INTERPRET=1)
draws from a smaller size profile. `grpo_fast.testing.fuzz.inputs.build` turns them into tensors.
"""

from __future__ import annotations

import random

# The built-in loss types, fixed here (not read from the registry, which tests may extend) so a seed keeps
# naming the same case; the trust-region ones are drawn last (`_draw_trust_region`), so that adding them left every
# earlier draw of a seed as it was.
LOSS_TYPE_NAMES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
TRUST_REGION_NAMES = ("icepop", "kpop", "ipo", "dppo_tv", "dppo_kl", "gmpo")
TRUST_REGION_SHARE = 0.35
APIS = ("grpo_loss", "GRPOLoss", "fused_logprobs", "logits_grpo_loss")
BACKENDS = ("torch", "cpu", "triton")

# Largest B, T, H, V per size profile; Triton's interpreter tiles are 16 rows x 128 columns x 32 (K), so its
# profile still leaves row, vocabulary and K tails.
PROFILES = {
    "full": dict(batch=6, length=20, hidden=80, vocab=2100),
    "interpreter": dict(batch=4, length=12, hidden=48, vocab=400),
}


def draw_params(backend: str, seed: int) -> dict:
    """The parameters of case (backend, seed); see the module docstring. Keys: see `_draw_*` below."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    rng = random.Random(seed)
    profile = PROFILES["interpreter" if backend == "triton" else "full"]
    params = {"backend": backend, "seed": seed}
    params["api"] = _choice(rng, APIS, (0.5, 0.15, 0.15, 0.2))
    if params["api"] == "logits_grpo_loss" and backend != "torch":  # it runs the torch epilogue only
        params["api"] = "grpo_loss"
    params["dtype"] = _draw_dtype(rng, backend)
    params |= _draw_shape(rng, profile)
    params |= _draw_mask(rng, params)
    params |= _draw_logits(rng, params)
    params |= _draw_token_inputs(rng, params)
    params["config"] = _draw_config(rng, params)
    params |= _draw_entry_point(rng, params)
    params |= _draw_trust_region(rng, params)
    return params


def _choice(rng: random.Random, options, weights=None):
    return rng.choices(options, weights=weights)[0]


def _draw_dtype(rng: random.Random, backend: str) -> str:
    """fp32 half of the time, bf16 and fp16 a quarter each; fp64 (the gradcheck dtype) sometimes for the
    chunked backends (the Triton kernels take no fp64)."""
    if rng.random() < 0.05 and backend != "triton":
        return "float64"
    return _choice(rng, ("float32", "bfloat16", "float16"), (0.5, 0.25, 0.25))


def _draw_shape(rng: random.Random, profile: dict) -> dict:
    """B, T (the padded length; packed: the longest sequence at most), H, V: odd sizes, V around the Triton
    vocabulary tile (128) and below it, H around the K tile (32)."""
    vocab_kind = _choice(rng, ("tiny", "tile", "medium", "large"), (0.3, 0.15, 0.4, 0.15))
    vocab = {
        "tiny": lambda: rng.randint(2, 40),
        "tile": lambda: rng.choice((127, 128, 129, 255, 257, 383, 385)),
        "medium": lambda: rng.randint(41, 700) | 1,
        "large": lambda: rng.randint(700, 2100) | 1,
    }[vocab_kind]()
    hidden = rng.choice((1, 2, 31, 32, 33, rng.randint(1, profile["hidden"])))
    return dict(
        B=rng.randint(1, profile["batch"]),
        T=rng.randint(1, profile["length"]),
        H=min(hidden, profile["hidden"]),
        V=min(vocab, profile["vocab"]),
    )


def _draw_mask(rng: random.Random, params: dict) -> dict:
    """Layout and mask. Padded: right padding ("ragged"), random holes, or full rows. Packed: ragged
    `cu_seqlens` with empty sequences, all active or with holes. Then, sometimes, whole sequences or the whole
    batch masked out, and junk (NaN, inf, ids out of range) at masked positions."""
    batch, length = params["B"], params["T"]
    layout = _choice(rng, ("padded", "packed"), (0.6, 0.4))
    out = {"layout": layout, "mask_dtype": rng.choice(("bool", "int64", "int32", "float32"))}
    if layout == "packed":
        out["lengths"] = [0 if rng.random() < 0.15 else rng.randint(1, length) for _ in range(batch)]
        out["holes"] = rng.random() < 0.3
        out["cu_dtype"] = rng.choice(("int64", "int32"))
    else:
        out["lengths"] = [rng.randint(1, length) for _ in range(batch)]
        out["holes"] = rng.random() < 0.25
    out["masked_out"] = _choice(rng, ("none", "rows", "batch"), (0.8, 0.15, 0.05))
    out["masked_rows"] = sorted(rng.sample(range(batch), rng.randint(1, batch))) if out["masked_out"] == "rows" else []
    out["junk_at_padding"] = rng.random() < 0.2
    return out


def _draw_logits(rng: random.Random, params: dict) -> dict:
    """Logit magnitude: "normal" (std 0.3-5), "large" (std 30-1e4, fp16 3e3: exp overflows without the running max), or
    "extreme" (max |logit| up to 1e36 through logit_scale: near fp32's limit; not for fp16, whose gradients
    could not hold such scales). Head transform: bias, logit_scale, final_logit_softcapping, temperature."""
    regimes, weights = ("normal", "large", "extreme"), (0.8, 0.12, 0.08)
    regime = _choice(rng, regimes, weights)
    if regime == "extreme" and params["dtype"] == "float16":
        regime = "large"
    largest = 3.5 if params["dtype"] == "float16" else 4.0  # fp16 logits (and their GEMM) stay below 65504
    std = {"normal": rng.uniform(0.3, 5.0), "large": 10 ** rng.uniform(1.5, largest), "extreme": 1.0}[regime]
    return dict(
        regime=regime,
        logit_std=std,
        extreme_max_logit=10 ** rng.uniform(4.0, 36.0) if regime == "extreme" else None,
        bias=rng.random() < 0.3,
        temperature=1.0 if rng.random() < 0.4 else rng.uniform(0.3, 2.5),
        logit_scale=1.0 if rng.random() < 0.7 else 10 ** rng.uniform(-0.6, 0.6),
        softcap=None if rng.random() < 0.7 or regime == "extreme" else 10 ** rng.uniform(-0.3, 1.7),
    )


def _draw_token_inputs(rng: random.Random, params: dict) -> dict:
    """Kinds of the per-token inputs: advantages (shape and values, including 0 and ±1e4 (fp16: ±10)), old logprobs
    (none: on-policy, near, or far from the current ones), reference logprobs, importance weights
    (per token or per sequence), num_items_in_batch (its accepted types). Extreme logits keep the policy
    on-policy and the reference unused: their logprobs are exact to ~1e-7 relative, so no log-ratio or
    KL of them is meaningful."""
    extreme = params["regime"] == "extreme"
    half = params["dtype"] == "float16"  # gradients past 65504 overflow fp16: advantages ±10 at most, no far ratios
    old = "none" if extreme else _choice(rng, ("none", "near", "far"), (0.35, 0.45, 0.0 if half else 0.2))
    ref = "far" if params["regime"] == "large" or rng.random() < 0.2 else "near"
    return dict(
        adv_shape=_choice(rng, ("sequence", "sequence_column", "token"), (0.5, 0.15, 0.35)),
        adv_values=_choice(rng, ("normal", "zero", "huge", "mixed"), (0.6, 0.1, 0.1, 0.2)),
        adv_huge=10.0 if half else 1e4,
        old=old,
        drift=10 ** rng.uniform(-2, 0) if old == "near" else rng.uniform(3.0, 30.0),
        ref="none" if extreme else ("near" if half else ref),
        is_weights=_choice(rng, ("none", "token", "sequence", "sequence_column"), (0.5, 0.25, 0.15, 0.1)),
        num_items=_choice(
            rng, ("none", "int", "float", "tensor_int", "tensor_float", "tensor_1"), (0.4,) + (0.12,) * 5
        ),
        num_items_factor=rng.uniform(0.5, 3.0),
    )


def _draw_config(rng: random.Random, params: dict) -> dict:
    """GRPOLossConfig's keyword arguments: every loss type and option."""
    loss_type = rng.choice(LOSS_TYPE_NAMES)
    config = dict(loss_type=loss_type, backend=params["backend"])
    if rng.random() < 0.1 and params["backend"] == "cpu":
        config["backend"] = "auto"  # the cpu backend on a CPU machine (the report's environment records it)
    config["epsilon_low"] = _choice(rng, (0.2, 0.0, rng.uniform(0.01, 0.6)), (0.4, 0.1, 0.5))
    if loss_type == "cispo":
        config["epsilon_high"] = rng.choice((5.0, rng.uniform(0.5, 8.0)))
    elif rng.random() < 0.5:
        config["epsilon_high"] = rng.choice((0.28, rng.uniform(0.0, 1.0)))
    clip_high = config.get("epsilon_high", config["epsilon_low"])
    if rng.random() < 0.3:
        config["delta"] = 1.0 + clip_high + rng.uniform(0.01, 3.0)
    if rng.random() < 0.5 and params["ref"] != "none":
        config["beta"] = 10 ** rng.uniform(-3, 0)
        config["use_bias_correction_kl"] = rng.random() < 0.5
    if rng.random() < 0.3:
        config["sapo_temperature_pos"] = rng.uniform(0.1, 3.0)
        config["sapo_temperature_neg"] = rng.uniform(0.1, 3.0)
    if rng.random() < 0.3:  # k <= 5: φ = exp(λ + k log W − λ W) stays finite in fp32 (as in fp64) for log W <= 20
        for sign in ("pos", "neg"):
            config[f"vespo_k_{sign}"] = rng.uniform(0.0, 5.0)
            config[f"vespo_lambda_{sign}"] = rng.choice((0.0, rng.uniform(0.0, 6.0)))
    config["temperature"] = params["temperature"]
    config["logit_scale"] = params["logit_scale"]
    config["final_logit_softcapping"] = params["softcap"]
    if rng.random() < 0.5:
        config["entropy_coef"] = rng.uniform(-0.2, 0.2)
    config["top_entropy_quantile"] = _choice(rng, (1.0, 0.0, rng.uniform(0.0, 1.0)), (0.6, 0.1, 0.3))
    if rng.random() < 0.35:
        config["off_policy_mask_threshold"] = rng.uniform(-1.0, 2.0)
    config["importance_sampling_level"] = rng.choice(("token", "sequence"))
    if rng.random() < 0.3:
        config["max_completion_length"] = rng.randint(1, 2 * params["T"] + 3)
    config["workspace_bytes"] = _choice(
        rng, (None, 1, 4 * params["V"] * rng.randint(1, 8) + rng.randint(0, 4 * params["V"] - 1)), (0.3, 0.2, 0.5)
    )
    config["deterministic"] = rng.random() < 0.3
    return config


def _draw_trust_region(rng: random.Random, params: dict) -> dict:
    """For a share of the loss cases (not extreme logits, whose logprobs carry no meaningful differences): a
    trust-region loss type instead, its options drawn where its masks act, token-level where its ratio is its own,
    and, for an objective that reads them, the inference engine's logprobs drawn near the old ones."""
    draws = (rng.random(), rng.choice(TRUST_REGION_NAMES), rng.uniform(0.05, 0.6), random.Random(rng.random()))
    chosen, name, drift, option_rng = draws
    if chosen >= TRUST_REGION_SHARE or params["regime"] == "extreme" or params["api"] == "fused_logprobs":
        return {"rollout": "none"}
    config = params["config"]
    config["loss_type"], config["objective_options"] = name, _objective_options(option_rng, name)
    if name in ("ipo", "dppo_tv", "dppo_kl", "gmpo"):
        config["importance_sampling_level"] = "token"
    return {"rollout": "near" if name in ("icepop", "kpop", "ipo") else "none", "rollout_drift": drift}


def _objective_options(rng: random.Random, name: str) -> dict:
    """A trust-region objective's options (loss.objective_options), around where its mask or clip acts."""
    if name == "icepop":
        return dict(alpha=rng.uniform(0.3, 0.95), beta=rng.uniform(1.05, 3.0))
    if name == "kpop":
        return dict(threshold=10 ** rng.uniform(-3.0, 0.0))
    if name == "ipo":
        return dict(threshold=rng.uniform(0.01, 0.4), adv_tau=rng.uniform(0.5, 1.5), kl_tau=rng.choice((0.0, 0.01)))
    if name in ("dppo_tv", "dppo_kl"):
        low, high = (10 ** rng.uniform(-3.0, -0.5) for _ in range(2))
        return dict(divergence_low=low, divergence_high=high, ratio_cap=rng.choice((20.0, rng.uniform(1.2, 5.0))))
    return dict(clip_low=rng.uniform(0.05, 0.6), clip_high=rng.uniform(0.05, 0.6))


def _draw_entry_point(rng: random.Random, params: dict) -> dict:
    """What the entry point takes beyond the config: GRPOLoss built from a config or from keywords;
    fused_logprobs' flat or [B, T] shapes and whether it returns entropies; logits_grpo_loss in place."""
    return dict(
        module_from_keywords=rng.random() < 0.5,
        flat_targets=rng.random() < 0.5,
        return_entropy=rng.random() < 0.7,
        inplace_backward=rng.random() < 0.5,
    )
