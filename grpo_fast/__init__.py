"""grpo_fast: kernel-accelerated GRPO / RLVR post-training."""
