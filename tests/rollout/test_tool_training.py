"""Training on multi-turn rollouts through GRPOTrainer, the way a TRL 1.16 script writes it (tools=,
environment_factory=, rollout_func=, rewards that read message lists and `environments`), with the tool agent
of tool_agent.py on the transformers engine."""

from __future__ import annotations

import pytest
from tool_agent import TOOLS, CounterEnv
from transformers import AutoModelForCausalLM

from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.trainer import GRPOTrainer, load_config

OPTIONS = (
    "rollout.engine=hf",
    "rollout.num_generations=2",
    "rollout.temperature=1.0",
    "rollout.max_completion_length=160",
    "rollout.max_model_len=256",
    "rollout.tool_timeout_seconds=0.5",
    "run.prompts_per_step=4",
    "run.max_steps=1",
    "run.eval_every=0",
    "run.save_final=false",
    "reward.workers=0",
    "run.report_to=[]",
    "run.progress=false",
    "run.plots=false",
    "grpo.vllm_importance_sampling_correction=true",  # the old logprobs are recomputed: the mismatch is measured
    "optim.lr=1e-4",
)


def _trainer(tool_agent, tmp_path, rewards, rows, *overrides: str, **kwargs) -> GRPOTrainer:
    _, tok, path = tool_agent
    config = load_config(None, [*OPTIONS, f"run.output_dir={tmp_path}", *overrides])
    model = AutoModelForCausalLM.from_pretrained(path)  # a copy of its own: training changes it
    return GRPOTrainer(model, rewards, rows, config=config, tokenizer=tok, **kwargs)


def _train(trainer: GRPOTrainer):
    """(the last step's metrics, its rollout batch) of `trainer.train()`; the trainer is closed after."""
    try:
        trainer.train()
        return trainer.metrics.history[-1], trainer.last_rollout
    finally:
        trainer.close()


@pytest.mark.parametrize(
    "layout", [("run.packing=true",), ("run.packing=false", "run.share_prompt=true")], ids=["packed", "shared_prompts"]
)
def test_trl_tools_and_environment_train_with_tool_tokens_out_of_the_loss(tool_agent, tmp_path, layout):
    seen = {}

    def counter_reward(completions, environments, **kwargs):  # TRL's pattern: the environments' state
        seen.update(completions=completions, environments=environments)
        return [float(env.value) for env in environments]

    rows = [{"prompt": [{"role": "user", "content": p}]} for p in ("m", "c", "x", "a")]
    tools = {"tools": list(TOOLS), "environment_factory": CounterEnv}
    trainer = _trainer(tool_agent, tmp_path, [counter_reward], rows, *layout, **tools)
    metrics, batch = _train(trainer)
    assert trainer.rewards.names == ["counter_reward", "environment_reward"]  # TRL adds the environment's reward
    assert metrics["tools/calls_per_rollout"] > 0.5 and metrics["tools/masked_token_frac"] > 0.1
    # The engine's logprobs of its sampled tokens equal the trainer's (one model, fp32); a tool result scored as
    # if sampled (logprob 0.0 against the model's) would show here as a mismatch of order 1.
    assert metrics["mismatch/abs_logprob_diff_mean"] < 1e-4, metrics["mismatch/abs_logprob_diff_mean"]
    sampled = [c.num_sampled for c in batch.generated]
    assert metrics["completion/length_mean"] == pytest.approx(sum(sampled) / len(sampled))
    assert all(isinstance(c, list) and c[0]["role"] == "assistant" for c in seen["completions"])
    assert any(m["role"] == "tool" for c in seen["completions"] for m in c)
    assert all(isinstance(env, CounterEnv) for env in seen["environments"])
    assert batch.rewards.tolist() == [
        c.episode.environment.value + (c.episode.environment.value == 3) for c in batch.completions
    ]


