"""Fallback rollout engine on transformers `generate`, for environments without vLLM.

It generates with the trainer's own model object (shared, so `load_weights` has nothing to copy), in
eval mode under `no_grad`; when the trainer's model is sharded over ranks (FSDP2), whose every forward is
a collective, with a whole copy of its own that `load_weights` fills. Sampling logprobs come from the
processed scores (after temperature / top-p / top-k), like vLLM's `processed_logprobs`. Seeding is per
call (`sampling.seed`), not per request (`seeds_each_request` False): a prompt's samples depend on the prompts
generated with it in one call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from grpo_fast.config_fields import ConfigSection, option
from grpo_fast.distributed.fsdp import is_sharded
from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec
from grpo_fast.rollout.texts import CompletionTexts
from grpo_fast.rollout.weight_check import WeightNameCheck
from grpo_fast.rollout.weight_sync import trainer_weights


@dataclass
class HFOptions(ConfigSection):
    """The transformers engine's own options (`rollout.hf`)."""

    key = "rollout.hf"
    batch_size: int = option(256, "sequences per `generate` call (prompts x completions, in order)", low=1)


class HFEngine(RolloutEngine):
    name = "hf"
    options = HFOptions
    shares_trainer_model = True
    seeds_each_request = False

    def __init__(self, model, tokenizer, batch_size: int = 256, owns_model: bool = False) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.shares_trainer_model = not owns_model
        self.texts = CompletionTexts(tokenizer)  # in the prompt's context, as vLLM's detokenizer writes them

    @classmethod
    def from_config(cls, config, *, options: HFOptions, model, tokenizer, export_model: Callable[[], str]) -> HFEngine:
        if not is_sharded(model):
            return cls(model, tokenizer, options.batch_size)
        from transformers import AutoModelForCausalLM

        first = next(model.parameters())
        copy = AutoModelForCausalLM.from_config(model.config, dtype=first.dtype).to(first.device)
        engine = cls(copy.eval().requires_grad_(False), tokenizer, options.batch_size, owns_model=True)
        engine.load_weights(trainer_weights(model))  # every rank builds its engine at once: a collective gather
        return engine

    @torch.no_grad()
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingSpec) -> list[list[Completion]]:
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        eos = {self.tokenizer.eos_token_id, *sampling.stop_token_ids} - {None}
        greedy = sampling.temperature == 0
        flat: list[Completion] = []
        rows = [ids for ids in prompt_token_ids for _ in range(sampling.n)]
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            width = max(len(r) for r in chunk)
            # Left padding, the rows padded as lists: one tensor each instead of two copies per row.
            input_ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in chunk], dtype=torch.long)
            attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in chunk], dtype=torch.long)
            out = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attn.to(device),
                max_new_tokens=sampling.max_tokens,
                do_sample=not greedy,
                temperature=None if greedy else sampling.temperature,
                top_p=None if greedy else sampling.top_p,
                # 0 disables top-k explicitly; None would fall back to generation_config's default (50),
                # sampling from a distribution the trainer's logprobs do not describe.
                top_k=None if greedy else max(sampling.top_k, 0),
                eos_token_id=sorted(eos),
                pad_token_id=pad,
                output_scores=not greedy,
                return_dict_in_generate=True,
            )
            gen = out.sequences[:, width:]
            if greedy:
                step_lps = None
            else:  # the sampled tokens' logprobs, step by step (never a [rows, steps, vocab] tensor)
                step_lps = torch.stack(
                    [
                        s.float().log_softmax(-1).gather(1, gen[:, t : t + 1]).squeeze(1)
                        for t, s in enumerate(out.scores)
                    ],
                    dim=1,
                ).tolist()
            for i, row in enumerate(gen.tolist()):
                ids, reason = [], "length"
                for tok in row:
                    ids.append(tok)
                    if tok in eos:
                        reason = "stop"
                        break
                lps = [0.0] * len(ids) if step_lps is None else step_lps[i][: len(ids)]
                flat.append(Completion(ids, lps, "", reason))
        self.texts(rows, flat)
        if was_training:
            self.model.train()
        return [flat[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompt_token_ids))]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
        """Copies `weights` into the engine's own model; a no-op when it generates with the trainer's model.
        Every parameter of the engine's model must come once, under its name (`WeightNameCheck`: the whole
        stream is consumed, as a sharded trainer's gathers need, then RuntimeError naming what was not)."""
        t0 = time.perf_counter()
        if self.shares_trainer_model:
            return {"sync/seconds": time.perf_counter() - t0, "sync/bytes": 0.0, "sync/buckets": 0.0}
        params = dict(self.model.named_parameters())
        check = WeightNameCheck(params, "the hf engine's model")
        nbytes = 0
        for name, tensor in check.stream(weights):
            params[name].data.copy_(tensor)
            nbytes += tensor.numel() * tensor.element_size()
        check.raise_if_incomplete()
        return {"sync/seconds": time.perf_counter() - t0, "sync/bytes": float(nbytes), "sync/buckets": 1.0}
