"""TRL 1.16's GRPOTrainer call, as a TRL script writes it, runs on grpo_fast's trainer: `args=trl.GRPOConfig(...)`
(every field honoured or refused by its name), `processing_class=`, `reward_funcs=None` with an environment that
scores the rollouts, rows without a prompt whose environment's reset() supplies it, `chat_template_kwargs`, and a
rollout_func that reads `trainer.processing_class`. Real multi-turn rollouts on a locally trained byte-level BPE
tokenizer and a tiny random model; the turns are scripted (scripted_chat.py)."""

from __future__ import annotations

import copy
import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scripted_chat import ScriptedTurns, build_bpe_chat_tokenizer, chatml_tokenizer, tool_call

from grpo_fast.core.tiny_models import TinyModelSpec, build_tiny_model
from grpo_fast.rollout.prompts import PromptEncoder
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


WHERE_IT_COUNTS = {
    "num_train_epochs": {"max_steps": -1},
    "eval_steps": {"eval_strategy": "steps"},
    "vllm_importance_sampling_correction": {"use_vllm": True},
}
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


def _trl_optimizer_steps(rows: int, args) -> int:
    """The optimizer steps TRL 1.16 trains for `args` on `rows` prompts in one process: its RepeatSampler's length
    through transformers' count of update steps per epoch (Trainer._inner_training_loop)."""
    from trl.trainer.utils import RepeatSampler

    sampler = RepeatSampler(
        range(rows),
        mini_repeat_count=args.num_generations,
        batch_size=args.generation_batch_size // args.num_generations,
        repeat_count=args.num_iterations * args.steps_per_generation,
    )
    batches = -(-len(sampler) // (args.per_device_train_batch_size * args.steps_per_generation))
    accumulation = args.gradient_accumulation_steps
    per_epoch = max(batches // accumulation + int(batches % accumulation > 0), 1)
    return args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * per_epoch)


@pytest.mark.parametrize(
    ("rows", "fields"),
    [
        (8, {"num_train_epochs": 1}),
        (7, {"num_train_epochs": 3}),  # the last, incomplete generation batch of each epoch is dropped
        (5, {"num_train_epochs": 0.5}),
        (9, {"num_train_epochs": 2, "num_iterations": 2}),
        (8, {"num_train_epochs": 1, "gradient_accumulation_steps": 2, "num_iterations": 3}),
        (8, {"max_steps": 4, "num_iterations": 2}),
    ],
)
def test_the_run_takes_as_many_optimizer_steps_as_trl(tmp_path, rows, fields):
    args = grpo_config(tmp_path, **{"max_steps": -1, **fields})
    config, _ = trl_config(args, num_rows=rows, model_max_length=1024)
    assert config.run.max_steps * config.grpo.num_iterations == _trl_optimizer_steps(rows, args)


def test_cadences_count_optimizer_steps_and_a_step_count_inside_a_batch_is_refused(tmp_path):
    args = grpo_config(tmp_path, max_steps=8, num_iterations=2, logging_steps=4, warmup_steps=0.25)
    config, _ = trl_config(args, num_rows=8, model_max_length=1024)
    assert (config.run.max_steps, config.run.log_every, config.optim.warmup_steps) == (4, 2, 2)
    with pytest.raises(ValueError, match=r"GRPOConfig.max_steps=3: .*multiple of 2"):
        trl_config(grpo_config(tmp_path, max_steps=3, num_iterations=2), num_rows=8, model_max_length=1024)
    with pytest.raises(ValueError, match=r"GRPOConfig.max_steps=-1: .*1 rows make no whole generation batch of 2"):
        trl_config(grpo_config(tmp_path, max_steps=-1), num_rows=1, model_max_length=1024)


def test_the_sampling_correction_of_vllm_applies_with_vllm_only(tmp_path):
    """TRL corrects vLLM's sampling; transformers' generate samples from the policy itself (its processed logprobs
    differ from the trainer's by top_k / top_p, which the correction would read as a mismatch)."""
    for use_vllm in (False, True):
        args = grpo_config(tmp_path, use_vllm=use_vllm, vllm_importance_sampling_correction=True, top_k=3)
        config, _ = trl_config(args, num_rows=8, model_max_length=1024)
        assert config.grpo.vllm_importance_sampling_correction is use_vllm


def test_a_string_prompt_is_encoded_as_trl_does_and_a_chat_prompt_through_the_template(tmp_path):
    tok = chatml_tokenizer(["say", "2"])
    config, _ = trl_config(grpo_config(tmp_path), num_rows=8, model_max_length=1024)
    encoder = PromptEncoder(tok, config.data)
    assert encoder.encode("say 2") == tok(text="say 2")["input_ids"]  # TRL: processing_class(text=prompts)
    chat = [{"role": "user", "content": "say 2"}]
    rendered = tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)
    assert encoder.encode(chat) == rendered["input_ids"]


