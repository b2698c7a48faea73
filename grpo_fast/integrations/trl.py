"""grpo_fast's fused head (and, for GRPO, its fused loss) inside Hugging Face TRL 1.16's trainers.

    trainer = trl.GRPOTrainer(model=..., args=GRPOConfig(...), ...)
    use_grpo_fast(trainer)              # TRL's fused LM head -> grpo_fast.fused_logprobs; TRL's loss in torch
    use_grpo_fast(trainer, loss=True)   # GRPO: the whole objective through grpo_fast.grpo_loss
    trainer.train()

    with use_grpo_fast(trainer):        # or scoped: TRL's own head and loss come back on exit
        ...

TRL 1.16 patches each model it trains or scores with `trl.trainer.utils.add_fused_lm_head`: its forward, called
with `fused_lm_head=True` and `labels` (-100 = not scored), runs the backbone and computes per-token logprobs (and
the optional outputs the trainer asked for) with `trl.kernels.ChunkedLogProbFunction`. `use_grpo_fast` replaces
that forward on the trainer's model (the PEFT base model, as TRL patches it) and its ref_model with one computing
the same `FusedCausalLMOutput` with `grpo_fast.fused_logprobs`, reading the options TRL gave add_fused_lm_head
(temperature, cast_lm_head_to_fp32, outputs) from the forward it replaces. Every trainer that uses that entry
point (GRPO, RLOO, DPO, KTO, SFT) can be patched.

Supported outputs: log_probs, entropy (and loss, label_mask). Not supported: log_sum_sq_probs, mean_logits,
is_top1 (NotImplementedError at patch time; DPO's, KTO's and SFT's policy models ask for some of them, their
reference models do not: `skip_unsupported=True` patches what it can and leaves TRL's head on the rest); when the
head is called: MoE models' router aux loss (output_router_logits=True) and sharded heads (FSDP2 DTensor, DeepSpeed
ZeRO-3). The head is `grpo_fast.integrations.hidden.output_head`: LoRA on lm_head enters the weight (TRL's head
reads the base weight only); dtypes as TRL's (cast_lm_head_to_fp32: fp32; under autocast: autocast's dtype).

loss=True (GRPOTrainer only) replaces `GRPOTrainer._compute_loss` with grpo_fast.grpo_loss on the completion hidden
states, its GRPOLossConfig mapped from the trainer (`loss_config`): loss_type (any of grpo_fast.loss.LOSS_TYPES),
epsilon / epsilon_high, delta, beta, use_bias_correction_kl, the sapo_* and vespo_* options, temperature,
importance_sampling_level, max_completion_length, a static entropy_coef, the head transform; TRL's gradient-
accumulation and num_items_in_batch scaling; vLLM importance-sampling ratios (`importance_sampling_ratio`, token or
sequence modes). Not supported (NotImplementedError at patch time, or for inputs when the loss is computed):
top_entropy_quantile < 1, off_policy_mask_threshold, use_adaptive_entropy, MoE aux loss, tool masks, multimodal
inputs. TRL's per-step metrics entropy, kl and clip_ratio/{low,high,region}_mean are logged (not the clip_ratio
min/max per sequence, cispo_clip_ratio, vespo/phi_seq_mean nor policy_loss).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from dataclasses import dataclass, field

import torch

from ..loss import LOSS_TYPES, GRPOLossConfig, fused_logprobs, grpo_loss
from ..loss.loss_types import Reduction
from .hidden import output_head, unwrap_peft

SUPPORTED_TRL = "1.16"
SUPPORTED_OUTPUTS = ("log_probs", "entropy")
HIDDEN = "grpo_fast:hidden"
"""Pass as `fused_lm_head=HIDDEN` to a patched model: its forward returns the backbone's output (last_hidden_state
[B, L, H], after the final norm) through the model's own __call__ (so DDP / PEFT wrappers run their hooks)."""
_MULTIMODAL_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "pixel_attention_mask",
    "spatial_shapes",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
    "num_images",
)


def check_trl_version() -> str:
    """TRL's version; RuntimeError unless it is a supported one (1.16.x)."""
    import trl

    version = trl.__version__
    if version.split(".")[:2] != SUPPORTED_TRL.split("."):
        raise RuntimeError(
            f"grpo_fast.integrations.trl supports TRL {SUPPORTED_TRL}.x (its add_fused_lm_head and "
            f"GRPOTrainer._compute_loss); found trl {version}"
        )
    return version


