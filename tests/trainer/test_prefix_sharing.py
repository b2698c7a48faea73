"""The shared-prompt forward equals the unshared one: the same completion hidden states and the same gradient of
`grpo_loss` w.r.t. every parameter, for groups with prompts of different lengths and completions from 1 token to
the batch's width, in any row order; the probe accepts the tiny models and names gradient checkpointing and a
cache cut from the autograd graph; wrong positions or a detached cache are caught (the test's power)."""

from __future__ import annotations

import pytest
import torch
from accumulation_batch import loss_gradients
from transformers.cache_utils import DynamicLayer

from grpo_fast.core.policy import SequenceBatch, build_sequence_batch, completion_hidden
from grpo_fast.core.tiny_models import TinyModelSpec, build_char_tokenizer, build_tiny_model, random_causal_lm
from grpo_fast.loss import GRPOLossConfig
from grpo_fast.trainer.prefix_sharing import (
    distinct_prompts,
    prefix_sharing_error,
    shared_completion_hidden,
    worth_sharing,
)

G = 3
PROMPT_LENS = (4, 9, 1)
COMPLETION_LENS = (1, 7, 3, 7, 2, 5, 4, 1, 6)  # group-major; 7 is the batch's width
PAD = 0


def _qwen2():
    return build_tiny_model(build_char_tokenizer(), seed=0)


def _llama():
    spec = TinyModelSpec(
        family="llama", hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128
    )
    return random_causal_lm(52, spec, seed=0)


MODELS = {"qwen2": _qwen2, "llama": _llama}


def _batch(vocab: int, order: str = "grouped") -> SequenceBatch:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]
    completions = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in COMPLETION_LENS]
    rows = list(range(len(completions)))
    if order == "interleaved":  # rows of a group not adjacent
        rows = rows[::2] + rows[1::2]
    return build_sequence_batch([prompts[i // G] for i in rows], [completions[i] for i in rows], PAD)


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    model = MODELS[request.param]()
    assert model.config.attention_dropout == 0.0
    return model.train()  # dropout 0: train mode is deterministic, and the trainer's mode


def _vocab(model) -> int:
    return model.get_input_embeddings().weight.shape[0]


@pytest.mark.parametrize("order", ["grouped", "interleaved"])
def test_hidden_states_equal_the_unshared_forward(model, order):
    batch = _batch(_vocab(model), order)
    with torch.no_grad():
        shared = shared_completion_hidden(model, batch)
        unshared = completion_hidden(model, batch)
    assert shared.shape == unshared.shape == (*batch.completion_ids.shape, model.config.hidden_size)
    mask = batch.completion_mask
    torch.testing.assert_close(shared[mask], unshared[mask], rtol=0, atol=1e-5)


def test_completions_of_one_token_use_the_prompt_pass_alone(model):
    batch = _batch(_vocab(model))
    one = SequenceBatch(
        batch.input_ids[:, : batch.prompt_width + 1],
        batch.attention_mask[:, : batch.prompt_width + 1],
        batch.position_ids[:, : batch.prompt_width + 1],
        batch.completion_ids[:, :1],
        batch.completion_mask[:, :1],
        batch.prompt_width,
    )
    with torch.no_grad():
        torch.testing.assert_close(
            shared_completion_hidden(model, one), completion_hidden(model, one), atol=1e-5, rtol=0
        )


def _loss_grads(model, batch, forward) -> tuple[float, dict[str, torch.Tensor]]:
    advantages = torch.linspace(-1.0, 1.5, batch.completion_ids.shape[0])
    config = GRPOLossConfig(loss_type="dapo", backend="torch")
    return loss_gradients(
        model, batch, forward, advantages, num_items_in_batch=int(batch.completion_mask.sum()), config=config
    )


@pytest.mark.parametrize("order", ["grouped", "interleaved"])
def test_loss_gradients_equal_the_unshared_ones(model, order):
    batch = _batch(_vocab(model), order)
    loss, shared = _loss_grads(model, batch, shared_completion_hidden)
    ref_loss, unshared = _loss_grads(model, batch, completion_hidden)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert shared.keys() == unshared.keys() == {n for n, _ in model.named_parameters()}
    for name, grad in unshared.items():
        scale = grad.abs().max()
        assert scale > 0, name
        assert (shared[name] - grad).abs().max() <= 1e-5 * scale, name


def test_probe_accepts_the_tiny_models(model):
    assert prefix_sharing_error(model) is None
    assert model.training  # mode restored


def test_probe_accepts_half_precision():
    assert prefix_sharing_error(_qwen2().to(torch.bfloat16)) is None


def test_probe_names_gradient_checkpointing():
    model = _qwen2()
    model.gradient_checkpointing_enable()
    assert "gradient checkpointing" in prefix_sharing_error(model)


def test_detached_cache_is_caught_by_the_probe_and_the_gradient_check(monkeypatch):
    """Power check: a cache cut from the graph keeps the forward exact but loses the prompt's gradient."""
    model = _qwen2().train()
    original = DynamicLayer.batch_select_indices

    def detached(self, indices):
        original(self, indices)
        self.keys, self.values = self.keys.detach(), self.values.detach()

    monkeypatch.setattr(DynamicLayer, "batch_select_indices", detached)
    assert "gradient differ" in prefix_sharing_error(model)
    batch = _batch(_vocab(model))
    _, shared = _loss_grads(model, batch, shared_completion_hidden)
    _, unshared = _loss_grads(model, batch, completion_hidden)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (shared[q] - unshared[q]).abs().max() > 1e-3 * unshared[q].abs().max()


def test_wrong_positions_break_equality():
    """Power check: completion positions off by one (as if the prompt's padding were counted) are seen."""
    model = _qwen2().eval()
    batch = _batch(_vocab(model))
    shifted = SequenceBatch(
        batch.input_ids,
        batch.attention_mask,
        batch.position_ids + (torch.arange(batch.input_ids.shape[1]) >= batch.prompt_width),
        batch.completion_ids,
        batch.completion_mask,
        batch.prompt_width,
    )
    mask = batch.completion_mask
    with torch.no_grad():
        diff = (shared_completion_hidden(model, shifted) - completion_hidden(model, batch))[mask].abs().max()
    assert diff > 1e-3


def test_distinct_prompts_compare_real_tokens_and_padding():
    # [PAD, 5] as a 2-token prompt is not the 1-token prompt [5]; padding ids differ but do not count.
    batch = build_sequence_batch([[PAD, 5], [5], [PAD, 5], [7, 5], [5]], [[1]] * 5, PAD)
    batch.input_ids[1, 0] = 9  # a padding id under attention_mask 0
    first, index = distinct_prompts(batch)
    assert index[[0, 2]].tolist() == [index[0]] * 2 and index[1] == index[4]
    assert len(set(index.tolist())) == 3
    assert first[index].tolist() == [0, 1, 0, 3, 1]


def test_worth_sharing_counts_the_saved_prompt_tokens():
    assert worth_sharing([64] * 8, [64] * 8, 8)  # 44% of the tokens saved
    assert not worth_sharing([4] * 8, [256] * 8, 8)  # 1.4%
    assert not worth_sharing([1024] * 8, [64] * 8, 1)  # nothing shared
    with pytest.raises(ValueError):
        worth_sharing([64], [64, 64], 2)
