"""Atomic checkpoints: written into a temporary directory beside the target, then renamed.

A checkpoint directory `step-000010/` holds the HF model (safetensors, loadable with `from_pretrained`; for a
PEFT model its adapters, as PEFT's `save_pretrained` writes them), the tokenizer, `train_config.json` (the
run's config and LoRA settings, compared on resume) and `trainer_state.pt` (optimizer, scheduler, RNG states,
step, data position; the optimizer state only when one process wrote it), when several ranks wrote it `sharded/`
(their model and optimizer shards, grpo_fast.core.sharded_checkpoint), and, written last,
`checkpoint_files.json`: every other file's size.

Loading a checkpoint never runs code from it. Its files are checked against that manifest before any is read
(`verify_files`: a file added, removed or resized since it was written refuses it); `trainer_state.pt` holds
tensors and plain Python values only and is read with `torch.load(weights_only=True)`; the weights are
safetensors; anything else is refused with `UnsafeCheckpointError`, and nothing of the checkpoint is changed.

Also here: which config changes a resumed run may make (`compare_configs`), and what an earlier run left in
an output directory (`earlier_run_files`, `clear_earlier_run`; the run signature a run writes there when it
starts, `write_run_signature`, tells a run killed before its first checkpoint from another run,
`unsaved_progress_mismatch`).
"""

from __future__ import annotations