@dataclass(frozen=True)
class HeadOptions:
    """What TRL's add_fused_lm_head was given for one model (read from the forward it installed)."""

    temperature: float
    cast_lm_head_to_fp32: bool
    outputs: tuple[str, ...]
    backbone_attr: str


def trl_head_options(model: torch.nn.Module) -> HeadOptions | None:
    """The options of TRL's fused head on `model` (a transformers model), None if it has none."""
    from trl.trainer.utils import add_fused_lm_head

    forward = model.__dict__.get("forward")
    func = getattr(forward, "__func__", None)
    # functools.wraps gave it the model's __qualname__: recognise TRL's inner function by its code object
    if func is None or func.__code__ not in add_fused_lm_head.__code__.co_consts:
        return None
    names = inspect.getclosurevars(func).nonlocals
    return HeadOptions(
        temperature=float(names["temperature"]),
        cast_lm_head_to_fp32=bool(names["cast_lm_head_to_fp32"]),
        outputs=tuple(names["outputs"]),
        backbone_attr=names["backbone_attr"],
    )


def _head_tensors(model, hidden: torch.Tensor, cast_fp32: bool):
    """(hidden, weight, bias, head) in one dtype: fp32 with cast_lm_head_to_fp32, autocast's dtype under autocast
    (as TRL's head computes), else the weight's."""
    head = output_head(model)
    weight, bias = head.weight, head.bias
    if type(weight).__name__ == "DTensor" or weight.dim() != 2 or weight.numel() == 0:
        raise NotImplementedError(
            "model: the lm_head weight is sharded (FSDP2 DTensor or a DeepSpeed ZeRO-3 placeholder); grpo_fast's TRL "
            "head needs the whole [V, H] weight on each rank"
        )
    hidden = hidden.to(weight.device)
    device = hidden.device.type
    if cast_fp32:
        dtype = torch.float32
    elif torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    else:
        dtype = weight.dtype
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    return cast(hidden), cast(weight), cast(bias), head


def _make_forward(trl_forward, options: HeadOptions, backend: str):
    """Our replacement of TRL's `_fused_forward` (same signature and outputs)."""
    from trl.trainer.utils import FusedCausalLMOutput

    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        if not fused_lm_head:
            return trl_forward(
                *args, labels=labels, shift_labels=shift_labels, num_items_in_batch=num_items_in_batch, **kwargs
            )
        text_config = self.config.get_text_config()
        if kwargs.get("output_router_logits") or getattr(text_config, "output_router_logits", False):
            raise NotImplementedError(
                "grpo_fast's TRL head: the MoE router aux loss (output_router_logits) is not supported"
            )
        kwargs["use_cache"] = False
        backbone_outputs = getattr(self, options.backbone_attr)(*args, **kwargs)
        if fused_lm_head == HIDDEN:
            return backbone_outputs
        if fused_lm_head is not True:
            raise ValueError(f"fused_lm_head: expected True, False or {HIDDEN!r}, got {fused_lm_head!r}")
        if shift_labels is None:
            if labels is None:
                raise ValueError("labels: required with fused_lm_head=True (-100 marks the positions not scored)")
            hidden, labels = backbone_outputs.last_hidden_state[:, :-1], labels[:, 1:]
        else:
            hidden, labels = backbone_outputs.last_hidden_state, shift_labels
        hidden, weight, bias, head = _head_tensors(self, hidden, options.cast_lm_head_to_fp32)
        labels = labels.to(weight.device)
        mask = labels != -100
        want_entropy = "entropy" in options.outputs
        with torch.autocast(hidden.device.type, enabled=False):
            result = fused_logprobs(
                hidden[mask],
                weight,
                labels[mask],
                options.temperature,
                backend=backend,
                return_entropy=want_entropy,
                bias=bias,
                **head.transform_kwargs(),
            )
        logp, entropy = result if want_entropy else (result, None)
        scatter = lambda x: None if x is None else x.new_zeros(mask.shape).masked_scatter(mask, x)  # noqa: E731
        log_probs, entropy = scatter(logp), scatter(entropy)
        count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        return FusedCausalLMOutput(loss=-log_probs.sum() / count, log_probs=log_probs, entropy=entropy, label_mask=mask)

    # keep the signature TRL kept (transformers' generate validates its model kwargs against it)
    return functools.wraps(trl_forward)(forward)


