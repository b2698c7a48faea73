"""A GRPO run with the Python tool (`environment_factory=PythonEnvironment`), a share of its rollouts replaced by
attacks on the tool's sandbox, as the code demo's --forge-fraction replaces completions: every step completes, each
attack's call fails as the policy's failure (a failed call, counted at its step and in the run report), never as an
infrastructure failure, and nothing of any sandbox is left afterwards.

The rollout engine is the one stand-in: a random tiny model writes no attacks, so each rollout's first turn is
scripted, as token ids of a byte-level BPE tokenizer trained here, which the real chat parser reads back as a call
of the `python` tool: an attack of grpo_fast.testing.sandbox_attacks (ending with the interpreter's own exit, so
that each attack's call fails, whatever the attack did) for a seeded share of the rollouts, `print(6 * 7)` for the
others; its second turn answers. The tool, its sandbox and the trainer are real.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from grpo_fast.core.tiny_models import CHAT_TOKENS, RESPONSE_TEMPLATE, TinyModelSpec, build_tiny_model
from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec
from grpo_fast.sandbox import isolation
from grpo_fast.testing.processes import adopt_orphans, sandbox_processes
from grpo_fast.testing.sandbox_attacks import ATTACKS, PRELUDE

pytestmark = pytest.mark.skipif(isolation() not in ("namespaces", "bwrap"), reason="no local sandbox backend here")

TEMPLATE = (  # CHAT_TEMPLATE's turns, with a tool call's arguments as JSON (code has spaces, quotes, newlines)
    "{%- if tools %}<|system|>tools:{% for t in tools %} {{ t.function.name }}{% endfor %}<|end|>{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|assistant|>{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}"
    "</tool_call>{%- endfor %}<|end|>"
    "{%- else %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)
HONEST = "print(6 * 7)"
FORGED = {name: PRELUDE + program + "\nos._exit(7)\n" for name, program in ATTACKS.items()}


def code_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (trained on the programs and the turns' text) with TEMPLATE and its parser."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [*FORGED.values(), HONEST, '{"code": "print(6 * 7)"}', "tools: python 42 error"] * 4
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=800, special_tokens=["<pad>", *CHAT_TOKENS],
                                                        initial_alphabet=alphabet))  # fmt: skip
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|end|>")
    fast.add_special_tokens({"additional_special_tokens": list(CHAT_TOKENS)})
    fast.chat_template = TEMPLATE
    fast.response_template = copy.deepcopy(RESPONSE_TEMPLATE)
    fast.response_template["fields"]["tool_calls"].update(content="json", content_args={})
    return fast


class ForgingToolEngine(RolloutEngine):
    """A rollout's first turn calls the python tool, with an attack of FORGED for a `fraction` of rollouts (seeded)
    and HONEST for the others; its second turn answers "42". `forged` counts the attacks by name."""

    name = "forging-tool"

    def __init__(self, tokenizer, fraction: float, seed: int) -> None:
        self.tok, self.fraction, self.rng = tokenizer, fraction, random.Random(seed)
        self.tool_turn = tokenizer.convert_tokens_to_ids("<|tool|>")
        self.forged: dict[str, int] = {}

    @classmethod
    def from_config(cls, config, *, options, model, tokenizer, export_model):
        raise NotImplementedError("built by the test")

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingSpec) -> list[list[Completion]]:
        return [[self._turn(ids) for _ in range(sampling.n)] for ids in prompt_token_ids]

    def _turn(self, context: list[int]) -> Completion:
        if self.tool_turn in context:
            text = "42<|end|>"
        else:
            code = HONEST
            if self.rng.random() < self.fraction:
                name = self.rng.choice(sorted(FORGED))
                self.forged[name] = self.forged.get(name, 0) + 1
                code = FORGED[name]
            arguments = self.tok.apply_chat_template(
                [{"role": "assistant", "content": "", "tool_calls": [_call(code)]}], tokenize=False
            )
            text = arguments.removeprefix("<|assistant|>")
        ids = self.tok.encode(text, add_special_tokens=False)
        return Completion(ids, [-1.0] * len(ids), text, "stop")

    def load_weights(self, weights):
        return {}


def _call(code: str) -> dict:
    return {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}


def tool_answered(completions, **_):
    """1 where the tool's result was the honest call's 42 (the attacks' calls failed)."""
    return [float(any(m["role"] == "tool" and m["content"].strip() == "42" for m in c)) for c in completions]


def hostile_run(tmp_path: Path, steps: int, prompts: int, generations: int, fraction: float) -> None:
    from grpo_fast.trainer import GRPOTrainer, load_config

    adopt_orphans()
    before = set(sandbox_processes(wait_s=0))  # other tests' sandboxes (idle judges, spares): not this run's
    tok = code_tokenizer()
    engine = ForgingToolEngine(tok, fraction, seed=0)
    opts = [f"rollout.num_generations={generations}", "rollout.max_completion_length=2000"]
    opts += ["rollout.max_model_len=2100", "rollout.max_tool_calling_iterations=1", "rollout.tool_timeout_seconds=60"]
    opts += ["rollout.environment_factory=python", f"run.prompts_per_step={prompts}", f"run.max_steps={steps}"]
    opts += ["run.eval_every=0", "run.save_final=false", "run.plots=false", "run.tensorboard=false"]
    opts += ["run.progress=false", f"run.output_dir={tmp_path}", "reward.workers=0", "check.difficulty_prompts=0"]
    rows = [{"prompt": [{"role": "user", "content": f"compute {i}"}]} for i in range(prompts)]
    step_metrics: list[dict] = []
    model = build_tiny_model(tok, TinyModelSpec(max_position_embeddings=2176))
    trainer = GRPOTrainer(
        model, [tool_answered], rows, config=load_config(None, opts), tokenizer=tok, engine=engine,
        callbacks=[lambda trainer, rollout, metrics: step_metrics.append(dict(metrics))],
    )  # fmt: skip
    try:
        trainer.train()  # an InfrastructureError here, raised by a call, fails the test
    finally:
        trainer.close()
    assert trainer.step == steps and len(step_metrics) == steps
    attacks = sum(engine.forged.values())
    assert attacks > 0, "no rollout was forged"
    failed = sum(m.get("tools/python/failures", 0.0) for m in step_metrics)
    assert failed == attacks, (failed, engine.forged)  # each attack's call failed, and only those
    report = (tmp_path / "report.md").read_text()
    assert f"- python: {attacks:g} over the run" in report, report
    assert sandbox_processes(ignore=before) == []


def test_a_python_tool_run_with_hostile_calls_completes_and_counts_them(tmp_path):
    """The CI variant: one step, half of its rollouts attacks."""
    hostile_run(tmp_path, steps=1, prompts=2, generations=4, fraction=0.5)


@pytest.mark.slow
def test_a_longer_python_tool_run_with_every_attack_completes_and_counts_them(tmp_path):
    hostile_run(tmp_path, steps=3, prompts=4, generations=4, fraction=0.6)
