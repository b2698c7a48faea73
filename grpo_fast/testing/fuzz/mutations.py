"""The mutations of the invalid-input cases (grpo_fast.testing.fuzz.invalid): each makes one argument of a valid
case invalid.

A mutation is a function (params, inputs, args, rng) -> (what it did, thunk, names the error may give) or None
when it does not apply to the case; names None means "must propagate" (a NaN in hidden, weight or the logits).
cu_seqlens and num_items_in_batch may live on another device than hidden (they are moved or read), so only the
other tensors are moved to the meta device.
"""

from __future__ import annotations

import math

import torch

from ...loss import GRPOLoss, GRPOLossConfig
from .run import call

META = torch.device("meta")


def _loss_api(params) -> bool:
    return params["api"] != "fused_logprobs"


def _active(inputs, rng) -> int | None:
    """A random active row, or None."""
    rows = torch.nonzero(inputs.rows.mask).view(-1).tolist()
    return rng.choice(rows) if rows else None


def _call(params, args):
    return lambda: call(params, args)


def _nonfinite_token_input(params, inputs, args, rng):
    """NaN / ±inf at an active position of advantages, old / ref logprobs (when used) or importance weights."""
    row = _active(inputs, rng)
    names = [n for n in ("advantages", "old_logprobs", "is_weights") if args.get(n) is not None]
    if params["config"].get("beta", 0.0) > 0:
        names.append("ref_logprobs")
    if not _loss_api(params) or row is None:
        return None
    name = rng.choice(names)
    value = args[name].clone()
    flat = value.view(-1)
    per_sequence = name in ("advantages", "is_weights") and inputs.per_sequence(name)
    index = int(inputs.rows.seq[row]) if per_sequence else row
    flat[index] = rng.choice((math.nan, math.inf, -math.inf))
    return f"{name}[{index}] = {float(flat[index])}", _call(params, args | {name: value}), (name,)


def _token_id_out_of_range(params, inputs, args, rng):
    """A token id outside [0, V) at an active position (fused_logprobs, which has no mask: at any row)."""
    fused, rows = params["api"] == "fused_logprobs", inputs.rows.seq.numel()
    row = (rng.randrange(rows) if rows else None) if fused else _active(inputs, rng)
    if row is None:
        return None
    key = "targets" if fused else "completion_ids"
    ids = args[key].clone()
    bad = rng.choice((-1, params["V"], params["V"] + 123))
    ids.view(-1)[row] = bad
    return f"{key}[{row}] = {bad}", _call(params, args | {key: ids}), (key,)


def _wrong_dtype(params, inputs, args, rng):
    """An integer where a float is expected (or the reverse), or weight / bias in another dtype than hidden."""
    other = torch.float64 if params["dtype"] != "float64" else torch.float32
    candidates = {"hidden": lambda t: t.to(torch.int64), "weight": lambda t: t.to(other), "bias": lambda t: t.to(other)}
    if params["api"] == "fused_logprobs":
        candidates["targets"] = lambda t: t.float()
    elif params["api"] == "logits_grpo_loss":
        candidates = {"logits": lambda t: t.to(torch.int64), "completion_ids": lambda t: t.float()}
    else:
        candidates["completion_ids"] = lambda t: t.float()
    if _loss_api(params):
        for name in ("advantages", "old_logprobs", "is_weights", "cu_seqlens"):
            candidates[name] = (lambda t: t.float()) if name == "cu_seqlens" else (lambda t: t.to(torch.int64))
    present = [name for name in candidates if args.get(name) is not None]
    name = rng.choice(present)
    value = candidates[name](args[name])
    return f"{name} as {value.dtype}", _call(params, args | {name: value}), (name,)