@dataclass
class GRPOFastPatch:
    """What `use_grpo_fast` changed; `restore()` (or leaving the `with` block) puts TRL's head and loss back."""

    trainer: object
    models: list = field(default_factory=list)  # (model, TRL's forward)
    skipped: list = field(default_factory=list)  # (name, reason)
    loss: bool = False

    def restore(self) -> None:
        for model, trl_forward in self.models:
            model.forward = trl_forward
        self.models.clear()
        if self.loss:
            self.trainer.__dict__.pop("_compute_loss", None)
            self.loss = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()


def _trained_models(trainer):
    """(name, transformers model carrying TRL's head) for the trainer's model and ref_model."""
    found = []
    for name in ("model", "ref_model"):
        model = getattr(trainer, name, None)
        if model is None:
            continue
        accelerator = getattr(trainer, "accelerator", None)
        if accelerator is not None:
            model = accelerator.unwrap_model(model)
        found.append((name, unwrap_peft(model)))
    return found


def use_grpo_fast(
    trainer, loss: bool = False, backend: str = "auto", skip_unsupported: bool = False, **loss_options
) -> GRPOFastPatch:
    """Make a TRL 1.16 trainer compute its fused head with grpo_fast (and, with loss=True, a GRPOTrainer its loss).

    trainer: a trl trainer whose models TRL patched with add_fused_lm_head (GRPO, RLOO, DPO, KTO, SFT).
    loss: GRPOTrainer only: compute the GRPO objective with grpo_fast.grpo_loss (`loss_config` maps the options).
    backend: grpo_fast backend ("auto", "torch", "cpu", "triton", "cuda").
    skip_unsupported: leave TRL's head on models that ask for outputs grpo_fast does not compute (listed in
        `.skipped`) instead of raising NotImplementedError.
    loss_options: GRPOLossConfig fields that TRL has no option for (workspace_bytes, deterministic).
    Returns a GRPOFastPatch (a context manager; `.restore()` undoes it).
    """
    check_trl_version()
    patch = GRPOFastPatch(trainer)
    plans = []
    for name, model in _trained_models(trainer):
        options = trl_head_options(model)
        if options is None:
            raise ValueError(
                f"trainer.{name}: has no TRL fused LM head to replace (not patched by add_fused_lm_head, or patched "
                "already)"
            )
        unsupported = [o for o in options.outputs if o not in SUPPORTED_OUTPUTS]
        if unsupported:
            reason = f"asks for outputs {unsupported}; grpo_fast computes {list(SUPPORTED_OUTPUTS)}"
            if not skip_unsupported:
                raise NotImplementedError(f"trainer.{name}: {reason} (skip_unsupported=True leaves TRL's head there)")
            patch.skipped.append((name, reason))
            continue
        plans.append((model, options))
    if loss:
        from trl import GRPOTrainer

        if not isinstance(trainer, GRPOTrainer):
            raise TypeError(f"loss: grpo_fast's fused loss replaces GRPOTrainer's; got a {type(trainer).__name__}")
        if not plans or plans[0][0] is not _trained_models(trainer)[0][1]:
            raise NotImplementedError("loss: the policy model's head could not be replaced")
        loss_config(trainer, backend=backend, **loss_options)  # fail now on options we cannot map
    for model, options in plans:
        trl_forward = model.forward
        model.forward = types.MethodType(_make_forward(trl_forward, options, backend), model)
        patch.models.append((model, trl_forward))
    if loss:
        trainer._compute_loss = types.MethodType(_make_compute_loss(backend, loss_options), trainer)
        patch.loss = True
    return patch


# ------------------------------------------------------------------------------------------------------------------
# GRPO: the whole objective
# ------------------------------------------------------------------------------------------------------------------


