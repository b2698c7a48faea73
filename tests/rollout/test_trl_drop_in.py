"""TRL 1.16's GRPOTrainer call, as a TRL script writes it, runs on grpo_fast's trainer: `args=trl.GRPOConfig(...)`
(every field honoured or refused by its name), `processing_class=`, `reward_funcs=None` with an environment that
scores the rollouts, rows without a prompt whose environment's reset() supplies it, `chat_template_kwargs`, and a
rollout_func that reads `trainer.processing_class`. Real multi-turn rollouts on a locally trained byte-level BPE
tokenizer and a tiny random model; the turns are scripted (scripted_chat.py)."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scripted_chat import ScriptedTurns, build_bpe_chat_tokenizer, chatml_tokenizer, tool_call

from grpo_fast.core.tiny_models import TinyModelSpec, build_tiny_model
from grpo_fast.trainer import GRPOTrainer
from grpo_fast.trainer.trl_args import INERT, trl_config

trl = pytest.importorskip("trl")

SPEC = TinyModelSpec(hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128, max_position_embeddings=1024)
THINK_OFF = (
    "{%- if add_generation_prompt and enable_thinking is defined and enable_thinking is false %}<quiet>{% endif %}"
)


def grpo_config(tmp_path, **fields):
    """TRL's GRPOConfig for a one-step CPU run (its other fields TRL's defaults)."""
    base = dict(
        output_dir=str(tmp_path / "run"),
        bf16=False,
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=128,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        vllm_importance_sampling_correction=False,  # the scripted engine's logprobs are not the model's
    )
    return trl.GRPOConfig(**{**base, **fields})


class Quiz:
    """TRL's environment pattern: reset() builds the prompt from the row, get_reward() (async) scores the state."""

    resets: list[dict] = []

    def reset(self, **row) -> str:
        Quiz.resets.append(row)
        self.target, self.said = row["target"], None
        return f"say {row['target']}"

    def answer(self, value: int) -> str:
        """Gives the answer.

        Args:
            value: The answer.
        """
        self.said = value
        return "noted"

    async def get_reward(self) -> float:
        return float(self.said == self.target)


def test_a_trl_call_with_grpo_config_and_environment_owned_prompts_and_rewards_trains(tmp_path):
    tok = chatml_tokenizer(["say 2", "say 3", "answer", "value", "noted", "<quiet>"])
    tok.chat_template += THINK_OFF  # renders <quiet> after the generation prompt when enable_thinking is False
    script = {"say 2": [tool_call("answer", value=2), "done"], "say 3": [tool_call("answer", value=4), "done"]}
    Quiz.resets.clear()
    trainer = GRPOTrainer(
        model=build_tiny_model(tok, SPEC),
        reward_funcs=None,
        args=grpo_config(tmp_path, chat_template_kwargs={"enable_thinking": False}),
        train_dataset=[{"target": 2}, {"target": 3}],  # no prompt column: reset() supplies it
        processing_class=tok,
        environment_factory=Quiz,
        engine=ScriptedTurns(tok, script),
    )
    try:
        trainer.train()
        batch = trainer.last_rollout
    finally:
        trainer.close()
    assert trainer.processing_class is tok and trainer.rewards.names == ["environment_reward"]
    assert all(set(row) == {"target"} for row in Quiz.resets)  # the placeholder prompt never reaches reset()
    prompts = [tok.decode(ids) for ids in batch.prompt_ids]
    assert all(p.endswith("<|im_start|>assistant\n<quiet>") for p in prompts)  # chat_template_kwargs rendered
    by_target = {
        c.episode.environment.target: r for c, r in zip(batch.completions, batch.rewards.tolist(), strict=True)
    }
    assert by_target == {2: 1.0, 3: 0.0}  # the async get_reward, awaited
    assert (
        trainer.step == 1 and trainer.config.rollout.num_generations == 2 and trainer.config.run.prompts_per_step == 2
    )


def test_a_rollout_func_reads_the_trainers_processing_class(tmp_path):
    tok = chatml_tokenizer(["m", "ok"])
    seen = []

    def rollout_func(prompts, trainer):
        processing = trainer.processing_class  # TRL's name for the tokenizer
        seen.append(processing)
        ids = [processing(p)["input_ids"] for p in prompts]
        done = processing("ok", add_special_tokens=False)["input_ids"] + [processing.eos_token_id]
        return {"prompt_ids": ids, "completion_ids": [done] * len(ids), "logprobs": [[-1.0] * len(done)] * len(ids)}

    trainer = GRPOTrainer(
        model=build_tiny_model(tok, SPEC),
        reward_funcs=[lambda completions, **_: [float(len(c)) for c in completions]],
        args=grpo_config(tmp_path),
        train_dataset=[{"prompt": "m"}] * 2,
        processing_class=tok,
        rollout_func=rollout_func,
    )
    try:
        trainer.train()
    finally:
        trainer.close()
    assert seen and all(s is tok for s in seen)


