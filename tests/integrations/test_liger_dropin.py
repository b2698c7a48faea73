"""grpo_fast.integrations.liger.LigerFusedLinearGRPOLoss against the real Liger-Kernel class (uncompiled on CPU:
plain PyTorch chunks): same signatures, and for the same call the same loss, metrics tuple and gradients of
_input, lin_weight and bias.

Tolerance: the shared rule (grpo_fast.testing.tolerance) against an fp64 oracle, Liger's own class on the same
call in fp64: both sides sum in fp32 with different chunking and orders, which CPUs round differently, so ours may
be off the oracle by twice what Liger's fp32 is, plus 1e-5 times the quantity's scale. The same call made two ways
through grpo_fast (positional or keyword arguments) gives the same bits.
"""

import dataclasses
import inspect

import pytest
import torch

from grpo_fast.integrations.liger import LigerFusedLinearGRPOLoss
from grpo_fast.loss import LOSS_TYPES, GRPOLossConfig
from grpo_fast.testing.synthetic import make_loss_batch
from grpo_fast.testing.tolerance import assert_within_rule

liger = pytest.importorskip("liger_kernel.chunked_loss")

B, T, H, V = 3, 7, 24, 53  # odd sizes
LIGER_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
TOKEN_LEVEL_ONLY = ("cispo", "sapo", "vespo")
SHARED = [name for name in LIGER_LOSS_TYPES if name in LOSS_TYPES]
CASES = [(name, "token") for name in SHARED] + [(name, "sequence") for name in SHARED if name not in TOKEN_LEVEL_ONLY]
TRAINABLE = ("_input", "lin_weight", "bias")


def options(loss_type="dapo", level="token", **overrides):
    base = dict(
        compiled=False,
        beta=0.04,
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=1.2 if loss_type == "cispo" else 0.28,
        temperature=0.9,
        importance_sampling_level=level,
        max_completion_length=9 if loss_type == "dr_grpo" else None,  # not T: the option must be used
    )
    return {**base, **overrides}


def call_args(seed=1, **overrides):
    """All forward arguments in Liger's order: the batch's tensors, a bias, old and ref logprobs."""
    batch = make_loss_batch(B, T, H, V, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    args = dict(
        _input=batch.hidden,
        lin_weight=batch.weight,
        selected_token_ids=batch.completion_ids,
        attention_mask=batch.completion_mask.float(),
        advantages=batch.advantages,
        bias=0.3 * torch.randn(V, generator=gen),
        ref_per_token_logps=batch.ref_logprobs,
        old_per_token_logps=batch.old_logprobs,
        ref_input=None,
        ref_weight=None,
        ref_bias=None,
        vllm_is_ratio=None,
        num_items_in_batch=None,
    )
    return {**args, **overrides}


def reference_model_args(args):
    """ref_input / ref_weight / ref_bias of a reference model near the policy, instead of its logprobs."""
    gen = torch.Generator().manual_seed(7)
    return dict(
        args,
        ref_per_token_logps=None,
        ref_input=args["_input"] + 0.1 * torch.randn(B, T, H, generator=gen),
        ref_weight=args["lin_weight"] + 0.05 * torch.randn(V, H, generator=gen),
        ref_bias=0.3 * torch.randn(V, generator=gen),
    )


def run(loss_fn, args, positional=False, grad_scale=1.0, trainable=TRAINABLE):
    """(loss, metrics, {name: grad}) of loss_fn on fresh leaves of `args`."""
    args = {k: v.detach().clone().requires_grad_() if k in trainable and v is not None else v for k, v in args.items()}
    loss, metrics = loss_fn(*args.values()) if positional else loss_fn(**args)
    (grad_scale * loss).backward()
    return loss.detach(), metrics, {k: args[k].grad for k in TRAINABLE if args[k] is not None}


def fp64(args):
    """`args` with every floating tensor in fp64 (the oracle's call)."""
    return {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in args.items()}


def assert_within_rule_of(ours, theirs, oracle):
    """The tolerance rule for each of ours (fp32) against Liger's (the peer, fp32) and the fp64 oracle: the loss, every
    metric, every gradient."""
    (loss_o, metrics_o, grads_o), (loss_l, metrics_l, grads_l), (loss_64, metrics_64, grads_64) = ours, theirs, oracle
    assert_within_rule("loss", loss_o, loss_l, loss_64, torch.float32)
    assert type(metrics_o) is type(metrics_l) and len(metrics_o) == len(metrics_l) == len(metrics_64)
    for i, (got, want, exact) in enumerate(zip(metrics_o, metrics_l, metrics_64, strict=True)):
        assert_within_rule(f"metric {i}", got, want, exact, torch.float32)
    assert grads_o.keys() == grads_l.keys()
    for name in grads_l:
        assert (grads_o[name] is None) == (grads_l[name] is None), name
        if grads_l[name] is not None:
            assert_within_rule(f"gradient {name}", grads_o[name], grads_l[name], grads_64[name], torch.float32)


def assert_identical(first, second):
    """Two calls of grpo_fast's class that must compute the same: the same bits."""
    (loss_a, metrics_a, grads_a), (loss_b, metrics_b, grads_b) = first, second
    assert torch.equal(loss_a, loss_b) and all(torch.equal(a, b) for a, b in zip(metrics_a, metrics_b, strict=True))
    assert grads_a.keys() == grads_b.keys() and all(torch.equal(grads_a[k], grads_b[k]) for k in grads_a)


def assert_matches_liger(opts, args, **run_options):
    """grpo_fast's class with `opts` against Liger's, on the same call."""
    theirs = liger.LigerFusedLinearGRPOLoss(**opts)
    assert_within_rule_of(
        run(LigerFusedLinearGRPOLoss(**opts), args, **run_options),
        run(theirs, args, **run_options),
        run(theirs, fp64(args), **run_options),
    )


def test_signatures_match_liger():
    def parameters(function):
        return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]

    ours_init = parameters(LigerFusedLinearGRPOLoss.__init__)
    assert ours_init[-1] == ("backend", inspect.Parameter.KEYWORD_ONLY, "auto")  # the one addition
    assert ours_init[:-1] == parameters(liger.LigerFusedLinearGRPOLoss.__init__)
    assert parameters(LigerFusedLinearGRPOLoss.forward) == parameters(liger.LigerFusedLinearGRPOLoss.forward)


