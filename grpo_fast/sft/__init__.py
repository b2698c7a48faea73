"""Supervised fine-tuning on the fused path (`grpo-fast sft`): TRL's dataset conventions tokenised to
(input_ids, loss mask) (data), packed or length-grouped batches under a token budget (batching, with
packing_check), the loss from the loss tokens' hidden rows through `fused_logprobs` (loss), the config tree
(config) and the run (trainer: `SFTTrainer`, `run_sft`)."""
