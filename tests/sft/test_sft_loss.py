"""The fused SFT loss against transformers' own cross-entropy (`model(..., labels=...)`, which
materialises the logits): same loss, same gradients."""

from __future__ import annotations

import pytest
import torch
from sft_examples import random_examples

from grpo_fast.core.packing import pack
from grpo_fast.sft.batching import collate
from grpo_fast.sft.loss import sft_loss


def grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("tied", [False, True])
def test_fused_loss_and_gradients_equal_transformers_cross_entropy(tok, tied):
    from grpo_fast.core.tiny_models import TinyModelSpec, build_tiny_model

    model = build_tiny_model(tok, TinyModelSpec(tie_word_embeddings=tied), seed=1)
    examples = random_examples(12, model.config.vocab_size, seed=1)
    batch = collate(examples, [[i] for i in range(len(examples))], tok.pad_token_id)  # padded layout

    ours = sft_loss(model, batch, batch.num_loss_tokens)
    ours.backward()
    ours_grads = grads(model)
    labels = torch.where(batch.loss_mask, batch.input_ids, -100)
    theirs = model(input_ids=batch.input_ids, labels=labels).loss
    theirs.backward()
    theirs_grads = grads(model)

    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    assert ours_grads.keys() == theirs_grads.keys()
    for name, g in theirs_grads.items():
        torch.testing.assert_close(ours_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_packed_loss_equals_transformers_on_each_example_alone(model, tok):
    """Packing changes nothing: the packed step's loss is the token mean of the examples run alone."""
    examples = random_examples(10, model.config.vocab_size, seed=2)
    packed = collate(examples, pack([len(e) for e in examples], 40), tok.pad_token_id)
    ours = sft_loss(model, packed, packed.num_loss_tokens)
    nll, count = 0.0, 0
    for example in examples:
        ids = torch.from_numpy(example.input_ids)[None]
        labels = torch.where(torch.from_numpy(example.loss_mask)[None], ids, -100)
        n = int(example.loss_mask.sum())
        nll, count = nll + model(input_ids=ids, labels=labels).loss * n, count + n
    torch.testing.assert_close(ours, nll / count, rtol=0, atol=1e-5)
