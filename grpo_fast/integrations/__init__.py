"""Drop-in front ends of grpo_fast's kernels under other libraries' names and signatures.

grpo_fast.integrations.liger    LigerFusedLinearGRPOLoss (Liger-Kernel's chunked GRPO loss)
grpo_fast.integrations.trl      use_grpo_fast(trainer): TRL 1.16's fused LM head (and GRPO loss) -> grpo_fast
grpo_fast.integrations.hidden   hidden states and output head of a transformers causal LM, without the head
"""
