"""Datasets for GRPO: built-in synthetic verifiable tasks and local / hub datasets via `datasets`."""

from grpo_fast.data.loading import load_prompt_dataset
from grpo_fast.data.tasks import (
    TASKS,
    code_functions_dataset,
    countdown_dataset,
    modular_arithmetic_dataset,
    products_dataset,
)

__all__ = [
    "TASKS",
    "code_functions_dataset",
    "countdown_dataset",
    "load_prompt_dataset",
    "modular_arithmetic_dataset",
    "products_dataset",
]