def _wrong_shape(params, inputs, args, rng):
    """One more element (or column) in one argument."""
    names = ["weight", "bias", "targets"] if params["api"] == "fused_logprobs" else list(_TOKEN_SHAPED)
    if params["api"] == "logits_grpo_loss":
        names = [n for n in names if n not in ("weight", "bias")]
    elif _loss_api(params):
        names += ["weight", "bias"]
    names = [n for n in names if args.get(n) is not None]
    name = rng.choice(names)
    value = args[name]
    if name == "weight":
        value = torch.cat([value, value[:, :1]], dim=1)
    else:
        dim = rng.randrange(value.dim()) if value.dim() else 0
        value = torch.cat([value, value.narrow(dim, 0, 1) if value.shape[dim] else value.new_zeros(1)], dim=dim)
    if _still_valid(name, tuple(value.shape), inputs):
        return None
    names_ok = (name,) if name != "completion_ids" else ("completion_ids", "completion_mask")
    return f"{name} shaped {list(value.shape)}", _call(params, args | {name: value}), names_ok


_TOKEN_SHAPED = ("completion_ids", "completion_mask", "advantages", "old_logprobs", "is_weights")


def _still_valid(name: str, shape: tuple, inputs) -> bool:
    """Whether a per-sequence or per-token argument of this shape is valid after all ([B] in a packed batch of
    B + 1 tokens, [B, 2] in a padded one of length 2, ...)."""
    if name not in ("advantages", "is_weights"):
        return False
    batch, tokens = inputs.rows.batch, inputs.rows.seq.numel()
    if inputs.cu_seqlens is not None:
        return len(shape) == 1 and shape[0] in (batch, tokens)
    return shape in ((batch,), (batch, 1), (batch, inputs.rows.padded_length))


_ANY_DEVICE = ("hidden", "logits", "cu_seqlens", "num_items_in_batch")  # hidden / logits define the device


def _wrong_device(params, inputs, args, rng):
    """One argument on the meta device (hidden stays on the CPU)."""
    names = [n for n, v in args.items() if isinstance(v, torch.Tensor) and n not in _ANY_DEVICE]
    if params["config"].get("beta", 0.0) == 0 and "ref_logprobs" in names:
        names.remove("ref_logprobs")  # unused without a KL term
    name = rng.choice(names)
    return f"{name} on meta", _call(params, args | {name: args[name].to(META)}), (name,)


_TENSOR_ARGUMENTS = {
    "fused_logprobs": ("hidden", "weight", "targets"),
    "logits_grpo_loss": ("logits", "completion_ids", "advantages"),
    "grpo_loss": ("hidden", "weight", "completion_ids", "advantages"),
    "GRPOLoss": ("hidden", "weight", "completion_ids", "advantages"),
}


def _not_a_tensor(params, inputs, args, rng):
    """A nested list where a tensor is expected."""
    name = rng.choice(_TENSOR_ARGUMENTS[params["api"]])
    return f"{name} as a list", _call(params, args | {name: args[name].tolist()}), (name,)


def _bad_mask_value(params, inputs, args, rng):
    """A float completion mask holding 0.5, 2 or −1 somewhere."""
    if not _loss_api(params) or inputs.rows.seq.numel() == 0:
        return None
    mask = args["completion_mask"].float().clone()
    mask.view(-1)[rng.randrange(mask.numel())] = rng.choice((0.5, 2.0, -1.0))
    return (
        "completion_mask with a value outside {0, 1}",
        _call(params, args | {"completion_mask": mask}),
        ("completion_mask",),
    )


