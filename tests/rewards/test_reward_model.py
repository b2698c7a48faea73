"""The learned reward model (`reward_model`) and per-row routing of reward functions (`when`).

The reward model is a tiny random-init Qwen2 sequence classifier over the character tokenizer, saved locally;
every expected score is a direct forward of that model on one text, unpadded and unbatched."""

from __future__ import annotations

import json
import math
import pickle

import pytest
import torch

from grpo_fast.core.tiny_models import TinyModelSpec, build_char_tokenizer, random_causal_lm
from grpo_fast.rewards import reward_model as rm_module
from grpo_fast.rewards.outcomes import InfrastructureError
from grpo_fast.rewards.reward_model import reward_model
from grpo_fast.rewards.reward_set import RewardSet, TrainerState
from grpo_fast.rewards.routing import RoutedReward
from grpo_fast.trainer.preflight import PreflightReport, reward_scale_warnings, verifier_self_test

STATE = TrainerState(global_step=0, max_steps=1)
PROMPTS = ["(12+7)%10=", "what is 3*4? ", "a", "(99-1)%7=", "say hi: "]
COMPLETIONS = ["9", "twelve, since 3*4 = 12", "bcdefgh", "0", "hi there, nice to meet you"]
TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }} {% endfor %}"


def _classifier(tokenizer, num_labels: int, seed: int = 0):
    """Random-init classifier; its config names no pad token (the reward function must set one)."""
    shape = TinyModelSpec(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128)
    return random_causal_lm(len(tokenizer), shape, seed=seed, num_labels=num_labels).eval()


def _save(path, num_labels: int = 1, chat_template: str | None = None):
    """(directory, model, the tokenizer that was saved there: the one the reward model must read)."""
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = chat_template
    model = _classifier(tokenizer, num_labels)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), model, tokenizer


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("rm") / "one_label")


