"""`grpo-fast sample`: K completions per prompt from the rollout engine, scored by the run's verifiers
through the reward pool, written as

- `pass_rates.jsonl`: one line per prompt, {"row_index", "pass_rate", "num_samples", "row"} (the input of
  `grpo-fast filter`);
- `sft.jsonl`: the rejection-sampled SFT set in TRL's prompt-completion convention, {"prompt",
  "completion", "reward", "rewards", "row_index"}: only verified-correct completions, chosen by
  grpo_fast.curate.rejection (chat prompts get a chat completion);
- `summary.json`.

Resumable: each chunk of `sample.chunk_prompts` prompts is committed to `records.jsonl` (see journal.py)
before the next starts, with seeds that depend only on the prompt's position, so a killed run started
again continues at the first unfinished chunk and writes what an uninterrupted run writes. Starting
again with different settings (the rows, and the weights of a local model, included) is refused, and so is an
output directory holding these files but no sampling run's settings (`overwrite=True` starts over).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from grpo_fast.config_fields import ConfigSection, option
from grpo_fast.core.policy import check_model_path, load_policy
from grpo_fast.curate.journal import append_chunk, dumps, read_complete_chunks, write_atomic
from grpo_fast.curate.pass_rates import PromptSamples, sample_prompts
from grpo_fast.curate.rejection import SelectionRules, select_completions
from grpo_fast.data.tokenizer import load_tokenizer
from grpo_fast.rewards.columns import TrainerState
from grpo_fast.rewards.reward_set import RewardSet
from grpo_fast.rollout.prompts import PromptEncoder, stop_token_ids, training_sampling
from grpo_fast.rollout.registry import ROLLOUT_ENGINES, create_engine, resolve_engine_name
from grpo_fast.rollout.rollouts import build_rollouts

logger = logging.getLogger(__name__)


@dataclass
class SampleConfig(ConfigSection):
    """`grpo-fast sample`: K completions of each prompt at the rollout section's sampling settings, committed a
    chunk at a time (a killed run resumes at the first unfinished chunk), and the rejection-sampled SFT set
    (grpo_fast.curate.rejection's rules)."""

    key = "sample"
    output_dir: str = option("runs/sample", "where pass_rates.jsonl, sft.jsonl and summary.json go")
    samples_per_prompt: int = option(8, "completions per prompt (K)", low=1)
    max_prompts: int | None = option(None, "sample the first this many rows (null: all)", low=1)
    chunk_prompts: int = option(64, "prompts generated and committed at a time", low=1)
    max_per_prompt: int = option(1, "correct completions kept per prompt in the SFT set (0: all)", low=0)
    prefer_shortest: bool = option(True, "keep the shortest correct completions first (else sampling order)")
    dedupe: bool = option(True, "drop duplicate completions (same text up to whitespace)")
    drop_truncated: bool = option(True, "drop completions cut at rollout.max_completion_length")
    language: str | None = option(None, "keep only reasoning in this language (e.g. en; null: any)")
    min_language_share: float = option(0.95, "with `language`: the least share of its script", low=0, high=1)


JOURNAL, SETTINGS = "records.jsonl", "sample_settings.json"
OUTPUTS = (JOURNAL, "pass_rates.jsonl", "sft.jsonl", "summary.json")  # what a sampling run writes, beside SETTINGS
# The rollout section's keys that change what is sampled: the sampling, the engine, the rollout kind.
_SAMPLING_KEYS = ("max_completion_length", "temperature", "top_p", "top_k", "stop", "max_model_len", "engine")
_SAMPLING_KEYS += ("tools", "environment_factory", "max_tool_calling_iterations", "rollout_func")


def selection_rules(sample_config) -> SelectionRules:
    try:
        return SelectionRules(**{f.name: getattr(sample_config, f.name) for f in dataclasses.fields(SelectionRules)})
    except ValueError as exc:
        raise ValueError(f"sample.{exc}") from None


def run_sampling(config, rows: list[dict], *, tokenizer=None, model=None, engine=None, overwrite: bool = False) -> dict:
    """Samples and scores config.sample.samples_per_prompt completions of each of `rows` (the first
    sample.max_prompts) into config.sample.output_dir; returns the summary. model / tokenizer / engine:
    reuse existing ones (loaded from model.path otherwise)."""

    s = config.sample
    rules = selection_rules(s)
    out = Path(s.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_settings(out, config, rows, overwrite)
    rows = rows[: s.max_prompts] if s.max_prompts else rows
    n_chunks = -(-len(rows) // s.chunk_prompts)
    chunk_size = lambda c: min(s.chunk_prompts, len(rows) - c * s.chunk_prompts)  # noqa: E731
    records = read_complete_chunks(out / JOURNAL, chunk_size)
    done = {r["chunk"] for r in records}
    if done:
        logger.info("sample: resuming, %d of %d chunks already done", len(done), n_chunks)

    todo = [c for c in range(n_chunks) if c not in done]
    rewards = RewardSet.from_config(config)
    if rows and not config.rollout.rollout_func:  # a rollout_func's own fields are columns too
        environments = config.rollout.environment_factory is not None
        rewards.check_columns(rows[0], f"data.source {config.data.source}", environments)
    owns_engine = False
    if todo:
        tokenizer, engine, owns_engine = _rollout(config, tokenizer, model, engine)
    t0 = time.perf_counter()
    try:
        if todo:
            encoder = PromptEncoder(tokenizer, config.data)
            stops = stop_token_ids(tokenizer, config.rollout.stop)
            rollouts = build_rollouts(config.rollout, encoder, tokenizer, stops)
            state = TrainerState(global_step=0, max_steps=0)
            for c in _progress(todo, config.run.progress):
                index = list(range(c * s.chunk_prompts, c * s.chunk_prompts + chunk_size(c)))
                k = s.samples_per_prompt
                # Request i of the whole run has seed base + i * k, however the run was interrupted.
                spec = training_sampling(config.rollout, stops, k, config.run.seed * 1_000_003 + index[0] * k)
                results = sample_prompts(engine, rollouts, rows, index, rewards, spec, state)
                chunk = [_record(c, rows[r.row], r, rules, rewards.names) for r in results]
                append_chunk(out / JOURNAL, chunk)
                records += chunk
    finally:
        rewards.close()
        if owns_engine:
            engine.close()
    summary = _write_outputs(out, sorted(records, key=lambda r: r["row_index"]))
    summary["seconds_sampling_this_run"] = time.perf_counter() - t0
    write_atomic(out / "summary.json", json.dumps(summary, indent=2))
    return summary


def _record(chunk: int, row: dict, result: PromptSamples, rules: SelectionRules, names: list[str]) -> dict:
    kept = []
    for j in select_completions(result, rules):
        completion = result.completions[j]
        kept.append(
            {
                "completion": completion.text,
                "num_tokens": len(completion.token_ids),
                "reward": float(result.rewards[j]),
                "rewards": dict(zip(names, result.per_func[j].tolist(), strict=True)),
            }
        )
    return {
        "chunk": chunk,
        "row_index": result.row,
        "pass_rate": result.pass_rate,
        "num_samples": len(result.completions),
        "num_correct": int(result.correct.sum()),
        "rewards": result.rewards.tolist(),
        "kept": kept,
        "row": row,
    }


def _write_outputs(out: Path, records: list[dict]) -> dict:
    pass_lines, sft_lines = [], []
    for r in records:
        pass_lines.append(dumps({k: r[k] for k in ("row_index", "pass_rate", "num_samples", "row")}))
        prompt = r["row"]["prompt"]
        for kept in r["kept"]:
            text = kept["completion"]
            completion = [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
            sft_lines.append(dumps({"prompt": prompt, "completion": completion, **kept, "row_index": r["row_index"]}))
    write_atomic(out / "pass_rates.jsonl", "".join(line + "\n" for line in pass_lines))
    write_atomic(out / "sft.jsonl", "".join(line + "\n" for line in sft_lines))
    rates = [r["pass_rate"] for r in records]
    n = max(len(rates), 1)
    return {
        "prompts": len(records),
        "samples": sum(r["num_samples"] for r in records),
        "correct_samples": sum(r["num_correct"] for r in records),
        "sft_rows": len(sft_lines),
        "pass_rate_mean": sum(rates) / n,
        "frac_always_fail": sum(p == 0 for p in rates) / n,
        "frac_always_pass": sum(p == 1 for p in rates) / n,
        "frac_sometimes": sum(0 < p < 1 for p in rates) / n,
        "pass_rates": str(out / "pass_rates.jsonl"),
        "sft_data": str(out / "sft.jsonl"),
    }


def _check_settings(out: Path, config, rows: list[dict], overwrite: bool) -> None:
    """Refuses to continue a journal written with other settings (its samples would not be comparable) and to
    write over another program's files; `overwrite` deletes what an earlier sampling run wrote instead."""
    c = config.to_dict()
    settings = {
        "model": c["model"]["path"],
        "weights": _weights_stamp(c["model"]["path"]),
        "data": c["data"],
        "num_rows": len(rows),
        "rows": hashlib.sha256(dumps(rows).encode()).hexdigest(),
        "reward": {k: c["reward"][k] for k in ("funcs", "weights", "failure_reward")},
        "rollout": {k: c["rollout"][k] for k in _SAMPLING_KEYS},
        "sample": {k: v for k, v in c["sample"].items() if k != "output_dir"},
        "seed": c["run"]["seed"],
    }
    settings["reward"]["funcs"] = [_spec_key(f) for f in settings["reward"]["funcs"]]
    settings = json.loads(dumps(settings))
    path = out / SETTINGS
    written = [name for name in OUTPUTS if (out / name).exists()]
    if overwrite:
        for name in written:
            (out / name).unlink()
    elif path.exists() and _has_records(out / JOURNAL):
        try:
            saved = json.loads(path.read_text())
        except ValueError:
            saved = None
        if not isinstance(saved, dict):
            raise ValueError(
                f"sample.output_dir {out}: its {SETTINGS} is not the settings a sampling run writes; use another "
                "output directory, or overwrite it (--overwrite)"
            )
        changed = sorted(k for k in settings.keys() | saved.keys() if settings.get(k) != saved.get(k))
        if changed:
            raise ValueError(
                f"sample.output_dir {out} holds a sampling run with other settings ({', '.join(changed)} differ): "
                "use another output directory, or overwrite it (--overwrite)"
            )
    elif written and not path.exists():
        raise ValueError(
            f"sample.output_dir {out} holds {', '.join(written)} that no sampling run of ours wrote there (no "
            f"{SETTINGS}): use another output directory, or overwrite them (--overwrite)"
        )
    write_atomic(path, json.dumps(settings, indent=2))


def _has_records(journal: Path) -> bool:
    """Whether the journal holds a sample (a run that stopped before its first one left nothing to continue)."""
    return journal.exists() and journal.stat().st_size > 0


def _weights_stamp(model_path: str | None) -> list | None:
    """(name, size, modification time) of a local model directory's weight and config files: weights rewritten
    at the same path change it. None for a hub name."""
    if not model_path or not Path(model_path).is_dir():
        return None
    files = [p for p in sorted(Path(model_path).iterdir()) if p.suffix in (".safetensors", ".bin", ".json")]
    return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.is_file()]


def _spec_key(spec):
    """A reward spec as it can be compared across processes (a callable by its import path)."""
    if callable(spec):
        inner = getattr(spec, "func", spec)
        return f"{getattr(inner, '__module__', '?')}:{getattr(inner, '__qualname__', type(inner).__name__)}"
    return spec


def _rollout(config, tokenizer, model, engine):
    """(tokenizer, engine, whether we built the engine): loads what was not given from model.path."""

    if not config.model.path and (tokenizer is None or (engine is None and model is None)):
        raise ValueError("model.path: required to load the model to sample from")
    if tokenizer is None or (engine is None and model is None):
        check_model_path(config.model.path)
    if tokenizer is None:
        tokenizer = load_tokenizer(config.model.path)
    if engine is not None:
        return tokenizer, engine, False
    engine_cls = ROLLOUT_ENGINES.get(resolve_engine_name(config.rollout.engine))
    if model is None and engine_cls.shares_trainer_model:
        model = load_policy(config.model)
    engine = create_engine(
        config.rollout.engine, config, model=model, tokenizer=tokenizer, export_model=lambda: config.model.path
    )
    return tokenizer, engine, True


def _progress(items: list[int], enabled: bool):
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc="sample (chunks)", dynamic_ncols=True)