def _bad_cu_seqlens(params, inputs, args, rng):
    """Offsets not from 0, not to N, decreasing, 2-D or too short; or offsets with a padded batch."""
    if not _loss_api(params):
        return None
    cu = args["cu_seqlens"]
    if cu is None:  # a padded batch with offsets: the error names the padded source or the ids
        offsets = torch.tensor([0, inputs.rows.seq.numel()])
        names = ("hidden", "logits", "completion_ids")
        return "cu_seqlens with a padded batch", _call(params, args | {"cu_seqlens": offsets}), names
    kind = rng.choice(("start", "end", "decreasing", "2-D", "short"))
    bad = cu.clone()
    if kind == "start":
        bad[0] = 1
    elif kind == "end":
        bad[-1] += 1
    elif kind == "decreasing" and bad.numel() > 2:
        bad[1] = bad[-1] + 1
    elif kind == "2-D":
        bad = bad.view(1, -1)
    else:
        bad = bad[:1]
    if torch.equal(bad.view(-1), cu) and kind != "2-D":
        bad = bad.flip(0) + 1
    return f"cu_seqlens {kind}: {bad.tolist()}", _call(params, args | {"cu_seqlens": bad}), ("cu_seqlens",)


def _bad_num_items(params, inputs, args, rng):
    """num_items_in_batch not a positive count: 0, negative, NaN, inf, a string, a 2-element tensor."""
    if not _loss_api(params):
        return None
    bad = rng.choice(
        (0, -3, math.nan, math.inf, -0.5, "12", torch.tensor([1.0, 2.0]), torch.tensor(math.nan), torch.tensor(-1))
    )
    return f"num_items_in_batch = {bad!r}", _call(params, args | {"num_items_in_batch": bad}), ("num_items_in_batch",)


def _missing(params, inputs, args, rng):
    """advantages missing, or ref_logprobs missing with a KL term."""
    if not _loss_api(params):
        return None
    if params["config"].get("beta", 0.0) > 0 and rng.random() < 0.5:
        return "ref_logprobs missing with beta > 0", _call(params, args | {"ref_logprobs": None}), ("ref_logprobs",)
    return "advantages missing", _call(params, args | {"advantages": None}), ("advantages",)


def _config_not_a_config(params, inputs, args, rng):
    """The options as a dict instead of a GRPOLossConfig."""
    if not _loss_api(params):
        return None
    return "config as a dict", _call(params, args | {"config": dict(params["config"])}), ("config",)


# (field, bad value) pairs for GRPOLossConfig; each must be refused at construction, naming the field.
BAD_OPTIONS = (
    ("loss_type", "ppo"),
    ("loss_type", None),
    ("epsilon_low", -0.1),
    ("epsilon_low", 1.0),
    ("epsilon_low", math.nan),
    ("epsilon_low", "0.2"),
    ("epsilon_low", True),
    ("epsilon_high", -1.0),
    ("epsilon_high", math.inf),
    ("delta", 1.0),
    ("delta", math.nan),
    ("beta", -0.1),
    ("beta", math.inf),
    ("use_bias_correction_kl", "yes"),
    ("use_bias_correction_kl", 1),
    ("sapo_temperature_pos", 0.0),
    ("sapo_temperature_neg", -1.0),
    ("vespo_k_pos", -1.0),
    ("vespo_lambda_neg", math.nan),
    ("temperature", 0.0),
    ("temperature", -1.0),
    ("temperature", math.inf),
    ("logit_scale", 0.0),
    ("logit_scale", math.nan),
    ("final_logit_softcapping", 0.0),
    ("final_logit_softcapping", -5.0),
    ("entropy_coef", math.nan),
    ("top_entropy_quantile", -0.1),
    ("top_entropy_quantile", 1.5),
    ("off_policy_mask_threshold", math.inf),
    ("importance_sampling_level", "seq"),
    ("max_completion_length", 0),
    ("max_completion_length", 2.5),
    ("max_completion_length", True),
    ("backend", "tpu"),
    ("workspace_bytes", 0),
    ("workspace_bytes", -4),
    ("workspace_bytes", True),
    ("deterministic", "yes"),
    ("deterministic", None),
)