REFERENCES = {
    "ref_logps": dict(use_ref_model=True),
    "ref_model_inputs": dict(use_ref_model=True),
    # beta > 0 without a reference model: the KL to the detached current policy (0); ref logps given are ignored
    "no_ref_model": dict(use_ref_model=False),
    "beta0": dict(use_ref_model=False, beta=0.0),
}
WITHOUT_KL = ("no_ref_model", "beta0")


def same_semantics(loss_type, level, reference):
    """Liger's luspo agrees with grpo_fast's (TRL's) only for one loss value per sequence (module docstring)."""
    return loss_type != "luspo" or (level == "sequence" and reference in WITHOUT_KL)


@pytest.mark.parametrize(
    "loss_type,level,reference",
    [(*case, reference) for case in CASES for reference in REFERENCES if same_semantics(*case, reference)],
)
def test_matches_liger(loss_type, level, reference):
    args = call_args()
    if reference == "ref_model_inputs":
        args = reference_model_args(args)
    assert_matches_liger(options(loss_type, level, **REFERENCES[reference]), args)


@pytest.mark.parametrize("shape", [(B, T), (B, 1), (B,)], ids=str)
@pytest.mark.parametrize("loss_type,level", [c for c in CASES if c[0] in ("dapo", "grpo", "cispo", "sapo")])
def test_vllm_is_ratio(loss_type, level, shape):
    ratio = (1 + 0.3 * torch.randn(shape, generator=torch.Generator().manual_seed(3))).clamp(0.5, 2.0)
    assert_matches_liger(options(loss_type, level), call_args(vllm_is_ratio=ratio))


@pytest.mark.parametrize("loss_type,level", [("dapo", "token"), ("grpo", "sequence")])
def test_on_policy_without_old_logps(loss_type, level):
    assert_matches_liger(options(loss_type, level), call_args(old_per_token_logps=None))


@pytest.mark.parametrize("count", [40, torch.tensor(40.0)], ids=["int", "tensor"])
@pytest.mark.parametrize("loss_type", ["dapo", "cispo"])
def test_num_items_in_batch(loss_type, count):
    assert_matches_liger(options(loss_type), call_args(num_items_in_batch=count))


