"""The embedded demo: tiny local model + cold-start SFT + GRPO with real rollouts, on CPU in minutes."""

from grpo_fast.demo.driver import DemoConfig, run_demo
from grpo_fast.demo.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model, save_tiny

__all__ = ["DemoConfig", "TinyModelSpec", "build_char_tokenizer", "build_tiny_model", "run_demo", "save_tiny"]