def _bad_option(params, inputs, args, rng):
    """One GRPOLossConfig field set to an invalid value (cispo without epsilon_high among them)."""
    options = dict(params["config"])
    if rng.random() < 0.05:
        options |= {"loss_type": "cispo", "objective_options": {}}  # the case's objective's own options are not cispo's
        options.pop("epsilon_high", None)
        return "cispo without epsilon_high", lambda: GRPOLossConfig(**options), ("epsilon_high",)
    field, value = rng.choice(BAD_OPTIONS)
    options[field] = value
    return f"GRPOLossConfig({field}={value!r})", lambda: GRPOLossConfig(**options), (field,)


def _unavailable_backend(params, inputs, args, rng):
    """A backend that does not run here (cuda on a CPU machine), or the Triton kernels on fp64 (logits_grpo_loss
    has no layer-1 backend)."""
    if params["api"] == "logits_grpo_loss":
        return None
    if params["dtype"] == "float64":
        config = GRPOLossConfig(**params["config"] | {"backend": "triton"})
        args = args | ({"backend": "triton"} if params["api"] == "fused_logprobs" else {"config": config})
        return "triton on fp64 inputs", _call(params, args), ("hidden", "logits", "backend")
    if torch.cuda.is_available():
        return None
    config = GRPOLossConfig(**params["config"] | {"backend": "cuda"})
    args = args | ({"backend": "cuda"} if params["api"] == "fused_logprobs" else {"config": config})
    return "backend cuda on CPU tensors", _call(params, args), ("backend",)


def _bad_logprob_option(params, inputs, args, rng):
    """fused_logprobs' own options: temperature, workspace_bytes, deterministic, return_entropy, head."""
    if params["api"] != "fused_logprobs":
        return None
    name, value = rng.choice(
        (
            ("temperature", 0.0),
            ("temperature", -2.0),
            ("temperature", math.nan),
            ("temperature", True),
            ("workspace_bytes", -5),
            ("workspace_bytes", 2.5),
            ("deterministic", "yes"),
            ("return_entropy", "yes"),
            ("logit_scale", -1.0),
            ("final_logit_softcapping", 0.0),
            ("backend", "TORCH"),
        )
    )
    return f"fused_logprobs({name}={value!r})", _call(params, args | {name: value}), (name,)


def _logits_layout(params, inputs, args, rng):
    """logits_grpo_loss: in-place backward into a non-contiguous logits tensor."""
    if params["api"] != "logits_grpo_loss" or args["logits"].numel() == 0:
        return None
    logits = args["logits"].transpose(-1, -2).contiguous().transpose(-1, -2)
    if logits.is_contiguous():
        return None
    changes = {"logits": logits, "inplace_backward": True}
    return "non-contiguous logits with inplace_backward", _call(params, args | changes), ("logits",)


def _module_both(params, inputs, args, rng):
    """GRPOLoss given a config and keyword options at once."""
    if params["api"] != "GRPOLoss":
        return None
    config = args["config"]
    return "GRPOLoss(config, **options)", lambda: GRPOLoss(config, loss_type="grpo"), ("GRPOLoss",)


def _nan_activation(params, inputs, args, rng):
    """NaN in hidden (an active row), in weight or in the logits: must propagate to a non-finite result."""
    row = _active(inputs, rng)
    if row is None:
        return None
    name = "logits" if params["api"] == "logits_grpo_loss" else rng.choice(("hidden", "weight"))
    value = args[name].clone()
    flat = value.reshape(-1, value.shape[-1])
    index = (row if name != "weight" else rng.randrange(flat.shape[0]), rng.randrange(flat.shape[1]))
    flat[index] = math.nan
    return f"{name}{list(index)} = nan", _call(params, args | {name: value}), None


MUTATIONS = (
    _nonfinite_token_input,
    _token_id_out_of_range,
    _wrong_dtype,
    _wrong_shape,
    _wrong_device,
    _not_a_tensor,
    _bad_mask_value,
    _bad_cu_seqlens,
    _bad_num_items,
    _missing,
    _config_not_a_config,
    _bad_option,
    _unavailable_backend,
    _bad_logprob_option,
    _logits_layout,
    _module_both,
    _nan_activation,
)
