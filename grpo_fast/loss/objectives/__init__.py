"""The objectives that ship with grpo_fast, one module per method, each shaped like a plug-in: an `Objective` (its
definition with the source it follows, its options, what it needs from the rollout) and, where the method has a
natural reduction, its loss-type row. grpo_fast.loss.objective.OBJECTIVES and grpo_fast.loss.loss_types.LOSS_TYPES
name them as built-ins, imported on first use; docs/config.md lists them."""