@pytest.mark.parametrize("count", [None, 40])
@pytest.mark.parametrize("loss_type", ["dapo", "bnpo"])
def test_distributed_normaliser(monkeypatch, loss_type, count):
    """Under torch.distributed Liger divides dapo's count by the world size, all-reducing the token count
    when none is given (a fake world of 2 whose other rank has twice this rank's tokens)."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 2)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, *a, **k: tensor.mul_(3))
    assert_matches_liger(options(loss_type), call_args(num_items_in_batch=count))


CONFIG_FIELDS = {field.name for field in dataclasses.fields(GRPOLossConfig)}
OPTIONAL_OPTIONS = [
    ("dapo", "token", dict(use_bias_correction_kl=True)),
    ("grpo", "sequence", dict(use_bias_correction_kl=True)),
    ("sapo", "token", dict(sapo_temperature_pos=0.7, sapo_temperature_neg=1.3)),
    ("vespo", "token", dict(vespo_k_pos=1.5, vespo_lambda_pos=2.5, vespo_k_neg=2.5, vespo_lambda_neg=1.5)),
]


@pytest.mark.parametrize("loss_type,level,extra", [case for case in OPTIONAL_OPTIONS if case[0] in LOSS_TYPES])
def test_optional_options(loss_type, level, extra):
    """Passed on where GRPOLossConfig has them; a non-default value is refused where it has not."""
    if not set(extra) <= CONFIG_FIELDS:
        with pytest.raises(ValueError, match="not supported by grpo_fast"):
            LigerFusedLinearGRPOLoss(**options(loss_type, level, **extra))
        return
    assert_matches_liger(options(loss_type, level, **extra), call_args())


def test_positional_call():
    assert_matches_liger(options(), reference_model_args(call_args()), positional=True)
    loss_fn, args = LigerFusedLinearGRPOLoss(**options("grpo")), call_args(vllm_is_ratio=torch.full((B, 1), 0.8))
    assert_identical(run(loss_fn, args, positional=True), run(loss_fn, args))


def test_attributes_read_at_call():
    """Like Liger, the options are the module's attributes when it is called."""
    loss_fn = LigerFusedLinearGRPOLoss(**options(beta=0.0))
    loss_fn.beta, loss_fn.loss_type = 0.04, "bnpo"
    theirs = liger.LigerFusedLinearGRPOLoss(**options("bnpo"))
    args = call_args()
    assert_within_rule_of(run(loss_fn, args), run(theirs, args), run(theirs, fp64(args)))


def test_upstream_gradient_scales():
    assert_matches_liger(options("grpo"), call_args(), grad_scale=0.37)


def test_frozen_lm_head():
    """A lin_weight (and bias) without requires_grad gets no gradient, as in Liger (LoRA / PEFT)."""
    assert_matches_liger(options(), call_args(), trainable=("_input",))


def test_input_dtype_wins():
    """bf16 input, fp32 lm_head: both compute in the input's dtype; the weight's gradient stays fp32."""
    args = call_args()
    args["_input"] = args["_input"].bfloat16()
    ours, theirs = (run(cls(**options()), args) for cls in (LigerFusedLinearGRPOLoss, liger.LigerFusedLinearGRPOLoss))
    assert ours[2]["lin_weight"].dtype == theirs[2]["lin_weight"].dtype == torch.float32
    assert ours[2]["_input"].dtype == theirs[2]["_input"].dtype == torch.bfloat16
    # Liger rounds its logits to bf16, grpo_fast keeps them fp32: the rule of a bf16 computation, Liger the peer.
    loss_64, _, grads_64 = run(liger.LigerFusedLinearGRPOLoss(**options()), fp64(args))
    assert_within_rule("loss", ours[0].float(), theirs[0].float(), loss_64, torch.bfloat16)
    for name in TRAINABLE:
        assert_within_rule(name, ours[2][name].float(), theirs[2][name].float(), grads_64[name], torch.bfloat16)


def test_both_references_warns_and_uses_logps():
    args = dict(reference_model_args(call_args()), ref_per_token_logps=call_args()["ref_per_token_logps"])
    with pytest.warns(UserWarning, match="Using ref_per_token_logps"):
        both = run(LigerFusedLinearGRPOLoss(**options()), args)
    assert_identical(both, run(LigerFusedLinearGRPOLoss(**options()), call_args()))


