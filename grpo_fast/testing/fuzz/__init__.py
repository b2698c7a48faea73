"""The loss's fuzz campaign: random cases over every argument of the public loss API (grpo_loss, GRPOLoss,
fused_logprobs, logits_grpo_loss, GRPOLossConfig) on every backend that runs here, each checked against the fp64
reference (grpo_fast.testing.reference) under the tolerance rule (grpo_fast.testing.tolerance); and invalid
inputs, each of which must be refused with an error naming the argument.

    cases.py         the parameters of case (backend, seed)
    inputs.py        its tensors; conditioning.py keeps them away from the loss's step functions
    run.py           the case through the public API (the backend under test)
    oracle.py        the same quantities from the reference (fp64 oracle, or the rule's peer)
    orderings.py     re-ordered cases (the peer's rounding redrawn)
    scales.py        the size of what each quantity is computed from (its conditioning)
    check.py         one case: every quantity against its bound
    invalid.py       invalid-input cases; mutations.py what makes each one invalid
    campaign.py      the campaign and its report; __main__.py its command line

A seeded generator rather than hypothesis: a case is named by (backend, seed) alone, so the report can give the
worst case of each backend and a one-line command that reruns it, and each backend gets a fixed share of the
cases (hypothesis would shrink failures, but picks its own examples and keeps no statistics of passing ones).
"""
