"""The model of the run's best held-out evaluation, kept in one directory (`run.save_best`).

Whenever an evaluation's accuracy beats every earlier one of the run, the policy's weights and tokenizer are written
to output_dir/best_model in Hugging Face format, with best.json ({"step", "accuracy", "prompts"}): into a temporary
directory beside it first, then renamed over the previous one, so that the directory always holds one whole model
(never two, never half of one; a crash between the renames is undone when the run resumes). A resumed run reads
best.json and replaces the model only with a better one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grpo_fast.core import checkpoint as ckpt

logger = logging.getLogger(__name__)

BEST_DIR = "best_model"
BEST_INFO = "best.json"


@dataclass(frozen=True)
class BestEvaluation:
    step: int
    accuracy: float
    prompts: int


class BestModel:
    """Keeps output_dir/best_model: `offer` each evaluation; `best` is the best one so far (None before any)."""

    def __init__(self, output_dir: str | Path) -> None:
        self.directory = Path(output_dir) / BEST_DIR
        self.best: BestEvaluation | None = None

    def recover(self) -> None:
        """Puts back the previous model when a crash came between `offer`'s two renames and deletes a model a dead
        process was writing; rank 0, before `restore`."""
        if self.directory.parent.is_dir():
            ckpt.recover_interrupted_writes(self.directory.parent, re.compile(re.escape(BEST_DIR)))

    def restore(self) -> None:
        """The best evaluation an earlier part of this run kept (a resumed run), if any."""
        info = self.directory / BEST_INFO
        if info.is_file():
            self.best = BestEvaluation(**json.loads(info.read_text()))

    def offer(self, evaluation: BestEvaluation, write_model: Callable[[Path], None], is_main: bool) -> bool:
        """Writes the model (`write_model(directory)`, called on every rank: it may be collective) when `evaluation`
        beats the best so far; True when it did. Rank 0 (`is_main`) owns the directory."""
        if self.best is not None and evaluation.accuracy <= self.best.accuracy:
            return False
        tmp = self.directory.with_name(f".tmp-{BEST_DIR}-{os.getpid()}")
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        write_model(tmp)
        if is_main:
            (tmp / BEST_INFO).write_text(json.dumps(vars(evaluation)) + "\n")
            ckpt.replace_dir(tmp, self.directory)
        self.best = best = evaluation
        logger.info("best held-out accuracy, %.3f at step %d: model in %s", best.accuracy, best.step, self.directory)
        return True
