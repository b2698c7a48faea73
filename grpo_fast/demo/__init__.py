"""The embedded demo: tiny local model + cold-start SFT + GRPO with real rollouts, on CPU in minutes."""
