"""`grpo-fast pipeline`: the DeepSeek-R1 recipe as chained stages (cold-start SFT -> reasoning RL ->
rejection sampling -> SFT -> RL with a reward model beside the verifiers)."""

from grpo_fast.pipeline.runner import PipelineConfig, load_pipeline_config, run_pipeline

__all__ = ["PipelineConfig", "load_pipeline_config", "run_pipeline"]