import enum
import errno
import json
import logging
import os
import pickle
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_fast.core.seeding import rng_state
from grpo_fast.distributed.context import Distributed

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d+)$")
_OLD_DIR = re.compile(r"^\.old-(.+)-\d+$")  # replace_dir's
_TMP_DIR = re.compile(r"^\.tmp-(.+)-(\d+)$")  # a writer's, <name>-<pid>
TRAINER_STATE = "trainer_state.pt"
RUN_CONFIG = "train_config.json"
MANIFEST = "checkpoint_files.json"  # written last: every other file's size, checked before a checkpoint is used


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint whose files differ from its manifest, or whose trainer state or sharded state holds more than
    tensors and plain Python values: refused before anything of it is used."""


# -- writing ------------------------------------------------------------------------------------------------


def save_checkpoint(
    root: str | Path,
    step: int,
    model,
    tokenizer,
    trainer_state: dict,
    keep: int | None = None,
    *,
    protect: Iterable[str | Path] = (),
    run_config: dict | None = None,
    write_weights: Callable[[Path], None] | None = None,
    dist: Distributed | None = None,
) -> Path:
    """Writes root/step-{step:06d} atomically; returns its path.

    trainer_state: tensors and plain Python values only (it must load with weights_only=True); the RNG
    states are added (`rng`: rank 0's, `rng_ranks`: every rank's, in rank order; `rank_rng_state` picks one).
    keep: prune to the newest `keep` checkpoints, never deleting a path in `protect`.
    run_config: JSON-able, written to train_config.json. write_weights(directory): writes the model's
    weights (default: `model.save_pretrained`).

    With several ranks (`dist`), every rank calls this: `write_weights` runs on every rank (a sharded
    checkpoint's collective writes), everything else on rank 0, and the checkpoint is published only when
    every rank's part succeeded; the directory must be on a file system all ranks share."""
    dist = dist or Distributed()
    root = Path(root)
    final = checkpoint_dir(root, step)
    tmp = root / f".tmp-step-{step:06d}-{dist.broadcast(os.getpid())}"
    if dist.is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
    failure = None
    rng = dist.all_gather(rng_state())  # each rank's: its draws (a reward's, its own sampling) are its own
    try:
        if dist.is_main:
            tmp.mkdir()
        dist.barrier()
        # With several ranks this is collective: DCP returns on rank 0 once every rank's shards are written.
        (write_weights or (lambda d: model.save_pretrained(d, safe_serialization=True)))(tmp)
        if dist.is_main:
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            torch.save({**trainer_state, "rng": rng[0], "rng_ranks": rng}, tmp / TRAINER_STATE)
            if run_config is not None:
                (tmp / RUN_CONFIG).write_text(json.dumps(run_config, indent=2, sort_keys=True) + "\n")
            (tmp / MANIFEST).write_text(json.dumps(_file_sizes(tmp), indent=1, sort_keys=True) + "\n")
            _fsync_tree(tmp)  # the renames below must never publish a directory whose files are not on disk
    except BaseException as exc:
        failure = exc
    failed = [rank for rank, ok in enumerate(dist.all_gather_ints(failure is None)) if not ok]
    if failed:
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # a failed write leaves nothing; earlier checkpoints untouched
        if failure is None:
            raise RuntimeError(f"checkpoint of step {step} not written: rank(s) {failed} failed writing it")
        if isinstance(failure, OSError) and failure.errno in (errno.ENOSPC, errno.EDQUOT):
            previous = latest_checkpoint(root)
            kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
            raise OSError(
                failure.errno,
                f"checkpoint of step {step} not written: no space left on the device of {root} ({failure}); "
                f"{kept}. Free disk space (run.keep_checkpoints keeps only the newest checkpoints) or move "
                "run.output_dir, then resume.",
            ) from failure
        raise failure
    if dist.is_main:
        _publish(tmp, final)
        if keep is not None:
            prune_checkpoints(root, keep, protect)
    dist.barrier()
    return final


def _publish(tmp: Path, final: Path) -> None:
    """Renames the written `tmp` to `final`, replacing an earlier checkpoint of the same step. An incomplete
    directory of that name (a copy cut short: no writer of ours publishes one) is not deleted but kept beside it as
    `<name>.incomplete-<pid>`."""
    if final.exists() and not is_complete(final):
        kept = final.with_name(f"{final.name}.incomplete-{os.getpid()}")
        os.replace(final, kept)
        logger.warning("%s was incomplete (files missing or cut short): kept as %s", final, kept.name)
    replace_dir(tmp, final)  # re-saving the same step replaces it (e.g. final save right after a periodic one)
    _fsync(final.parent)


def replace_dir(new: Path, target: Path) -> None:
    """Renames directory `new` to `target`, replacing it: the old one is moved aside to `.old-<name>-<pid>` first
    and deleted after. A crash between the two renames leaves no `target`: `recover_interrupted_writes` puts it back."""
    if target.exists():
        old = target.with_name(f".old-{target.name}-{os.getpid()}")
        os.replace(target, old)
        os.replace(new, target)
        shutil.rmtree(old)
    else:
        os.replace(new, target)


def prune_checkpoints(root: str | Path, keep: int, protect: Iterable[str | Path] = ()) -> list[Path]:
    """Deletes all but the newest `keep` checkpoints under `root`, except those in `protect`; returns the
    deleted paths."""
    if keep < 1:
        raise ValueError(f"keep_checkpoints: expected a positive count or None (keep all), got {keep!r}")
    kept = {Path(p).resolve() for p in protect}
    deleted = [p for p in list_checkpoints(root)[:-keep] if p.resolve() not in kept]
    for path in deleted:
        shutil.rmtree(path)
    return deleted


def _file_sizes(root: Path) -> dict[str, int]:
    return {
        str((Path(d) / name).relative_to(root)): (Path(d) / name).stat().st_size
        for d, _, files in os.walk(root)
        for name in files
        if name != MANIFEST
    }


def is_complete(path: str | Path) -> bool:
    """Whether checkpoint directory `path` holds everything its writer wrote: every file of its manifest, at
    least as long as written (a checkpoint written before manifests: its trainer_state.pt). A directory cut
    short (a copy killed half way, a file truncated) is not; a file changed otherwise is left to the loader
    (a trainer_state.pt that gained a pickle payload is refused there, loudly, not skipped)."""
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.exists():
        return (path / TRAINER_STATE).is_file()
    try:
        sizes = json.loads(manifest.read_text())
        return all((path / name).is_file() and (path / name).stat().st_size >= size for name, size in sizes.items())
    except (OSError, ValueError, AttributeError, TypeError, RecursionError):
        return False


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Flush every file under `root`, then the directories themselves (so their entries are durable)."""
    for directory, _, files in os.walk(root):
        for name in files:
            _fsync(Path(directory) / name)
        _fsync(Path(directory))


# -- finding ------------------------------------------------------------------------------------------------


def rank_rng_state(trainer_state: dict, rank: int, world_size: int) -> dict:
    """The RNG states a resumed rank continues from: its own where the checkpoint was written by as many ranks,
    else rank 0's (another world size, or a checkpoint written before every rank's were kept)."""
    ranks = trainer_state.get("rng_ranks")
    return ranks[rank] if ranks is not None and len(ranks) == world_size else trainer_state["rng"]


def checkpoint_dir(root: str | Path, step: int) -> Path:
    """Where the checkpoint of `step` is (or would be) under `root`."""
    return Path(root) / f"step-{step:06d}"


def list_checkpoints(root: str | Path) -> list[Path]:
    """The complete checkpoints under `root`, oldest first. Incomplete step directories are skipped with a
    warning (and never deleted); temporary directories of writers that died are removed."""
    root = Path(root)
    if not root.is_dir():
        return []
    recover_interrupted_writes(root, _STEP_DIR)
    found = []
    for p in root.iterdir():
        if p.is_dir() and (m := _STEP_DIR.match(p.name)):
            if is_complete(p):
                found.append((int(m.group(1)), p))
            else:
                logger.warning("skipping checkpoint %s: incomplete (files missing or cut short)", p)
    return [p for _, p in sorted(found)]


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process writes one checkpoint at a time: a leftover of its own is stale
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_interrupted_writes(root: Path, name: re.Pattern) -> None:
    """Undoes what writers that died left under `root` for the directories whose names match `name`: an
    `.old-<name>-<pid>` of `replace_dir` is put back where `<name>` is missing (the previous, complete one) and
    deleted where it exists (a leftover of the cleanup); a `.tmp-<name>-<pid>` being written when its writer died is
    deleted once no process of that pid runs."""
    for p in sorted(root.iterdir()):
        old, tmp = _OLD_DIR.match(p.name), _TMP_DIR.match(p.name)
        if old and name.fullmatch(old.group(1)) and p.is_dir():
            target = root / old.group(1)
            if target.exists():
                shutil.rmtree(p)
            else:
                os.replace(p, target)
        elif tmp and name.fullmatch(tmp.group(1)) and p.is_dir() and not _pid_alive(int(tmp.group(2))):
            shutil.rmtree(p, ignore_errors=True)


def incomplete_steps(root: str | Path) -> list[int]:
    """The steps under `root` whose step directory is incomplete (files missing or cut short), ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(p, _STEP_DIR.match(p.name)) for p in root.iterdir() if p.is_dir()]
    return sorted(int(m.group(1)) for p, m in found if m and not is_complete(p))


