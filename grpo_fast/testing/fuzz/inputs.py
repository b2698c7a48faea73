"""The tensors of a fuzz case, built from its parameters (grpo_fast.testing.fuzz.cases) and its seed.

The per-token inputs are drawn around the fp64 logprobs of the case's own (rounded) hidden states and weight,
then kept away from the loss's step functions (`conditioning`): a clip bound, δ, CISPO's cap, the off-policy
threshold and the entropy quantile switch a token's term on or off, so that an input within rounding of a
switch point legitimately gives a different loss in every precision, and no error bound applies there.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from .cases import TRUST_REGION_NAMES, draw_params
from .conditioning import decision_margin, keep_decisions_apart, keep_trust_regions_apart, robust_quantile

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
MASK_DTYPES = {"bool": torch.bool, "int64": torch.int64, "int32": torch.int32, "float32": torch.float32}
FAR_LOG_RATIO = 30.0  # |log ratio| of "far" old / reference logprobs at most: exp(30)^2 * 1e4 stays in fp32
NEAR_SPREAD = 0.3  # standard deviation of "near" reference logprobs around the current ones


@dataclass
class Rows:
    """Where each of the N flat token rows sits: seq [N] and pos [N] in the padded [B, Tp] view the fp64
    reference takes (Tp: the padded length, or the longest packed sequence, at least 1); mask [N] bool."""

    seq: torch.Tensor
    pos: torch.Tensor
    mask: torch.Tensor
    batch: int
    padded_length: int

    def to_padded(self, flat: torch.Tensor, fill: float | torch.Tensor = 0.0) -> torch.Tensor:
        """[N, ...] -> [B, Tp, ...], `fill` ([B, Tp, ...] or a number) where no row lands."""
        shape = (self.batch, self.padded_length, *flat.shape[1:])
        out = fill.clone() if isinstance(fill, torch.Tensor) else flat.new_full(shape, fill)
        out[self.seq, self.pos] = flat
        return out

    def from_padded(self, padded: torch.Tensor) -> torch.Tensor:
        """[B, Tp, ...] -> [N, ...]."""
        return padded[self.seq, self.pos]


@dataclass
class FuzzInputs:
    """One case's tensors, as its entry point takes them.

    hidden [B, T, H] (padded) or [N, H] (packed), weight [V, H], bias [V] | None: in the case dtype.
    logits [B, T, V] or [N, V] in the case dtype (logits_grpo_loss), else None.
    token: completion_ids, completion_mask, advantages, old_logprobs, ref_logprobs, is_weights, rollout_logprobs
        (the inference engine's, for the objectives that read them) as passed: padded [B, T] (advantages,
        is_weights also [B] or [B, 1]); packed [N] (or [B]); fp32 (fp64 cases: fp64).
    targets [N] int64: the ids without junk at masked positions (fused_logprobs takes no mask).
    num_items_in_batch: None, a number or a tensor; cu_seqlens [B+1] (packed) | None.
    upstream: (gℓ, gH) [N] fp32, the upstream gradients of fused_logprobs' outputs.
    """

    hidden: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    logits: torch.Tensor | None
    token: dict
    targets: torch.Tensor
    num_items_in_batch: object
    cu_seqlens: torch.Tensor | None
    upstream: tuple[torch.Tensor, torch.Tensor]
    rows: Rows

    def per_sequence(self, name: str) -> bool:
        """Whether advantages / is_weights were given one per sequence, as the loss reads them
        (grpo_fast.loss.batch): [B] or padded [B, 1], but a packed [N] with B == N is per token."""
        value = self.token[name]
        batch, tokens, padded = self.rows.batch, self.rows.seq.numel(), self.cu_seqlens is None
        if padded:
            return value.dim() == 1 or tuple(value.shape) == (batch, 1)
        return value.dim() == 1 and value.numel() == batch and batch != tokens

    def per_token(self, name: str) -> torch.Tensor:
        """advantages / is_weights [N], one value per token (see `per_sequence`)."""
        value = self.token[name].reshape(-1)
        return value[self.rows.seq] if self.per_sequence(name) else value


def build(backend: str, seed: int) -> tuple[dict, FuzzInputs]:
    """(parameters, tensors) of case (backend, seed); the parameters as `draw_params` drew them, updated by
    what building decided: max_abs_logit, the logit_scale of extreme logits, the old logprobs' moves and a
    switched-off entropy quantile (grpo_fast.testing.fuzz.conditioning)."""
    params = copy.deepcopy(draw_params(backend, seed))
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[params["dtype"]]
    aux = torch.float64 if dtype == torch.float64 else torch.float32
    rows = _rows(params, gen)
    hidden, weight, bias, logits = _linear(params, rows, dtype, gen)
    ids = torch.randint(0, params["V"], (rows.seq.numel(),), generator=gen)
    ids[torch.rand(ids.shape, generator=gen) < 0.1] = params["V"] - 1
    logp, entropy, max_abs_logit = _oracle_stats(params, hidden, weight, bias, logits, ids)
    params["max_abs_logit"] = max_abs_logit
    margin = decision_margin(max_abs_logit)

    flat = {"completion_ids": ids, "completion_mask": rows.mask, "advantages": _advantages(params, rows, gen)}
    flat["old_logprobs"] = _around(logp, params["old"], params["drift"], gen)
    flat["ref_logprobs"] = _around(logp, params["ref"], NEAR_SPREAD if params["ref"] == "near" else FAR_LOG_RATIO, gen)
    flat["is_weights"] = _is_weights(params, rows, gen)
    base = logp if flat["old_logprobs"] is None else flat["old_logprobs"]
    flat["rollout_logprobs"] = _around(base, params["rollout"], params.get("rollout_drift", 0.0), gen)
    token = {name: None if v is None else _as_passed(name, v, params, rows, aux, gen) for name, v in flat.items()}
    inputs = FuzzInputs(
        hidden=hidden if params["layout"] == "packed" else hidden.view(rows.batch, params["T"], -1),
        weight=weight,
        bias=bias,
        logits=logits,
        token=token,
        targets=ids,
        num_items_in_batch=_num_items(params, rows),
        cu_seqlens=_cu_seqlens(params),
        upstream=tuple(torch.randn(rows.seq.numel(), generator=gen) for _ in range(2)),
        rows=rows,
    )
    if flat["old_logprobs"] is not None:
        advantages = inputs.per_token("advantages").double()
        old = keep_decisions_apart(flat["old_logprobs"], logp, advantages, rows, params["config"], margin, aux, gen)
        params["old_moved"] = int((old != flat["old_logprobs"].to(aux).double()).sum())
        token["old_logprobs"] = _as_passed("old_logprobs", old, params, rows, aux, gen)
        flat["old_logprobs"] = old
    if params["config"]["loss_type"] in TRUST_REGION_NAMES:
        moved = keep_trust_regions_apart(
            flat, logp, inputs.per_token("advantages").double(), rows, params, margin, aux, gen
        )
        for name, values in moved.items():
            params[f"{name}_moved"] = int((values != flat[name].to(aux).double()).sum())
            token[name] = _as_passed(name, values, params, rows, aux, gen)
    params["quantile_switched_off"] = robust_quantile(entropy, rows, params["config"], margin, gen)
    return params, inputs


def _rows(params: dict, gen: torch.Generator) -> Rows:
    batch, lengths = params["B"], torch.tensor(params["lengths"], dtype=torch.int64)
    if params["layout"] == "packed":
        seq = torch.arange(batch).repeat_interleave(lengths)
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
        pos = torch.arange(seq.numel()) - starts[seq]
        mask = torch.ones(seq.numel(), dtype=torch.bool)
        padded_length = max(int(lengths.max()), 1)
    else:
        padded_length = params["T"]
        seq = torch.arange(batch).repeat_interleave(padded_length)
        pos = torch.arange(padded_length).repeat(batch)
        mask = pos < lengths[seq]
    if params["holes"]:
        mask &= torch.rand(seq.shape, generator=gen) > 0.3
    if params["masked_out"] == "batch":
        mask[:] = False
    for row in params["masked_rows"]:
        mask[seq == row] = False
    return Rows(seq, pos, mask, batch, padded_length)


def _linear(params: dict, rows: Rows, dtype: torch.dtype, gen: torch.Generator):
    """hidden [N, H], weight [V, H], bias [V] | None in `dtype`, with logits (h Wᵀ + b) of standard deviation
    ~params["logit_std"]; extreme logits get the logit_scale that takes the largest to params'
    extreme_max_logit (sum of N logprobs kept within fp32). logits_grpo_loss: the head's logits
    c tanh(s (h Wᵀ + b) / c) [N, V] in `dtype` (its config then keeps the head's defaults)."""
    n, size, vocab = rows.seq.numel(), params["H"], params["V"]
    amplitude = params["logit_std"] ** 0.5
    hidden = (torch.randn(n, size, generator=gen) * amplitude).to(dtype)
    weight = (torch.randn(vocab, size, generator=gen) * amplitude / size**0.5).to(dtype)
    bias = (torch.randn(vocab, generator=gen) * params["logit_std"] * 0.5).to(dtype) if params["bias"] else None
    x = hidden.double() @ weight.double().t() + (0.0 if bias is None else bias.double())
    config = params["config"]
    if params["regime"] == "extreme":
        target = min(params["extreme_max_logit"], 1e37 / (2 * n + 2))
        largest = float(x.abs().max()) if x.numel() else 1.0  # no rows at all: any scale
        scale = target * params["temperature"] / max(largest, 1e-30)
        params["logit_scale"] = config["logit_scale"] = scale
    if params["api"] != "logits_grpo_loss":
        return hidden, weight, bias, None
    logits = _head(x, config).to(dtype)
    config["logit_scale"], config["final_logit_softcapping"] = 1.0, None  # logits_grpo_loss reads neither
    params["logit_scale"], params["softcap"] = 1.0, None
    return hidden, weight, bias, logits if params["layout"] == "packed" else logits.view(rows.batch, params["T"], -1)


def _oracle_stats(params, hidden, weight, bias, logits, ids) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(logp [N], entropy [N], max |logit|) in fp64 of the case's own rounded inputs (padding rows too)."""
    config = params["config"]
    if logits is None:
        logits = _head(hidden.double() @ weight.double().t() + (0.0 if bias is None else bias.double()), config)
    logits = logits.double().reshape(ids.numel(), logits.shape[-1]) / config["temperature"]
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(1, ids.view(-1, 1)).view(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy, float(logits.abs().max()) if logits.numel() else 0.0


def _head(x: torch.Tensor, config: dict) -> torch.Tensor:
    """The model's logits c tanh(s x / c) (no cap: s x) of x = h Wᵀ + b, before the temperature."""
    z = x * config["logit_scale"]
    cap = config["final_logit_softcapping"]
    return z if cap is None else cap * torch.tanh(z / cap)


def _values(kind: str, count: int, huge: float, gen: torch.Generator) -> torch.Tensor:
    """Advantage values [count] fp64: normal, zero, ±huge, or a mix of the three."""
    normal = torch.randn(count, generator=gen, dtype=torch.float64)
    sign = torch.where(torch.rand(count, generator=gen) < 0.5, -1.0, 1.0).double()
    if kind == "normal":
        return normal
    if kind == "zero":
        return torch.zeros(count, dtype=torch.float64)
    if kind == "huge":
        return sign * huge
    pick = torch.randint(0, 3, (count,), generator=gen)
    return torch.where(pick == 0, normal, torch.where(pick == 1, sign * huge, 0.0))


def _advantages(params: dict, rows: Rows, gen: torch.Generator) -> torch.Tensor:
    """[B] (one per sequence) or [N] (per token), fp64."""
    per_token = params["adv_shape"] == "token"
    return _values(params["adv_values"], rows.seq.numel() if per_token else rows.batch, params["adv_huge"], gen)


def _around(logp: torch.Tensor, kind: str, spread: float, gen: torch.Generator) -> torch.Tensor | None:
    """Old / reference logprobs [N] fp64: None, logp + N(0, spread²) ("near"), or logp − ±U(3, spread)
    ("far", |log ratio| <= FAR_LOG_RATIO)."""
    if kind == "none":
        return None
    if kind == "near":
        return logp + spread * torch.randn(logp.shape, generator=gen, dtype=torch.float64)
    sign = torch.where(torch.rand(logp.shape, generator=gen) < 0.5, -1.0, 1.0).double()
    magnitude = 3.0 + (min(spread, FAR_LOG_RATIO) - 3.0) * torch.rand(logp.shape, generator=gen, dtype=torch.float64)
    return logp - sign * magnitude


def _is_weights(params: dict, rows: Rows, gen: torch.Generator) -> torch.Tensor | None:
    """Importance weights [N] or [B] fp64 in [0, 3), with exact 0s and 1s."""
    if params["is_weights"] == "none":
        return None
    count = rows.seq.numel() if params["is_weights"] == "token" else rows.batch
    weights = 3.0 * torch.rand(count, generator=gen, dtype=torch.float64)
    pick = torch.rand(count, generator=gen)
    return torch.where(pick < 0.1, 0.0, torch.where(pick < 0.2, 1.0, weights))


def _as_passed(name: str, flat: torch.Tensor, params: dict, rows: Rows, aux: torch.dtype, gen: torch.Generator):
    """A per-token input [N] (or per-sequence [B]) as the entry point takes it: the mask in its dtype, ids
    int64, the rest in `aux`; padded per-token inputs [B, T], per-sequence column [B, 1]; junk (NaN,
    out-of-vocabulary ids) at masked positions when the case asks for it."""
    per_token = _kind(params, name) in (None, "token")
    if name == "completion_mask":
        value = flat.to(MASK_DTYPES[params["mask_dtype"]])
    elif name == "completion_ids":
        value = flat.clone()
    else:
        value = flat.to(aux)
    if per_token and params["junk_at_padding"] and name != "completion_mask":
        junk = torch.tensor(-100 if name == "completion_ids" else float("nan"), dtype=value.dtype)
        if name == "completion_ids" and torch.rand((), generator=gen) < 0.5:
            junk = torch.tensor(params["V"] + 7)
        value = torch.where(rows.mask, value, junk)
    if params["layout"] == "padded":
        if per_token:
            return value.view(rows.batch, params["T"])
        if _kind(params, name) == "sequence_column":
            return value.view(rows.batch, 1)
    return value


def _kind(params: dict, name: str) -> str | None:
    return {"advantages": params["adv_shape"], "is_weights": params["is_weights"]}.get(name)


def _num_items(params: dict, rows: Rows):
    """num_items_in_batch: about `num_items_factor` times the active tokens, as each accepted type."""
    count = max(1.0, float(rows.mask.sum()) * params["num_items_factor"])
    return {
        "none": None,
        "int": round(count),
        "float": count,
        "tensor_int": torch.tensor(round(count)),
        "tensor_float": torch.tensor(count),
        "tensor_1": torch.tensor([count]),
    }[params["num_items"]]


def _cu_seqlens(params: dict) -> torch.Tensor | None:
    if params["layout"] != "packed":
        return None
    lengths = torch.tensor([0, *params["lengths"]], dtype=torch.int64)
    return lengths.cumsum(0).to(getattr(torch, params["cu_dtype"]))