def test_a_rollout_function_brings_its_own_completions_mask_and_reward_columns(tool_agent, tmp_path):
    feedback_seen = []

    def rollout_func(prompts, trainer):  # TRL's escape hatch: sample, then insert the environment's feedback
        tok = trainer.tokenizer
        prompt_ids = [tok(p)["input_ids"] for p in prompts]
        spec = SamplingSpec(n=1, max_tokens=4, temperature=1.0, seed=0)
        sampled = [g[0] for g in trainer.engine.generate(prompt_ids, spec)]
        feedback = tok("ok", add_special_tokens=False)["input_ids"]
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": [c.token_ids + feedback for c in sampled],
            "logprobs": [c.logprobs + [0.0] * len(feedback) for c in sampled],
            "env_mask": [[1] * len(c.token_ids) + [0] * len(feedback) for c in sampled],
            "feedback": ["ok"] * len(sampled),
        }

    def feedback_reward(completions, feedback, completion_ids, **kwargs):
        feedback_seen.extend(feedback)
        return [float(len(ids) % 2) for ids in completion_ids]

    trainer = _trainer(
        tool_agent, tmp_path, [feedback_reward], [{"prompt": p} for p in "mcxa"], rollout_func=rollout_func
    )
    metrics, batch = _train(trainer)
    assert set(feedback_seen) == {"ok"} and len(feedback_seen) % 8 == 0  # the preflight probe samples too
    assert all(c.sampled[-2:] == [False, False] and c.sampled[0] for c in batch.completions)
    assert metrics["completion/length_mean"] == pytest.approx(sum(len(c.token_ids) - 2 for c in batch.completions) / 8)
    assert metrics["mismatch/abs_logprob_diff_mean"] < 1e-4


def test_a_rollout_function_that_breaks_its_contract_is_named(tool_agent, tmp_path):
    trainer = _trainer(
        tool_agent,
        tmp_path,
        [lambda completions, **_: [0.0] * len(completions)],
        [{"prompt": "m"}] * 4,
        rollout_func=lambda prompts, trainer: {"prompt_ids": [[1]] * len(prompts), "completion_ids": [[2]]},
    )
    try:
        with pytest.raises(ValueError, match=r"rollout_func: its output lacks \['logprobs'\]"):
            trainer.train()
    finally:
        trainer.close()


def test_tools_run_in_every_mode_and_a_rollout_function_in_sync_only():
    for mode in ("partial", "async"):
        assert load_config(None, ["rollout.tools=[multiply]", f"rollout.mode={mode}"]).rollout.scheduler.rounds
    with pytest.raises(ValueError, match="rollout.mode partial: a rollout_func cannot be continued over rounds"):
        load_config(None, ["rollout.rollout_func=tool_agent:conversation", "rollout.mode=partial"])


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"completion_ids": [[-1]]}, r"completion_ids\[0\]: expected non-negative integer token ids, got -1"),
        ({"completion_ids": [[2.0]]}, r"completion_ids\[0\]: expected non-negative integer token ids, got 2.0"),
        ({"prompt_ids": [[]]}, r"prompt_ids\[0\]: expected a non-empty list of token ids"),
        ({"logprobs": [[float("nan")]]}, r"logprobs\[0\]: expected finite logprobs <= 0, got nan"),
        ({"logprobs": [[0.5]]}, r"logprobs\[0\]: expected finite logprobs <= 0, got 0.5"),
    ],
)
def test_a_rollout_functions_ids_and_logprobs_are_checked_naming_the_entry(tool_agent, change, named):
    """Each gave a raw OverflowError or TypeError from deep inside, or was trained (NaN or positive logprobs)."""
    from grpo_fast.rollout.base import SamplingSpec
    from grpo_fast.rollout.generation import CustomRollouts

    _, tok, _ = tool_agent
    out = {"prompt_ids": [[1, 2]], "completion_ids": [[3, 4]], "logprobs": [[-0.5, -0.1]], **change}
    rollouts = CustomRollouts(lambda prompts: out, tok, (tok.eos_token_id,))
    with pytest.raises(ValueError, match=rf"^rollout_func: {named}"):
        rollouts.generate(None, [{"prompt": "m"}], SamplingSpec(n=1, max_tokens=8))