def saved_steps(root: str | Path) -> list[int]:
    """The steps that have a complete checkpoint under `root`, ascending."""
    return [int(_STEP_DIR.match(p.name).group(1)) for p in list_checkpoints(root)]


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


# -- reading ------------------------------------------------------------------------------------------------


def _legacy_numpy_globals() -> list:
    """What a numpy RNG-state array needs to unpickle: checkpoints written before the state was kept as a
    tensor. Only array reconstruction, no callable of any other kind."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_trainer_state(path: str | Path) -> dict:
    """trainer_state.pt of the checkpoint `path` (its files checked first, `verify_files`), read with
    weights_only=True (tensors and plain Python values; numpy arrays of older checkpoints). Raises
    UnsafeCheckpointError for anything else."""
    verify_files(path)
    file = Path(path) / TRAINER_STATE
    try:
        with torch.serialization.safe_globals(_legacy_numpy_globals()):
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"{file}: refused, it holds objects other than tensors and plain Python values ({refusal_reason(exc)}); "
            "a grpo_fast checkpoint never does, so it was not written by this trainer or was altered"
        ) from None


def refusal_reason(exc: pickle.UnpicklingError) -> str:
    """What torch's weights_only unpickler refused, in one line (without its advice on how to load it anyway)."""
    reason = next((line.strip() for line in str(exc).splitlines() if "WeightsUnpickler error" in line), str(exc))
    return reason.split(". Please")[0]