def _direct(model, tokenizer, text: str, keep_last: int | None = None) -> torch.Tensor:
    """Logits [num_labels] of one unpadded text (its last `keep_last` tokens)."""
    ids = tokenizer(text)["input_ids"][-keep_last if keep_last else 0 :]
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_batched_padded_scores_equal_a_forward_of_each_text_alone(rm):
    path, model, tokenizer = rm
    assert len({len(p + c) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)}) == len(PROMPTS)  # all lengths differ
    scores = reward_model(PROMPTS, COMPLETIONS, path=path, batch_size=2, device="cpu")
    expected = [float(_direct(model, tokenizer, p + c)[0]) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    assert scores == pytest.approx(expected, abs=1e-5)
    assert len(set(scores)) == len(scores)  # the texts are told apart
    assert reward_model(PROMPTS, COMPLETIONS, path=path, scale=2.0, shift=-1.0, device="cpu") == pytest.approx(
        [2.0 * s - 1.0 for s in expected], abs=2e-5
    )


def test_long_texts_keep_their_end(rm):
    path, model, tokenizer = rm
    scores = reward_model(PROMPTS, COMPLETIONS, path=path, batch_size=3, max_length=6, device="cpu")
    expected = [float(_direct(model, tokenizer, p + c, 6)[0]) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    assert scores == pytest.approx(expected, abs=1e-5)


def test_two_labels_score_the_logit_difference(tmp_path):
    path, model, tokenizer = _save(tmp_path / "two_labels", num_labels=2)
    logits = [_direct(model, tokenizer, p + c) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    expected = [float(x[1] - x[0]) for x in logits]
    assert reward_model(PROMPTS, COMPLETIONS, path=path, batch_size=4) == pytest.approx(expected, abs=1e-5)


def test_chat_pairs_go_through_the_chat_template_or_are_joined(tmp_path):
    prompts = [[{"role": "user", "content": "what is 2+2?"}], [{"role": "user", "content": "hi"}]]
    completions = [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "hello there"}]]
    path, model, tokenizer = _save(tmp_path / "templated", chat_template=TEMPLATE)
    expected = [float(_direct(model, tokenizer, text)[0]) for text in ["u:what is 2+2? a:4 ", "u:hi a:hello there "]]
    assert reward_model(prompts, completions, path=path, batch_size=2) == pytest.approx(expected, abs=1e-5)
    path, model, tokenizer = _save(tmp_path / "plain")
    expected = [float(_direct(model, tokenizer, text)[0]) for text in ["what is 2+2?\n4", "hi\nhello there"]]
    assert reward_model(prompts, completions, path=path, batch_size=2) == pytest.approx(expected, abs=1e-5)


def test_the_pool_gives_the_in_process_scores(rm):
    path, model, tokenizer = rm
    rows = [{"prompt": p} for p in PROMPTS]
    spec = {"name": "reward_model", "path": path, "batch_size": 2}
    pooled, local = RewardSet([spec], workers=1, timeout=120), RewardSet([spec], workers=0)
    try:
        by_pool = pooled.submit(rows, COMPLETIONS, [[1]] * len(rows), STATE).result()
    finally:
        pooled.close()
    here = local.submit(rows, COMPLETIONS, [[1]] * len(rows), STATE).result()
    assert pooled.in_process == [False] and by_pool.failures == {}
    torch.testing.assert_close(by_pool.per_func, here.per_func, atol=1e-5, rtol=0)
    expected = [float(_direct(model, tokenizer, p + c)[0]) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    torch.testing.assert_close(here.per_func[:, 0], torch.tensor(expected), atol=1e-5, rtol=0)


def test_batched_calls_in_the_pool_give_each_completion_its_score_alone(rm):
    """batch_size 1 (a call per completion) against batch_size 5 (the five completions, of five lengths, padded
    into one call and one forward) through a one-worker pool: the same score per completion within 1e-5 (padding
    changes only the summation order of fp32 ops), each a direct forward of its own text."""
    path, model, tokenizer = rm
    rows = [{"prompt": p} for p in PROMPTS]
    scores = {}
    for batch_size in (1, 5):
        spec = {"name": "reward_model", "path": path, "batch_size": batch_size}
        pooled = RewardSet([spec], workers=1, timeout=120)
        try:
            scored = pooled.submit(rows, COMPLETIONS, [[1]] * len(rows), STATE).result()
        finally:
            pooled.close()
        assert pooled.in_process == [False] and scored.failures == {}
        scores[batch_size] = scored.per_func[:, 0]
    torch.testing.assert_close(scores[5], scores[1], atol=1e-5, rtol=0)
    expected = [float(_direct(model, tokenizer, p + c)[0]) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    torch.testing.assert_close(scores[1], torch.tensor(expected), atol=1e-5, rtol=0)


@pytest.mark.parametrize("workers", [0, 1])
def test_routing_gives_each_row_the_reward_of_the_function_that_applies(rm, workers):
    path, model, tokenizer = rm
    rows = [
        {"prompt": "(2+2)%10=", "answer": "4", "reward_type": "verifiable"},
        {"prompt": "say hi: ", "answer": None, "reward_type": "open"},
        {"prompt": "(3+3)%10=", "answer": "6", "reward_type": "verifiable"},
        {"prompt": "a poem: ", "answer": None, "reward_type": "open"},
        {"prompt": "chit chat: ", "answer": None, "reward_type": "neither"},
    ]
    texts = ["4", "hi there", "5", "roses are red", "ok"]
    specs = [
        {"name": "exact_match", "when": {"reward_type": "verifiable"}},
        {"name": "reward_model", "path": path, "when": {"reward_type": ["open", "other"]}},
    ]
    rewards = RewardSet(specs, [2.0, 0.5], workers=workers, timeout=120)
    try:
        scored = rewards.submit(rows, texts, [[1]] * len(rows), STATE).result()
    finally:
        rewards.close()
    assert rewards.names == ["exact_match_reward", "reward_model"] and scored.failures == {}
    rm_score = {i: float(_direct(model, tokenizer, rows[i]["prompt"] + texts[i])[0]) for i in (1, 3)}
    nan = math.nan
    expected = torch.tensor([[1.0, nan], [nan, rm_score[1]], [0.0, nan], [nan, rm_score[3]], [nan, nan]])
    torch.testing.assert_close(scored.per_func, expected, atol=1e-5, rtol=0, equal_nan=True)
    combined = torch.tensor([2.0, 0.5 * rm_score[1], 0.0, 0.5 * rm_score[3], nan])
    torch.testing.assert_close(rewards.combine(scored.per_func), combined, atol=1e-5, rtol=0, equal_nan=True)
    torch.testing.assert_close(rewards.full_rewards(rows), torch.tensor([2.0, 0.5, 2.0, 0.5, 0.0]))


def test_a_routed_function_pickles_keeps_its_name_and_needs_its_column():
    (fn,) = RewardSet([{"name": "exact_match", "when": {"reward_type": "verifiable"}}], workers=0).funcs
    assert isinstance(fn, RoutedReward) and pickle.loads(pickle.dumps(fn))(
        ["p", "p"], ["4", "4"], answer=["4", "4"], reward_type=["verifiable", "open"]
    ) == [1.0, None]
    rewards = RewardSet([{"name": "exact_match", "when": {"reward_type": "verifiable"}}], workers=1)
    try:
        with pytest.raises(KeyError, match=r"needs dataset column\(s\) \['reward_type'\]"):
            rewards.submit([{"prompt": "p", "answer": "4"}], ["4"], [[1]], STATE).result()
    finally:
        rewards.close()
    with pytest.raises(KeyError, match=r"when: dataset column\(s\) \['reward_type'\] missing"):
        rewards.full_rewards([{"prompt": "p", "answer": "4"}])
    for bad in ({}, "verifiable", {"reward_type": []}):
        with pytest.raises(ValueError, match="'exact_match_reward': when: "):
            RewardSet([{"name": "exact_match", "when": bad}], workers=0)


def test_preflight_self_tests_the_routed_verifier_and_flags_the_reward_model(rm):
    specs = [
        {"name": "exact_match", "when": {"reward_type": "verifiable"}},
        {"name": "reward_model", "path": rm[0], "when": {"reward_type": "open"}},
    ]
    report = PreflightReport()
    rewards = RewardSet(specs, workers=0)
    verifier_self_test(rewards, report)
    reward_scale_warnings(rewards, report)
    assert {r.function for r in report.self_test} == {"exact_match_reward"} and not report.self_test_failures
    assert any("reward reward_model has no self-test samples" in w for w in report.warnings)
    assert any("reward reward_model is unbounded (range [-inf, inf])" in w for w in report.warnings)


def test_bad_options_are_errors_that_name_them(rm, tmp_path):
    path = rm[0]
    with pytest.raises(ValueError, match="reward_model: path: "):
        reward_model(["p"], ["c"])
    for option, value in (("batch_size", 0), ("max_length", -1), ("batch_size", 2.5)):
        with pytest.raises(ValueError, match=f"reward_model: {option}: expected a positive integer"):
            reward_model(["p"], ["c"], path=path, **{option: value})
    with pytest.raises(ValueError, match="reward_model: device: "):
        reward_model(["p"], ["c"], path=path, device="gpu")
    with pytest.raises(ValueError, match="reward_model: dtype: "):
        reward_model(["p"], ["c"], path=path, dtype="float33")
    three = _save(tmp_path / "three_labels", num_labels=3)[0]
    with pytest.raises(ValueError, match="has 3 labels; expected 1"):
        reward_model(["p"], ["c"], path=three)


class _TouchesAFile:
    """Unpickled, creates `marker` (what a payload in a weights file would do, harmlessly)."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return eval, (f"__import__('pathlib').Path({self.marker!r}).touch()",)


def test_a_reward_model_whose_weights_carry_a_payload_is_refused_loudly_in_process(tmp_path):
    """Weights as a pickle (`pytorch_model.bin`) with a payload: transformers reads it with weights_only=True, the
    payload never runs, and the failure is an InfrastructureError that names the path, raised by the in-process
    scoring (not the completions' failure reward, which its guard gives to what a completion causes)."""
    path, model, _ = _save(tmp_path / "rm", num_labels=1)
    marker = tmp_path / "payload-ran"
    (tmp_path / "rm" / "model.safetensors").unlink()
    torch.save({**model.state_dict(), "extra": _TouchesAFile(marker)}, tmp_path / "rm" / "pytorch_model.bin")
    rewards = RewardSet([{"name": "reward_model", "path": path, "device": "cpu", "in_process": True}], workers=0)
    with pytest.raises(InfrastructureError, match=f"reward_model: path: {path} cannot be loaded.*Weights only"):
        rewards.submit([{"prompt": "p"}], ["c"], [[1]], STATE)
    assert not marker.exists()


def test_a_reward_model_directory_never_runs_its_own_code(tmp_path):
    """A config.json and tokenizer_config.json whose `auto_map` names a module in the directory: without
    trust_remote_code, transformers builds its own classes and the module is never imported."""
    path, model, tokenizer = _save(tmp_path / "rm", num_labels=1)
    marker = tmp_path / "module-ran"
    (tmp_path / "rm" / "custom.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    for name, key in (
        ("config.json", "AutoModelForSequenceClassification"),
        ("tokenizer_config.json", "AutoTokenizer"),
    ):
        file = tmp_path / "rm" / name
        file.write_text(json.dumps({**json.loads(file.read_text()), "auto_map": {key: "custom.Custom"}}))
    scores = reward_model(["p"], ["c"], path=path, device="cpu")
    assert not marker.exists()
    assert scores == pytest.approx([float(_direct(model, tokenizer, "pc")[0])], abs=1e-5)


def test_auto_device_takes_the_gpu_only_with_room(rm, monkeypatch):
    model = rm_module.load_reward_model(rm[0], "cpu")[0]
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (4 * size, 100 * size))
    assert rm_module._pick_device("auto", model)[0] == "cuda"
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (2 * size, 100 * size))
    assert rm_module._pick_device("auto", model)[0] == "cpu"
    assert rm_module._pick_device("cuda:1", model) == ("cuda:1", "as configured")
