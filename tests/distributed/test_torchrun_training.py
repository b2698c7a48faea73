"""`torchrun --nproc-per-node 2 -m grpo_fast.cli train` on CPU (gloo, FSDP2, the transformers engine): the two
ranks together train exactly what one process trains on the same global batch and seeds, and checkpoints move
between world sizes (2 ranks -> 1 process, 1 process -> 2 ranks).

The runs use Adam with eps = 1 and no clipping, so an update is close to lr x gradient and a gradient that is
off by any factor (a rank's share normalised by its own tokens, FSDP's average left unscaled) moves the
weights visibly; with eps = 1e-8 Adam's update hardly depends on the gradient's scale. Tolerance: 1e-6 on the
weights (fp32 sums in another order; one step changes them by ~1e-2), 1e-5 relative on the logged loss and
gradient norm."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from grpo_fast.testing.configs import quiet_run_config

HERE = Path(__file__).parent
REWARDS = HERE.parent / "trainer"  # kill_points:char_code_reward, a deterministic reward
ATOL = 1e-6
PROBE = (str(HERE / "threads_after_main.py"),)  # `_train`'s program: the command line, then its gloo threads left


def _config(path: Path, model_dir: Path) -> Path:
    cfg = quiet_run_config(
        model_dir,
        # one prompt per generate call: its seed, so its samples, do not depend on how ranks split the step
        reward={"funcs": ["kill_points:char_code_reward"], "workers": 0, "overlap_chunks": 4},
        rollout={"engine": "hf", "num_generations": 4, "max_completion_length": 6},
        loss={"beta": 0.04},  # a sharded reference model too
        grpo={"num_iterations": 2},  # and the old-policy logprob pass
        optim={"lr": 0.1, "eps": 1.0, "max_grad_norm": 1e6},
        run={"max_steps": 3, "prompts_per_step": 4, "micro_batch_size": 4},
    )
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(config: Path, out: Path, ranks: int, *args: str, program: tuple[str, ...] = ("-m", "grpo_fast.cli")) -> str:
    """Trains `config` into `out` on `ranks` processes (torchrun for more than one); returns the standard output.
    `program`: what runs the command line in each process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REWARDS), os.environ.get("PYTHONPATH", "")])}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("WORLD_SIZE", None)
    launch = [sys.executable]
    if ranks > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    cmd = [*launch, *program, "train", "--config", str(config), "--skip-checks", "--set", f"run.output_dir={out}"]
    proc = subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def _assert_no_gloo_thread_left(out: str) -> None:
    """`out`: the standard output of a two-rank run of PROBE, one JSON line per rank."""
    reports = [json.loads(line) for line in out.splitlines() if line.startswith('{"rank"')]
    assert sorted(r["rank"] for r in reports) == [0, 1], out[-2000:]
    assert all(r["gloo_threads"] == [] for r in reports), reports


def _weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(out / "checkpoints" / f"step-{step:06d}" / "model.safetensors")


def _metrics(out: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def _assert_close_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=ATOL, msg=lambda m, n=name: f"{n}: {m}")


def _resume_step_two(config: Path, root: Path, run: str, ranks: int) -> Path:
    """Step 2's checkpoint of `run`, alone in a new output directory, resumed for step 3 on `ranks` processes."""
    resumed = root / f"{run}_then_{ranks}"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(root / run / "checkpoints" / "step-000002", resumed / "checkpoints" / "step-000002")
    _train(config, resumed, ranks, "--resume")
    return resumed


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_dir):
    """One process for 3 steps, and two ranks for the first 2 of them; a checkpoint after every step."""
    root = tmp_path_factory.mktemp("torchrun")
    config = _config(root / "config.yaml", tiny_dir)
    _train(config, root / "one", 1)
    (root / "two.stdout").write_text(_train(config, root / "two", 2, "--set", "run.max_steps=2"))
    return config, root


def test_two_ranks_train_what_one_process_trains(runs):
    _, root = runs
    one, two = _metrics(root / "one"), _metrics(root / "two")
    for step in (1, 2):
        _assert_close_weights(_weights(root / "two", step), _weights(root / "one", step))
        # the same completions (their lengths and rewards), the loss and gradient of the whole batch
        for key in ("completion/length_mean", "reward/mean", "train_tokens"):
            assert two[step][key] == pytest.approx(one[step][key], rel=1e-6), key
        for key in ("loss", "grad_norm"):
            assert two[step][key] == pytest.approx(one[step][key], rel=1e-5), key
    first, second = _weights(root / "one", 1), _weights(root / "one", 2)
    moved = max(float((second[k] - first[k]).abs().max()) for k in first)
    assert moved > 1e3 * ATOL  # the tolerance is far below what a step changes