def verify_files(path: str | Path) -> None:
    """Checks checkpoint `path` against its manifest before any of its files is read: every file its writer
    listed is there with the size it was written with, and there is no other file (a `sharded/` directory or
    weights added later would otherwise be loaded). Raises UnsafeCheckpointError naming the differences,
    without changing anything. A checkpoint written before manifests has nothing to check."""
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.exists():
        return
    try:
        listed = json.loads(manifest.read_text())
        if not isinstance(listed, dict) or not all(isinstance(v, int) for v in listed.values()):
            raise ValueError("expected an object of file sizes")
    except (OSError, ValueError, RecursionError) as exc:
        raise UnsafeCheckpointError(f"{manifest}: unreadable ({str(exc)[:200]}); the checkpoint was altered") from None
    present = _file_sizes(path)
    problems = [f"{name}: missing" for name in sorted(listed.keys() - present.keys())]
    problems += [
        f"{name}: {present[name]} bytes, written with {listed[name]}"
        for name in sorted(listed.keys() & present.keys())
        if present[name] != listed[name]
    ]
    problems += [f"{name}: not written by the trainer" for name in sorted(present.keys() - listed.keys())]
    if problems:
        raise UnsafeCheckpointError(
            f"checkpoint {path}: refused, its files differ from the manifest its writer left ({MANIFEST}): "
            f"{'; '.join(problems[:10])}. It was altered after it was written; nothing was read from it. Remove what "
            "was added (or restore the checkpoint from a copy) to resume from it."
        )


def load_model_weights(model, path: str | Path) -> None:
    """Loads the checkpoint's safetensors into an existing model in place (same architecture); for a PEFT
    model, the adapter weights its `save_pretrained` wrote. The files are checked first (`verify_files`)."""
    verify_files(path)
    if hasattr(model, "peft_config"):
        _load_adapter_weights(model, Path(path))
        return
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    state = {}
    for f in files:
        state.update(load_file(f))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if "lm_head" in k and getattr(model.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"checkpoint {path}: missing {sorted(set(missing) - tied)}, unexpected {unexpected}")


def _load_adapter_weights(model, path: Path) -> None:
    """Each adapter's weights from where PEFT's save_pretrained puts them (the "default" adapter at the top,
    the others in a subdirectory of their name), under PEFT's key names; every key must match."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    for name in model.peft_config:
        file = (path if name == "default" else path / name) / "adapter_model.safetensors"
        if not file.exists():
            raise FileNotFoundError(f"checkpoint {path}: no weights of adapter {name!r} ({file} is missing)")
        state = load_file(file)
        expected = get_peft_model_state_dict(model, adapter_name=name)
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        if missing or unexpected:
            raise RuntimeError(f"checkpoint {path}, adapter {name!r}: missing {missing}, unexpected {unexpected}")
        set_peft_model_state_dict(model, state, adapter_name=name)


# -- the config a run resumes with -------------------------------------------------------------------------

# Options whose change makes the checkpoint another run's: the model, the loss, the batch shape, the adapters.
INCOMPATIBLE = (
    "model.path",
    "loss.loss_type",
    "run.prompts_per_step",
    "rollout.num_generations",
    "rollout.max_completion_length",
    "rollout.max_model_len",
    "lora",
)
# Options that change how long the run goes, what it logs, evaluates and keeps, or where memory lives.
HARMLESS = (
    "run.max_steps",
    "run.eval_every",
    "run.eval_max_prompts",
    "run.log_every",
    "run.save_every",
    "run.save_final",
    "run.save_best",
    "run.keep_checkpoints",
    "run.max_bad_steps",
    "run.output_dir",
    "run.report_to",
    "run.project",
    "run.run_name",
    "run.progress",
    "run.plots",
    "run.offload_optimizer",
    "run.offload_params",
    "rollout.vllm.gpu_memory_utilization",
    "rollout.vllm.kv_cache_memory_bytes",
    "rollout.vllm.sleep_level",
    "rollout.vllm.sync_bucket_mb",
    "rollout.vllm.tensor_parallel_size",
    "reward.workers",
    "reward.overlap_chunks",
    "data.eval_source",
    "data.eval_task_kwargs",
    "health",
    "check",
    "sample",
)
_IGNORED = ("run.resume", "run.overwrite")  # how this run starts, not what it is
# PEFT settings that only matter before training starts or name the files.
_PEFT_IGNORED = frozenset(
    {"base_model_name_or_path", "revision", "inference_mode", "peft_version", "auto_mapping", "runtime_config"}
    | {"init_lora_weights", "loftq_config", "eva_config", "corda_config", "lora_ga_config"}
)


@dataclass(frozen=True)
class ConfigChange:
    """One option (dotted key) whose value differs between the checkpoint and the resumed run."""

    key: str
    saved: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key}: saved {self.saved!r}, now {self.new!r}"


@dataclass
class ConfigDiff:
    """A resumed run's config against its checkpoint's: changes refused, harmless ones, and the others
    (allowed, but they change the training from here on)."""

    incompatible: list[ConfigChange] = field(default_factory=list)
    harmless: list[ConfigChange] = field(default_factory=list)
    other: list[ConfigChange] = field(default_factory=list)


def run_signature(config: dict, model) -> dict:
    """What train_config.json holds: the config tree and the model's adapter settings, as JSON values."""
    return _jsonable({"config": config, "lora": adapter_settings(model)})