def _length_rollout_trainer(tmp_path, reward=None, **fields):
    """A TRL-configured trainer whose rollout_func completes every prompt with "ok" (no engine); `reward` (default:
    the completion's length) scores it."""
    tok = chatml_tokenizer(["m", "ok"])

    def rollout_func(prompts, trainer):
        ids = [tok(p)["input_ids"] for p in prompts]
        done = tok("ok", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return {"prompt_ids": ids, "completion_ids": [done] * len(ids), "logprobs": [[-1.0] * len(done)] * len(ids)}

    return GRPOTrainer(
        model=build_tiny_model(tok, SPEC),
        reward_funcs=[reward or (lambda completions, **_: [float(len(c)) for c in completions])],
        args=grpo_config(tmp_path, **fields),
        train_dataset=[{"prompt": "m"}] * 2,
        processing_class=tok,
        rollout_func=rollout_func,
    )


def test_train_takes_trls_resume_from_checkpoint(tmp_path):
    first = _length_rollout_trainer(tmp_path, max_steps=1, save_strategy="steps", save_steps=1)
    try:
        first.train(resume_from_checkpoint=None)  # what TRL's script passes on a first run
    finally:
        first.close()
    (saved,) = (tmp_path / "run" / "checkpoints").iterdir()
    again = _length_rollout_trainer(tmp_path, max_steps=2)
    try:
        with pytest.raises(ValueError, match=r"resume_from_checkpoint: '/elsewhere' is not the latest checkpoint"):
            again.train(resume_from_checkpoint="/elsewhere")
        again.train(resume_from_checkpoint=str(saved))
    finally:
        again.close()
    assert again.step == 2 and [row["step"] for row in again.metrics.history if "loss" in row] == [1, 2]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_completion_length": None}, "GRPOConfig.max_completion_length=None"),
        ({"model_init_kwargs": {"dtype": "auto"}}, "model.dtype.*set from GRPOConfig: model_init_kwargs"),
        ({"model_init_kwargs": {"revision": "v2"}}, "GRPOConfig.model_init_kwargs=.*revision"),
        ({"generation_batch_size": 16}, "steps_per_generation=4: with generation_batch_size=16 and gradient_acc"),
    ],
)
def test_a_trl_value_grpo_fast_cannot_take_is_refused_naming_its_field(tmp_path, fields, named):
    with pytest.raises(ValueError, match=named):
        trl_config(grpo_config(tmp_path, **fields), num_rows=8, model_max_length=1024)


def test_trl_defaults_a_script_passes_and_transformers_zero_are_read_as_trl_reads_them(tmp_path):
    """TRL's grpo.py passes model_init_kwargs with revision 'main' and trust_remote_code False; transformers'
    max_grad_norm 0 (no clipping) is grpo_fast's too."""
    kwargs = {"revision": "main", "trust_remote_code": False, "attn_implementation": None, "dtype": "float32"}
    config, _ = trl_config(
        grpo_config(tmp_path, model_init_kwargs=kwargs, max_grad_norm=0), num_rows=8, model_max_length=1024
    )
    assert config.model.dtype == "float32" and config.optim.max_grad_norm == 0.0


def test_a_streaming_dataset_is_refused_by_name_and_a_reward_model_path_is_trls_reward_model(tmp_path):
    from grpo_fast.rewards.registry import reward_from_spec

    class Streaming:  # datasets.IterableDataset: rows, no length
        def __iter__(self):
            yield {"prompt": "m"}

    tok = chatml_tokenizer(["m"])
    with pytest.raises(ValueError, match=r"train_dataset: a dataset without a length \(Streaming"):
        GRPOTrainer(build_tiny_model(tok, SPEC), ["exact_match"], Streaming(), processing_class=tok)
    fn = reward_from_spec("org/reward-model")
    assert fn.func.__name__ == "reward_model" and fn.keywords == {"path": "org/reward-model"}
    with pytest.raises(ValueError, match=r"unknown name 'exact_mach'"):
        reward_from_spec("exact_mach")


def test_a_reward_functions_log_metric_lands_in_the_steps_metrics(tmp_path):
    def counted(completions, log_metric, **_):  # TRL 1.16's reward-function logging
        log_metric("scored", len(completions))
        return [1.0] * len(completions)

    trainer = _length_rollout_trainer(tmp_path, counted, max_steps=1)
    try:
        trainer.train()
    finally:
        trainer.close()
    (row,) = [row for row in trainer.metrics.history if "loss" in row]
    assert row["reward_log/scored"] == 4.0  # 2 prompts x 2 completions, one call
