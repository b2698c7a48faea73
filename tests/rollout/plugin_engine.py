"""A registered plug-in engine for the rollout matrix: transformers generation behind an engine class of its own,
with an options section of its own, that records which process built it (so a test sees that the async engine
process built the plug-in, not a built-in)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from grpo_fast.config_fields import ConfigSection, option
from grpo_fast.rollout import ROLLOUT_ENGINES
from grpo_fast.rollout.hf_engine import HFEngine


@dataclasses.dataclass
class MatrixPluginOptions(ConfigSection):
    key = "rollout.plugins.matrix_plugin"
    record_dir: str = option("", "a directory where each process that builds the engine leaves a file named by its pid")


class MatrixPluginEngine(HFEngine):
    name = "matrix_plugin"
    options = MatrixPluginOptions

    @classmethod
    def from_config(cls, config, *, options, model, tokenizer, export_model):
        if options.record_dir:
            (Path(options.record_dir) / str(os.getpid())).write_text(type(model).__name__)
        return cls(model, tokenizer)


ROLLOUT_ENGINES.register("matrix_plugin", MatrixPluginEngine)