def adapter_settings(model) -> dict | None:
    """{adapter name: its PEFT config} of a PEFT model (without what only matters before training starts);
    None for a plain model."""
    configs = getattr(model, "peft_config", None)
    if not configs:
        return None
    return {name: {k: v for k, v in cfg.to_dict().items() if k not in _PEFT_IGNORED} for name, cfg in configs.items()}


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((_jsonable(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):  # PeftType, TaskType
        return _jsonable(value.value)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return repr(value)


def saved_run_config(path: str | Path) -> dict | None:
    """The checkpoint's train_config.json; for a checkpoint written before it existed, the config kept in
    its trainer state (no LoRA settings); None when neither is there."""
    verify_files(path)
    file = Path(path) / RUN_CONFIG
    if file.exists():
        try:
            saved = json.loads(file.read_text())
        except (ValueError, RecursionError):
            saved = None
        if not (isinstance(saved, dict) and isinstance(saved.get("config"), dict)):
            raise UnsafeCheckpointError(f"{file}: refused, it is not the run signature a grpo_fast checkpoint holds")
        return saved
    config = load_trainer_state(path).get("config")
    return None if config is None else {"config": _jsonable(config)}


def compare_configs(
    saved: dict, new: dict, incompatible: tuple[str, ...] = INCOMPATIBLE, harmless: tuple[str, ...] = HARMLESS
) -> ConfigDiff:
    """Sorts the changes from the `saved` run signature to the `new` one (both as `run_signature` gives)
    into incompatible, harmless and other (by the dotted-key prefixes `incompatible` and `harmless`: a GRPO
    run's by default), each ordered by key. Options only one side knows (added or removed since) are not
    compared."""
    changes = list(_section_changes(saved["config"], new["config"]))
    if "lora" in saved:
        changes += _lora_changes(saved["lora"], new.get("lora"))
    diff = ConfigDiff()
    for change in sorted(changes, key=lambda c: c.key):
        if _matches(change.key, _IGNORED):
            continue
        if _matches(change.key, incompatible):
            diff.incompatible.append(change)
        elif _matches(change.key, harmless) and not _moves_the_schedule(change, new["config"]):
            diff.harmless.append(change)
        else:
            diff.other.append(change)
    return diff


def _section_changes(saved: dict, new: dict, prefix: str = ""):
    """The leaf options (nested sections flattened to dotted keys) whose values differ."""
    for name in sorted(saved.keys() & new.keys()):
        key, old_value, new_value = f"{prefix}{name}", saved[name], new[name]
        if isinstance(old_value, dict) and isinstance(new_value, dict):
            yield from _section_changes(old_value, new_value, f"{key}.")
        elif old_value != new_value:
            yield ConfigChange(key, old_value, new_value)


def _lora_changes(saved: dict | None, new: dict | None) -> list[ConfigChange]:
    if saved is None or new is None or saved.keys() != new.keys():
        return [] if saved == new else [ConfigChange("lora", saved, new)]
    return [ConfigChange(f"lora.{c.key}", c.saved, c.new) for c in _section_changes(saved, new)]


def _moves_the_schedule(change: ConfigChange, new: dict) -> bool:
    """A new max_steps stretches a linear or cosine learning-rate schedule: that changes the training."""
    return change.key == "run.max_steps" and new.get("optim", {}).get("lr_scheduler", "constant") != "constant"


def _matches(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def check_resume_config(path: str | Path, new: dict) -> ConfigDiff:
    """Compares the run signature `new` with checkpoint `path`'s: raises ValueError listing the incompatible
    changes with both values; logs the others. Returns the comparison."""
    saved = saved_run_config(path)
    if saved is None:
        logger.warning("checkpoint %s keeps no config: the resumed run's config cannot be checked against it", path)
        return ConfigDiff()
    return report_config_changes(compare_configs(saved, new), path, f"see {Path(path) / RUN_CONFIG}")


def report_config_changes(diff: ConfigDiff, path: str | Path, where_saved: str) -> ConfigDiff:
    """Raises ValueError listing `diff`'s incompatible changes with both values (`where_saved`: where the saved
    values can be read); logs the others. Returns `diff`."""
    if diff.incompatible:
        lines = "\n".join(f"  {c}" for c in diff.incompatible)
        raise ValueError(
            f"cannot resume from {path}: the config differs from the checkpoint's in options that make it another "
            f"run's (the model, the data, the loss or the batch shape):\n{lines}\nSet them back to the saved values "
            f"({where_saved}), or start a fresh run in another run.output_dir."
        )
    if diff.harmless:
        logger.info("resuming with changed options: %s", "; ".join(map(str, diff.harmless)))
    if diff.other:
        logger.warning(
            "resuming with changed options that change the training from here on: %s", "; ".join(map(str, diff.other))
        )
    return diff


# -- what an earlier run left in an output directory -----------------------------------------------------

_RUN_FILES = ("metrics.jsonl", "audit.jsonl", "audit.html", "report.md", "report.html", RUN_CONFIG)
_RUN_DIRS = ("checkpoints", "tensorboard", "plots", "best_model")
FINISHED_MARK = "report.md"  # written when a run ends (its last step done or a health alarm stopped it)


def earlier_run_files(output_dir: str | Path) -> list[str]:
    """What a run that started fresh in `output_dir` would overwrite: a non-empty metrics.jsonl and
    the checkpoints (names relative to output_dir)."""
    out = Path(output_dir)
    found = []
    metrics = out / "metrics.jsonl"
    if metrics.exists() and metrics.read_text().strip():
        found.append("metrics.jsonl")
    steps = saved_steps(out / "checkpoints")
    if steps:
        found.append(f"checkpoints/ (steps {', '.join(map(str, steps))})")
    if broken := incomplete_steps(out / "checkpoints"):
        found.append(f"checkpoints/ (incomplete: steps {', '.join(map(str, broken))})")
    return found


def write_run_signature(output_dir: str | Path, signature: dict) -> None:
    """Writes the run signature (`run_signature`) to output_dir/train_config.json, atomically: what a resume
    without a checkpoint compares itself with (`unsaved_progress_mismatch`)."""
    path = Path(output_dir) / RUN_CONFIG
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(signature, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def unsaved_progress_mismatch(output_dir: str | Path, signature: dict) -> str | None:
    """Why the run outputs in `output_dir` (no checkpoint among them) are not this run's unsaved progress; None
    when they are: its run signature (output_dir/train_config.json, written when it started) equals `signature`
    but for the options `compare_configs` calls harmless, and it did not finish. A run that started before run
    signatures were written there is another run."""
    out = Path(output_dir)
    if (out / FINISHED_MARK).exists():
        return f"it finished ({FINISHED_MARK} is there) without a checkpoint to resume from"
    if not (out / RUN_CONFIG).exists():
        return f"it has no {RUN_CONFIG}, so it cannot be told apart from another run"
    try:
        saved = json.loads((out / RUN_CONFIG).read_text())
        diff = compare_configs(saved, signature)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        return f"its {RUN_CONFIG} cannot be read ({type(exc).__name__}: {str(exc)[:200]})"
    changes = diff.incompatible + diff.other
    if changes:
        return "it is another run: " + "; ".join(map(str, changes))
    return None


def clear_earlier_run(output_dir: str | Path) -> None:
    """Deletes an earlier run's outputs in `output_dir`: checkpoints, metrics, audit trail, report, run signature,
    TensorBoard events and plots (other files stay)."""
    out = Path(output_dir)
    for name in _RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in _RUN_DIRS:
        if (out / name).is_dir():
            shutil.rmtree(out / name)
