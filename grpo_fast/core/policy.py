"""Policy forward for training: backbone without the lm_head -> the hidden states that predict the
completion tokens. The full [tokens x vocab] logits are never formed; `grpo_loss` / `fused_logprobs`
consume (hidden, lm_head weight) directly."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Literal, Self

import torch
from torch import nn

from grpo_fast import fused_logprobs
from grpo_fast.config_fields import ConfigSection, option
from grpo_fast.core.model_kernels import apply_model_kernels
from grpo_fast.distributed.fsdp import is_sharded, root_forward_hidden
from grpo_fast.loss.head import logit_head

logger = logging.getLogger(__name__)


@dataclass
class ModelConfig(ConfigSection):
    """The policy to train and how it is loaded (`load_policy`)."""

    key = "model"
    path: str = option("", "HF directory or hub name of the policy (required to train from a config file)")
    dtype: Literal["float32", "bfloat16", "float16"] = option(
        "float32", "training parameter dtype (float32 keeps fp32 master weights; bf16 autocast on GPU is run.bf16)"
    )
    gradient_checkpointing: bool = option(False, "recompute activations in the backward: less memory, one more forward")
    attn_implementation: str | None = option(
        None, "transformers' attention implementation (sdpa, flash_attention_2 ...); null: transformers' default"
    )
    liger_kernels: bool = option(
        False, "Liger-Kernel's RMSNorm, RoPE and SwiGLU kernels in the policy (GPU, needs liger-kernel)"
    )


class TensorFields:
    """For a dataclass of tensors: `map_tensors(fn)`, a copy with `fn` applied to each tensor field (others kept),
    and `to(device)`."""

    def map_tensors(self, fn) -> Self:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(self, **{name: fn(v) for name, v in values.items() if isinstance(v, torch.Tensor)})

    def to(self, device) -> Self:
        return self.map_tensors(lambda t: t.to(device))


@dataclass
class SequenceBatch(TensorFields):
    """Prompt (left-padded to P) + completion (right-padded to T), one row per sequence.

    input_ids, attention_mask, position_ids: [B, P + T]; completion_ids, completion_mask: [B, T].
    position_ids count real tokens only, so a left-padded row sees the same positions as in the engine.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    prompt_width: int

    def rows(self, index) -> SequenceBatch:
        return self.map_tensors(lambda t: t[index])