UNSUPPORTED_LOSS_TYPES = [name for name in LIGER_LOSS_TYPES if name not in LOSS_TYPES] + ["not_a_loss_type"]


@pytest.mark.parametrize("loss_type", UNSUPPORTED_LOSS_TYPES)
def test_unsupported_loss_type_names_the_supported_ones(loss_type):
    with pytest.raises(ValueError, match=r"^loss_type: .*supported: \(") as err:
        LigerFusedLinearGRPOLoss(loss_type=loss_type)
    assert all(repr(name) in str(err.value) for name in LOSS_TYPES)


BAD_OPTIONS = {
    "sequence cispo": (dict(loss_type="cispo", importance_sampling_level="sequence"), "importance_sampling_level"),
    "dr_grpo without length": (dict(loss_type="dr_grpo"), "max_completion_length"),
    "sapo temperature 0": (dict(sapo_temperature_pos=0.0), "sapo_temperature_pos"),
    "negative sapo temperature": (dict(sapo_temperature_neg=-1.0), "sapo_temperature_neg"),
    "delta 0": (dict(delta=0.0), "delta"),
    "delta inside the clip range": (dict(delta=1.1), "delta"),
    "unknown level": (dict(importance_sampling_level="chunk"), "importance_sampling_level"),
    "epsilon_low 1": (dict(epsilon_low=1.0), "epsilon_low"),
    "negative beta": (dict(beta=-0.1), "beta"),
    "unknown backend": (dict(backend="tpu"), "backend"),
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_bad_options(case):
    opts, name = BAD_OPTIONS[case]
    with pytest.raises(ValueError, match=rf"^{name}:"):
        LigerFusedLinearGRPOLoss(**opts)


def bad_call(change, name, error=ValueError, ref_model=False):
    """A change to the arguments (of call_args, or with reference-model inputs), the error and the name it cites."""
    return change, name, error, ref_model


BAD_CALLS = {
    "no reference": bad_call(dict(ref_per_token_logps=None), "ref_per_token_logps"),
    "ref_input without ref_weight": bad_call(dict(ref_weight=None), "ref_weight", ref_model=True),
    "ref_weight wrong H": bad_call(dict(ref_weight=torch.randn(V, H + 1)), "ref_weight", ref_model=True),
    "ref_weight int": bad_call(dict(ref_weight=torch.zeros(V, H, dtype=torch.long)), "ref_weight", TypeError, True),
    "ref_bias wrong V": bad_call(dict(ref_bias=torch.randn(V + 1)), "ref_bias", ref_model=True),
    "vllm_is_ratio [B, 2]": bad_call(dict(vllm_is_ratio=torch.ones(B, 2)), "vllm_is_ratio"),
    "vllm_is_ratio [B + 1]": bad_call(dict(vllm_is_ratio=torch.ones(B + 1)), "vllm_is_ratio"),
    "attention_mask wrong shape": bad_call(dict(attention_mask=torch.ones(B, T + 1)), "attention_mask"),
    "token id >= V": bad_call(dict(selected_token_ids=torch.full((B, T), V)), "selected_token_ids"),
    "float token ids": bad_call(dict(selected_token_ids=torch.zeros(B, T)), "selected_token_ids", TypeError),
    "lin_weight wrong H": bad_call(dict(lin_weight=torch.randn(V, H + 1)), "lin_weight"),
    "_input 2-D": bad_call(dict(_input=torch.randn(B * T, H)), "_input"),
    "advantages wrong shape": bad_call(dict(advantages=torch.zeros(B + 1)), "advantages"),
    "advantages NaN": bad_call(dict(advantages=torch.tensor([float("nan"), 0.0, 0.0])), "advantages"),
    "old logps wrong shape": bad_call(dict(old_per_token_logps=torch.zeros(B, T - 1)), "old_per_token_logps"),
    "ref logps wrong shape": bad_call(dict(ref_per_token_logps=torch.zeros(B, T - 1)), "ref_per_token_logps"),
    "num_items_in_batch 0": bad_call(dict(num_items_in_batch=0), "num_items_in_batch"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_calls(case):
    change, name, error, ref_model = BAD_CALLS[case]
    args = reference_model_args(call_args()) if ref_model else call_args()
    with pytest.raises(error, match=rf"^{name}:"):
        LigerFusedLinearGRPOLoss(**options())(**{**args, **change})
