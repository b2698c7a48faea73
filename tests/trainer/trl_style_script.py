# A training script as TRL's examples and notebooks write them: the reward function defined in the script
# itself, no `if __name__ == "__main__":` guard. Run by tests/trainer/test_user_script.py with the output
# directory as its argument.
import sys

from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.trainer import GRPOTrainer, load_config


def reward_len(completions, **kwargs):
    """TRL's quickstart reward: completions close to 3 characters."""
    return [-abs(3 - len(completion)) for completion in completions]


tokenizer = build_char_tokenizer()
config = load_config(
    None,
    [
        f"run.output_dir={sys.argv[1]}",
        "run.max_steps=2",
        "run.prompts_per_step=2",
        "run.eval_every=0",
        "run.progress=false",
        "run.plots=false",
        "run.tensorboard=false",
        "rollout.engine=hf",
        "rollout.num_generations=2",
        "rollout.max_completion_length=3",
        "check.difficulty_prompts=0",
        "reward.workers=2",
    ],
)
trainer = GRPOTrainer(
    build_tiny_model(tokenizer),
    [reward_len, "exact_match"],  # the script's own function, and a built-in scored in the reward pool
    modular_arithmetic_dataset(8, seed=0),
    config=config,
    tokenizer=tokenizer,
)
trainer.train()
trainer.close()