def test_a_metric_a_reward_logs_on_some_ranks_only_is_their_mean(runs, tmp_path):
    """A reward's log_metric on rank 0 only ended both ranks ("the ranks logged different metrics this step"), where
    one process trains on."""
    config, _ = runs
    out = tmp_path / "logged"
    _train(config, out, 2, "--set", "run.max_steps=1", "--set", "reward.funcs=[kill_points:logged_on_rank_zero]")
    assert _metrics(out)[1]["reward_log/rank_zero"] == 1.0


def test_two_ranks_resume_each_with_its_own_random_state(runs, tmp_path):
    """Only rank 0's RNG states were saved and every rank resumed from them: a reward drawing from Python's RNG
    (other amounts on each rank) trained step 3 differently after a resume (3.6e-3 on the weights)."""
    config, _ = runs
    noisy = ("--set", "reward.funcs=[kill_points:noisy_char_code_reward]")
    _train(config, tmp_path / "straight", 2, *noisy)
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    step_two = Path("checkpoints") / "step-000002"
    shutil.copytree(tmp_path / "straight" / step_two, resumed / step_two)
    _train(config, resumed, 2, "--resume", *noisy)
    _assert_close_weights(_weights(resumed, 3), _weights(tmp_path / "straight", 3))


def test_one_rank_prints_the_result(runs):
    _, root = runs
    printed = (root / "two.stdout").read_text()
    assert printed.count('{"reward/mean"') == 1, printed[-2000:]


def test_two_rank_checkpoint_has_shards_and_resumes_in_one_process(runs):
    config, root = runs
    saved = root / "two" / "checkpoints" / "step-000002"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= {p.name for p in (saved / "sharded").iterdir()}
    resumed = _resume_step_two(config, root, "two", ranks=1)
    # weights and optimizer state came back: the third step is the uninterrupted run's third step
    _assert_close_weights(_weights(resumed, 3), _weights(root / "one", 3))


def test_one_process_checkpoint_resumes_on_two_ranks(runs):
    config, root = runs
    resumed = _resume_step_two(config, root, "one", ranks=2)
    _assert_close_weights(_weights(resumed, 3), _weights(root / "one", 3))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="lists the threads from Linux's /proc")
def test_no_gloo_thread_outlives_a_two_rank_run(runs, tmp_path):
    """When the command returns, every rank's gloo threads have ended. One left running (its group kept alive by
    the FSDP2 mesh that DTensor's caches hold) may still be releasing its last collective's tensors as the
    interpreter shuts down, and that kills the finished rank with SIGABRT ("terminate called without an active
    exception"), in a few percent of runs: the abort is a race, the threads it needs are not."""
    config, _ = runs
    _assert_no_gloo_thread_left(_train(config, tmp_path / "out", 2, "--set", "run.max_steps=1", program=PROBE))