def loss_config(trainer, backend: str = "auto", **extra) -> GRPOLossConfig:
    """GRPOLossConfig equivalent to a trl.GRPOTrainer's loss options (its attributes, set from its GRPOConfig).

    The entropy coefficient is the static one (TRL's `entropy_coef`); the model's head transform is read from it.
    Raises NotImplementedError for an option grpo_fast's loss does not have (see the module docstring)."""
    args = trainer.args
    if trainer.loss_type not in LOSS_TYPES:
        raise NotImplementedError(f"loss_type: {trainer.loss_type!r} is not one of grpo_fast's {tuple(LOSS_TYPES)}")
    for name, off, value in (
        ("top_entropy_quantile", 1.0, trainer.top_entropy_quantile),
        ("off_policy_mask_threshold", None, trainer.off_policy_mask_threshold),
        ("use_adaptive_entropy", False, trainer.use_adaptive_entropy),
        ("router_aux_loss (MoE)", False, trainer.aux_loss_enabled),
    ):
        if value != off:
            raise NotImplementedError(f"{name}={value!r}: not supported by grpo_fast's GRPO loss (leave loss=False)")
    head = output_head(trainer.accelerator.unwrap_model(trainer.model)).head
    return GRPOLossConfig(
        loss_type=trainer.loss_type,
        epsilon_low=trainer.epsilon_low,
        epsilon_high=trainer.epsilon_high,
        delta=args.delta,
        beta=trainer.beta,
        use_bias_correction_kl=args.use_bias_correction_kl,
        sapo_temperature_pos=args.sapo_temperature_pos,
        sapo_temperature_neg=args.sapo_temperature_neg,
        vespo_k_pos=args.vespo_k_pos,
        vespo_lambda_pos=args.vespo_lambda_pos,
        vespo_k_neg=args.vespo_k_neg,
        vespo_lambda_neg=args.vespo_lambda_neg,
        temperature=trainer.temperature,
        entropy_coef=trainer.entropy_coef if trainer._entropy_bonus_enabled else 0.0,
        importance_sampling_level=trainer.importance_sampling_level,
        max_completion_length=trainer.max_completion_length,
        backend=backend,
        logit_scale=head.logit_scale,
        final_logit_softcapping=head.final_logit_softcapping,
        **extra,
    )


def _make_compute_loss(backend: str, loss_options: dict):
    def _compute_loss(self, model, inputs):
        """GRPOTrainer._compute_loss through grpo_fast.grpo_loss (same value and gradients, TRL's metrics)."""
        present = [k for k in (*_MULTIMODAL_KEYS, "tool_mask") if inputs.get(k) is not None]
        if present:
            raise NotImplementedError(
                f"inputs: {present} are not supported by grpo_fast's GRPO loss (leave loss=False)"
            )
        config = loss_config(self, backend=backend, **loss_options)
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        k = completion_ids.size(1)
        with self.accelerator.autocast():
            outputs = model(input_ids=input_ids, attention_mask=attention_mask, fused_lm_head=HIDDEN)
            hidden = outputs.last_hidden_state[:, -k - 1 : -1]
            hidden, weight, bias, _ = _head_tensors(
                self.accelerator.unwrap_model(model), hidden, self.args.cast_lm_head_to_fp32
            )

        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        num_items = None
        if config.loss_spec.reduction is Reduction.GLOBAL_TOKEN_MEAN:  # TRL: divide by the window's tokens
            num_items = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                num_items = num_items * accumulation / self.args.steps_per_generation
            # TRL scales the entropy bonus (a per-micro-batch mean) for accumulation only
            config = dataclasses.replace(config, entropy_coef=config.entropy_coef / accumulation)
            scale = 1.0
        else:
            scale = 1.0 / accumulation
        is_weights = None
        if self.use_vllm and self.vllm_importance_sampling_correction:
            is_weights = inputs["importance_sampling_ratio"]
            if is_weights.dim() == 2 and is_weights.shape[1] == 1:
                is_weights = is_weights.squeeze(1)
        with torch.autocast(hidden.device.type, enabled=False):
            loss, metrics = grpo_loss(
                hidden,
                weight,
                completion_ids,
                completion_mask,
                inputs["advantages"],
                old_logprobs=inputs.get("old_per_token_logps"),
                ref_logprobs=inputs.get("ref_per_token_logps") if config.beta != 0.0 else None,
                is_weights=is_weights,
                num_items_in_batch=num_items,
                config=config,
                bias=bias,
            )
        _log_metrics(self, mode, metrics, config)
        return loss * scale

    return _compute_loss


def _log_metrics(trainer, mode: str, metrics: dict, config: GRPOLossConfig) -> None:
    """TRL's per-step metrics from ours (each a local mean, averaged over processes)."""
    names = ["entropy"] + (["kl"] if config.beta != 0.0 else [])
    if config.objective_spec.name == "clipped":
        names += ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]
    for name in names:
        if name in metrics:
            value = trainer.accelerator.gather(metrics[name].detach().reshape(1)).nanmean().item()
            trainer._metrics[mode][name].append(value)


__all__ = ["HIDDEN", "SUPPORTED_TRL", "GRPOFastPatch", "check_trl_version", "loss_config", "use_grpo_fast"]