def segments(lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For consecutive segments of `lengths` [n] (int64, >= 0): (owner, within) [Σ lengths], each element's segment
    and its position inside it, and starts [n], each segment's first element.

    owner is a running sum of the steps between segment indices marked at each non-empty segment's start: no
    repeat_interleave or searchsorted, whose parallel regions cost milliseconds on a busy CPU."""
    ends = torch.cumsum(lengths, 0)
    starts = ends - lengths
    total = int(ends[-1]) if lengths.numel() else 0
    filled = torch.nonzero(lengths > 0).squeeze(1)
    steps = torch.zeros(total, dtype=torch.long)
    steps[starts[filled]] = torch.diff(filled, prepend=filled.new_zeros(1))
    owner = torch.cumsum(steps, 0)
    return owner, torch.arange(total) - starts[owner], starts


def padded_rows(rows: list[list], width: int, fill, dtype=torch.long, left: bool = False) -> torch.Tensor:
    """Lists of different lengths (each at most `width`) as one [len(rows), width] tensor of `dtype`, right-padded
    with `fill` (left-padded with `left`): the rows padded on the host, then one tensor made from them."""
    if left:
        return torch.tensor([[fill] * (width - len(r)) + list(r) for r in rows], dtype=dtype).reshape(-1, width)
    return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype).reshape(-1, width)


def build_sequence_batch(
    prompts: list[list[int]], completions: list[list[int]], pad_id: int, min_completion_width: int = 1
) -> SequenceBatch:
    if len(prompts) != len(completions):
        raise ValueError("one prompt per completion expected")
    p = max(len(x) for x in prompts)
    t = max(min_completion_width, max(len(x) for x in completions))
    prompt_ids = padded_rows(prompts, p, pad_id, left=True)
    comp_ids = padded_rows(completions, t, pad_id)
    prompt_mask = padded_rows([[1] * len(x) for x in prompts], p, 0, left=True)
    comp_mask = padded_rows([[True] * len(x) for x in completions], t, False, torch.bool)
    input_ids = torch.cat([prompt_ids, comp_ids], dim=1)
    attn = torch.cat([prompt_mask, comp_mask.long()], dim=1)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    return SequenceBatch(input_ids, attn, position_ids, comp_ids, comp_mask, p)


def check_model_path(path: str) -> None:
    """ValueError naming model.path when `path` is meant as a local directory (absolute, relative with ./ or
    ~, or more than one /) and does not exist, or is a directory without a Hugging Face config; or, a hub name,
    when the Hub cannot give it (grpo_fast.core.policy.check_hub_model)."""
    local = Path(path).expanduser()
    if local.is_dir():
        if not any((local / name).is_file() for name in ("config.json", "adapter_config.json")):
            raise ValueError(
                f"model.path: {path} is a directory without config.json, not a Hugging Face model directory; "
                "point model.path at the directory save_pretrained wrote (or a hub name such as org/model)"
            )
    elif local.exists() or path.startswith(("/", ".", "~")) or path.count("/") > 1:
        raise ValueError(
            f"model.path: {path} does not exist (expected a Hugging Face model directory or a hub name such as "
            "org/model); check the path"
        )
    else:
        check_hub_model(path)


def check_hub_model(name: str, key: str = "model.path") -> None:
    """For a Hugging Face Hub name that is not in the local cache: ValueError in one line, naming `key`, when the
    Hub cannot give it (HF_HUB_OFFLINE set, the Hub unreachable, no such model or no access), after one request
    without retries (transformers' own loading retries each file for ~30 s before a 40-line traceback)."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    local = f"or point {key} at a local model directory"
    if constants.HF_HUB_OFFLINE:
        raise ValueError(
            f"{key}: {name} could not be loaded: HF_HUB_OFFLINE is set and it is not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); download it where there is a network (hf download {name}) into that cache, "
            f"{local}"
        )
    try:
        get_hf_file_metadata(hf_hub_url(name, "config.json"), timeout=10)
    except RepositoryNotFoundError:
        raise ValueError(
            f"{key}: {name} could not be loaded: no such model on the Hugging Face Hub, or it is private or gated "
            f"(log in with `hf auth login`); check the name, {local}"
        ) from None
    except EntryNotFoundError:
        raise ValueError(f"{key}: {name} has no config.json on the Hugging Face Hub (no transformers model)") from None
    except HfHubHTTPError as exc:
        raise ValueError(f"{key}: {name} could not be loaded from the Hugging Face Hub ({exc}); {local}") from None
    except Exception as exc:  # the transport's errors (DNS, connection refused, timeout): the Hub is out of reach
        raise ValueError(
            f"{key}: {name} could not be loaded: the Hugging Face Hub ({constants.ENDPOINT}) cannot be reached "
            f"({type(exc).__name__}: {exc}) and the model is not in the local cache; download it where there is a "
            f"network and set HF_HUB_OFFLINE=1, {local}"
        ) from None


def load_policy(model_config, path: str | None = None) -> nn.Module:
    """The causal LM at `path` (default model_config.path) with the config's dtype and attention
    implementation, on the GPU when there is one, with Liger-Kernel's model kernels when
    model_config.liger_kernels."""
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": getattr(torch, model_config.dtype)}
    if model_config.attn_implementation:
        kwargs["attn_implementation"] = model_config.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(path or model_config.path, **kwargs)
    if torch.cuda.is_available():
        model = model.cuda()
    if model_config.liger_kernels:
        logger.info("Liger-Kernel model kernels: %s", ", ".join(apply_model_kernels(model, model_config)))
    return model


def backbone(model: nn.Module) -> nn.Module:
    """The decoder stack without the lm_head (`model.model` for Llama/Qwen-style CausalLMs). A PEFT model is
    unwrapped first (its LoRA layers live inside the base model): `PeftModel.model` would be the whole CausalLM,
    whose output is the logits, not the hidden states."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if base is None or base is model:
        raise ValueError(f"cannot find the backbone of {type(model).__name__} (expected .{model.base_model_prefix})")
    return base


def lm_head_params(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    head = model.get_output_embeddings()
    return head.weight, getattr(head, "bias", None)


def last_hidden(model: nn.Module, **inputs) -> torch.Tensor:
    """The backbone's last hidden states [b, L, H] for `inputs` (input_ids, position_ids, attention_mask).
    A model sharded with FSDP2 runs through its root forward instead, with the head computing no logits
    (grpo_fast.distributed.fsdp.root_forward_hidden)."""

    if is_sharded(model):
        return root_forward_hidden(model, backbone(model), **inputs)
    out = backbone(model)(**inputs, use_cache=False)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def completion_hidden(model: nn.Module, batch: SequenceBatch) -> torch.Tensor:
    """[B, T, H] last hidden states at the positions that predict completion_ids[:, t]."""
    hidden = last_hidden(
        model, input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    )
    p, t = batch.prompt_width, batch.completion_ids.shape[1]
    return hidden[:, p - 1 : p - 1 + t]


def completion_logprobs(
    model: nn.Module,
    batch: SequenceBatch,
    temperature: float = 1.0,
    backend: str = "auto",
    dtype: torch.dtype | None = None,
):
    """Per-token logprobs [B, T] (fp32) of the completion tokens under `model`, via `fused_logprobs`.
    dtype: compute dtype of the hidden states and lm_head weight (None = hidden's own)."""

    hidden = completion_hidden(model, batch)
    weight, bias = lm_head_params(model)
    if dtype is not None and hidden.dtype != dtype:
        hidden = hidden.to(dtype)
    if weight.dtype != hidden.dtype:
        weight = weight.to(hidden.dtype)
        bias = None if bias is None else bias.to(hidden.dtype)
    head = asdict(logit_head(model))  # the model's logit scale / soft cap
    return fused_logprobs(
        hidden, weight, batch.completion_ids, temperature=temperature, backend=backend, bias=bias, **head
    )