def test_sharded_checkpoint_metadata_never_runs_code(tmp_path):
    """DCP pickles its metadata; a .metadata that builds anything but DCP's metadata classes is refused before
    it runs (here: a payload that would create a file)."""
    import pickle

    from grpo_fast.core.checkpoint import UnsafeCheckpointError
    from grpo_fast.core.sharded_checkpoint import load_sharded, save_sharded

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    save_sharded(tmp_path / "sharded", model, optimizer)
    load_sharded(tmp_path / "sharded", model, optimizer)  # the genuine metadata loads
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    (tmp_path / "sharded" / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(UnsafeCheckpointError, match="pathlib.Path.touch is not a DCP metadata class"):
        load_sharded(tmp_path / "sharded", model, optimizer)
    assert not marker.exists()


def test_a_step_that_does_not_split_over_the_ranks_is_refused():
    from grpo_fast.trainer.config import TrainConfig, check_distributed_config

    cfg = TrainConfig()
    cfg.run.prompts_per_step = 6
    check_distributed_config(cfg, 2)
    with pytest.raises(ValueError, match=r"run.prompts_per_step: 6 prompts do not split evenly over 4"):
        check_distributed_config(cfg, 4)


def test_each_rank_generates_with_its_own_vllm_engine(tmp_path, tiny_dir):
    """Two ranks, each with an in-process vLLM (external_launcher) fed by the streamed gather of the sharded
    weights: the run finishes and, at every step, the engines' sampling logprobs match the trainer's forward
    (fp32 engine: an engine left with the previous step's weights would be off by about the step's change).
    When the command returns no gloo thread is left on either rank, as without vLLM (see
    test_no_gloo_thread_outlives_a_two_rank_run): vLLM's engine destroys the launch's default group itself when it
    shuts down, and an exception vLLM keeps from its import held the frames of the stack that imported it."""
    pytest.importorskip("vllm")
    config = _config(tmp_path / "config.yaml", tiny_dir)
    settings = ["rollout.engine=vllm", "rollout.vllm.dtype=float32", "rollout.max_model_len=128", "run.max_steps=2"]
    out = _train(config, tmp_path / "out", 2, *(arg for s in settings for arg in ("--set", s)), program=PROBE)
    metrics = _metrics(tmp_path / "out")
    assert sorted(metrics) == [1, 2]
    for record in metrics.values():
        assert record["mismatch/abs_logprob_diff_mean"] < 1e-3
    _assert_no_gloo_thread_left(out)


def test_two_ranks_share_one_tensor_parallel_vllm_engine(tmp_path, tiny_dir):
    """rollout.vllm.tensor_parallel_size=2: one vLLM engine whose two shards live on the two ranks. Each rank's
    prompts are generated by the shared engine (its generate a collective of both: equally many calls, a
    rank with no prompts, as with the 3 held-out prompts split 2 / 1, joining empty-handed), its sampling
    logprobs match the trainer's forward after every sync, and the held-out evaluation covers every prompt."""
    pytest.importorskip("vllm")
    config = _config(tmp_path / "config.yaml", tiny_dir)
    settings = [
        "rollout.engine=vllm",
        "rollout.vllm.tensor_parallel_size=2",
        "rollout.vllm.dtype=float32",
        "rollout.max_model_len=128",
        "run.max_steps=2",
        "run.eval_every=1",
        "data.eval_source=task:modular_arithmetic",
        "data.eval_task_kwargs={n: 3, seed: 1}",
    ]
    _train(config, tmp_path / "out", 2, *(arg for s in settings for arg in ("--set", s)))
    metrics = _metrics(tmp_path / "out")
    assert sorted(metrics) == [0, 1, 2]
    for step in (1, 2):
        assert metrics[step]["mismatch/abs_logprob_diff_mean"] < 1e-3
        assert 0.0 <= metrics[step]["eval/accuracy"] <= 1.0


def test_a_refused_start_stops_every_rank_with_the_message(runs):
    """Rank 0 decides what the output directory holds; its refusal (an earlier run there, no --resume or
    --overwrite) reaches every rank, which all exit with the message (one line each) instead of waiting for rank 0."""
    config, root = runs
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REWARDS), os.environ.get("PYTHONPATH", "")])}
    env.update(OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "grpo_fast.cli"]
    cmd += ["train", "--config", str(config), "--skip-checks", "--set", f"run.output_dir={root / 'two'}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    # Each rank's message is Python's SystemExit print (the text and its newline are two writes), so the two ranks'
    # lines can interleave on the shared pipe: counted wherever they start, not at line starts (CI saw it once).
    refusals = re.findall(r"grpo-fast train: run.output_dir \S+ holds an earlier run", proc.stderr)
    assert len(refusals) == 2, proc.stderr[-3000:]


def test_two_rank_checkpoint_resumes_on_two_ranks(runs):
    config, root = runs
    resumed = _resume_step_two(config, root, "two", ranks=2)
    _assert_close_weights(_weights(resumed, 3), _weights(root / "one", 3))


def test_two_ranks_train_from_one_engine_process(tmp_path, tiny_dir):
    """rollout.mode async under torchrun: rank 0's engine process generates for both ranks, each trains its share
    of every step's groups, and the weights of every step reach the engine from the sharded model."""
    _, metrics = _two_ranks_with_stale_groups(tmp_path, tiny_dir, mode="async", async_engine={"threads": 1})
    assert all(m["sync/bytes"] > 0 for m in metrics.values())


def _two_ranks_with_stale_groups(
    tmp_path: Path, tiny_dir, grpo: dict | None = None, reward: str | None = None, **rollout
) -> tuple[Path, dict[int, dict]]:
    """Three steps on two ranks with `rollout` and `grpo` settings (rounds of 2 tokens): every step trains the whole
    step's groups, within the staleness bound, and some groups span weight versions. -> (config, metrics by step)."""
    cfg = yaml.safe_load(_config(tmp_path / "config.yaml", tiny_dir).read_text())
    cfg["rollout"] |= {"partial": {"segment_tokens": 2}, **rollout}
    cfg["grpo"] = grpo or {}
    if reward:
        cfg["reward"]["funcs"] = [reward]
    config = tmp_path / f"{rollout['mode']}.yaml"
    config.write_text(yaml.safe_dump(cfg))
    _train(config, tmp_path / "two", 2)
    metrics = _metrics(tmp_path / "two")
    assert sorted(metrics) == [1, 2, 3]
    for m in metrics.values():
        assert m["rollout/trained_samples"] == 4 * 4  # summed over the ranks: the whole step
        assert m["rollout/staleness_max"] <= 4
    assert max(m["rollout/staleness_max"] for m in metrics.values()) >= 1  # completions continued over steps
    return config, metrics


def test_two_ranks_share_one_partial_rollout_pool_and_resume_it(tmp_path, tiny_dir):
    """rollout.mode partial under torchrun: each round's requests are split over the ranks' engines and every rank
    keeps the same pool (checked every step: a difference stops the run), each rank trains its share of every
    step's groups, completions continue over steps, and a two-rank checkpoint brings the pool back: step 3
    resumed from step 2's checkpoint trains what the uninterrupted run's step 3 trained."""
    config, metrics = _two_ranks_with_stale_groups(tmp_path, tiny_dir, mode="partial")
    resumed = _resume_step_two(config, tmp_path, "two", ranks=2)
    _assert_close_weights(_weights(resumed, 3), _weights(tmp_path / "two", 3))
    again = _metrics(resumed)[3]
    for key in ("completion/length_mean", "reward/mean", "rollout/staleness_mean", "train_tokens"):
        assert again[key] == pytest.approx(metrics[3][key], rel=1e-6), key


@pytest.mark.parametrize("mode", ["partial", "async"])
def test_two_ranks_replace_zero_variance_groups(tmp_path, tiny_dir, mode):
    """grpo.dynamic_sampling on two ranks: each rank's groups whose rewards are all equal (even operands) make way
    for more from the shared pool (partial) or the engine process (async), split by what each rank misses, and
    every step still trains the whole step's groups."""
    engine = {"async_engine": {"threads": 1}} if mode == "async" else {}
    grpo = {"dynamic_sampling": True, "max_resample_rounds": 8}
    _, metrics = _two_ranks_with_stale_groups(
        tmp_path, tiny_dir, grpo=grpo, reward="scoring_verifiers:flat_on_even_operands", mode=mode, **engine
    )
    assert sum(m["resample_rounds"] for m in metrics.values()) >= 1
    assert sum(m["frac_zero_var_groups"] for m in metrics.values()) > 0


@pytest.mark.parametrize("command", ["sft", "sample", "pipeline"])
def test_a_one_process_command_under_torchrun_is_refused(monkeypatch, command):
    """Each rank ran the whole command into the same files (sft's metrics twice, sample's journal twice)."""
    from grpo_fast.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match=rf"^grpo-fast {command}: runs in one process, and this launch started 2"):
        main([command, "--config", "configs/r1_demo.yaml" if command == "pipeline" else "configs/sft_demo.yaml"])


def test_the_sft_control_baseline_is_refused_under_torchrun():
    """It trained a copy of the sharded policy and crashed on every rank (mixed torch.Tensor and DTensor)."""
    from grpo_fast.trainer.config import check_distributed_config, load_config

    cfg = load_config(None, ["check.sft_control_source=rows.jsonl", "run.prompts_per_step=4"])
    with pytest.raises(ValueError, match=r"^check.sft_control_source: .* leave it null under torchrun"):
        check_distributed_config(cfg, 2)
