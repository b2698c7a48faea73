"""Does the model keep packed examples apart? A probe, not a list of attention implementations: two short
sequences through the backbone packed into one row (position_ids restarting at 0, no attention mask) and
each alone; packing is exact when the hidden states agree."""

from __future__ import annotations

import torch

from grpo_fast.trainer.policy import last_hidden

PROBE_LENGTHS = (7, 5)


@torch.no_grad()
def packing_error(model: torch.nn.Module) -> str | None:
    """None when packed rows give each example the hidden states it has alone (relative max difference
    within 1e-4 for fp32 weights, 2e-2 for half precision), else the reason. Runs in eval mode (no dropout;
    the mode is restored) and draws no random numbers."""
    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = [torch.arange(3 + 11 * k, 3 + 11 * k + n, device=device) % vocab for k, n in enumerate(PROBE_LENGTHS)]
    was_training = model.training
    model.eval()
    try:
        alone = [
            last_hidden(model, input_ids=x[None], position_ids=torch.arange(len(x), device=device)[None]) for x in ids
        ]
        positions = torch.cat([torch.arange(len(x), device=device) for x in ids])[None]
        packed = last_hidden(model, input_ids=torch.cat(ids)[None], position_ids=positions)
    except Exception as exc:  # noqa: BLE001 - any failure of the packed forward means: do not pack
        return f"the packed forward fails ({type(exc).__name__}: {exc})"
    finally:
        model.train(was_training)
    reference = torch.cat(alone, dim=1).float()
    diff = float((packed.float() - reference).abs().max() / reference.abs().max().clamp(min=1e-12))
    tolerance = 1e-4 if next(model.parameters()).dtype == torch.float32 else 2e-2
    if diff > tolerance:
        implementation = getattr(model.config, "_attn_implementation", None)
        return (
            f"packed examples see each other under attn_implementation={implementation!r} (relative hidden-state "
            f"difference {diff:.2e} > {tolerance:.0e})"
        )
    return None