def test_trl_arguments_grpo_fast_does_not_support_are_refused_by_name(tmp_path):
    tok = chatml_tokenizer(["m"])
    model = build_tiny_model(tok, SPEC)
    rows = [{"prompt": "m"}] * 2
    with pytest.raises(ValueError, match=r"GRPOConfig.push_to_hub=True: not supported.*huggingface_hub"):
        GRPOTrainer(model=model, reward_funcs=["exact_match"], args=grpo_config(tmp_path, push_to_hub=True))
    with pytest.raises(ValueError, match=r"peft_config: not supported.*get_peft_model"):
        GRPOTrainer(model=model, reward_funcs=["exact_match"], train_dataset=rows, peft_config=object())
    with pytest.raises(ValueError, match=r"reward_funcs: no reward source"):
        GRPOTrainer(model=model, train_dataset=rows, args=grpo_config(tmp_path), processing_class=tok)
    with pytest.raises(TypeError, match=r"train_dataset: got a config; pass it by name, args="):
        GRPOTrainer(model, ["exact_match"], grpo_config(tmp_path), rows)


def _non_default(field: dataclasses.Field, value):
    """A value of the field's type other than `value`, or None where the type is not a plain one."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int) and not isinstance(value, bool):
        return value + 3
    if isinstance(value, float):
        return value / 2 + 0.125
    if value is None and "float" in str(field.type):
        return 0.5
    if value is None and "int" in str(field.type):
        return 7
    return None


WHERE_IT_COUNTS = {"num_train_epochs": {"max_steps": -1}, "eval_steps": {"eval_strategy": "steps"}}
"""Fields that count only beside another's value (in TRL as here): checked there."""


def test_every_grpo_config_field_changes_the_run_or_is_refused_by_name(tmp_path):
    """The contract of docs/trl.md: a non-default value of a field that is not inert either changes the TrainConfig
    or is refused with the field's name; never silently ignored. Checked for every field of a plain type."""
    bases = {name: grpo_config(tmp_path, **fields) for name, fields in WHERE_IT_COUNTS.items()}
    bases[None] = grpo_config(tmp_path, save_strategy="steps")
    mapped = {name: trl_config(args, num_rows=8, model_max_length=1024)[0].to_dict() for name, args in bases.items()}
    checked, ignored = 0, []
    for field in dataclasses.fields(bases[None]):
        name = field.name if field.name in bases else None
        other = _non_default(field, getattr(bases[name], field.name))
        if field.name in INERT or other is None or (field.name == "use_cpu" and not torch.cuda.is_available()):
            continue  # use_cpu on a machine without a GPU: what grpo_fast does anyway
        args = copy.copy(bases[name])
        object.__setattr__(args, field.name, other)
        checked += 1
        try:
            config, weights = trl_config(args, num_rows=8, model_max_length=1024)
        except ValueError as exc:
            assert field.name in str(exc), (field.name, str(exc))
            continue
        if config.to_dict() == mapped[name] and weights is None:
            ignored.append(field.name)
    assert checked > 100 and not ignored, ignored


def test_the_grpo_config_table_in_the_docs_is_current():
    script = Path(__file__).resolve().parents[2] / "scripts" / "config_docs.py"
    proc = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_a_tool_run_prepares_the_tokenizer_as_trl_does(tmp_path):
    """A Qwen3 tokenizer without a response template, whose chat template is not prefix-preserving: the run gets
    the response template TRL sets and renders every prompt with TRL's training template and the run's
    chat_template_kwargs (the reference: TRL's own functions and Qwen3's enable_thinking rendering)."""
    from scripted_chat import QWEN3_SPECIAL, qwen3_template
    from trl.chat_template_utils import get_training_chat_template
    from trl.chat_template_utils import qwen3_template as trl_response_template

    from grpo_fast.rollout.prompts import PromptEncoder, stop_token_ids
    from grpo_fast.rollout.rollouts import build_rollouts
    from grpo_fast.trainer import load_config

    tok = build_bpe_chat_tokenizer(["Does the gene BRCA1 interact?", "answer", "value"], special=QWEN3_SPECIAL)
    tok.chat_template = qwen3_template()
    config = load_config(None, ["data.chat_template_kwargs={enable_thinking: false}"])
    prompts = PromptEncoder(tok, config.data)
    rollouts = build_rollouts(config.rollout, prompts, tok, stop_token_ids(tok, []), tools=[Quiz().answer])
    assert tok.response_template == trl_response_template
    assert prompts.chat_template == get_training_chat_template(tok) and prompts.chat_template != tok.chat_template
    ids = rollouts.chat.prompt_ids([{"role": "user", "content": "Does the gene BRCA1 interact?"}], [])
    assert tok.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # enable_thinking: false
    assert prompts.encode("Does the gene BRCA1 interact?") == ids  # every prompt of the run, the same way


def test_prompts_from_reset_with_the_environment_named_in_the_config(tmp_path):
    from grpo_fast.rollout.environments import PlaceholderPrompt
    from grpo_fast.trainer import load_config

    tok = chatml_tokenizer(["say 2", "answer", "value"])
    options = [f"run.output_dir={tmp_path}", "rollout.environment_factory=test_trl_drop_in:Quiz", "reward.workers=0"]
    trainer = GRPOTrainer(
        build_tiny_model(tok, SPEC), None, [{"target": 2}], config=load_config(None, options), tokenizer=tok
    )
    try:
        assert isinstance(trainer.train_rows[0]["prompt"], PlaceholderPrompt) and trainer.train_rows[0]["target"] == 2
        assert trainer.rewards.names == ["environment_reward"]
    finally:
        trainer.close()
