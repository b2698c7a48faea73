"""TRL 1.16's agent example (examples/scripts/grpo_agent.py's pattern, trl_agent_script.py) trains one step on
grpo_fast with only the import of GRPOTrainer changed, its tool calls succeeding.

What the script relies on, all of it TRL's and none of it spelled out in the script: `args=GRPOConfig(...)` parsed
by TrlParser, its `chat_template_kwargs` ({"enable_thinking": False}), the response template TRL adds to a Qwen3
tokenizer (add_response_schema), the prefix-preserving template it swaps in for Qwen3's (get_training_chat_template),
a tool that arms signal.alarm (the main thread only), `trainer.save_model`. The model is a tiny Qwen2 with a
byte-level BPE tokenizer trained here and Qwen3's chat template (TRL's copy), fine-tuned until it makes the
example's tool call and answers; it generates with transformers (TRL's `use_vllm: false`)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from scripted_chat import QWEN3_SPECIAL, build_bpe_chat_tokenizer, qwen3_template

from grpo_fast.core.tiny_models import TinyModelSpec, build_tiny_model

pytest.importorskip("trl")

SCRIPT = Path(__file__).with_name("trl_agent_script.py")
SPEC = TinyModelSpec(hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=64, max_position_embeddings=1024)
QUESTIONS = {  # question -> (its query, the answers the agent is taught)
    "Does the gene BRCA1 interact with TP53?": ("BRCA1", ["*Yes*"]),
    "Does the gene ZNF9 interact with TP53?": ("ZNF9", ["*Yes*", "*No*"]),  # a coin flip: the group's rewards differ
}
INTERACTIONS = [
    {"Aliases Interactor A": "BRCA1|RNF53", "Aliases Interactor B": "TP53|P53", "Taxid Interactor A": "taxid:9606"},
    {"Aliases Interactor A": "MDM2", "Aliases Interactor B": "TP53|P53", "Taxid Interactor A": "taxid:9606"},
]


def query_of(gene: str) -> str:
    return f"SELECT * FROM interactions WHERE Aliases_Interactor_A LIKE '%{gene}%'"


def conversations(script) -> list[tuple[list[dict], list[dict], list[dict]]]:
    """(prompt messages, the tool-call turn and its result, the answer turn) of every question and taught answer;
    the tool results are what the script's tool returns on the script's database (computed here, as it computes
    them)."""
    import sqlite3

    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE interactions (Aliases_Interactor_A, Aliases_Interactor_B, Taxid_Interactor_A)")
    db.executemany("INSERT INTO interactions VALUES (?, ?, ?)", [tuple(r.values()) for r in INTERACTIONS])
    out = []
    for question, (gene, answers) in QUESTIONS.items():
        prompt = script.format_example({"question": question})["prompt"]
        arguments = {"sql_command": query_of(gene)}
        call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "query_biogrid", "arguments": arguments}}]}  # fmt: skip
        result = {
            "role": "tool",
            "name": "query_biogrid",
            "content": str(db.execute(arguments["sql_command"]).fetchall()),
        }
        out += [(prompt, [call, result], [{"role": "assistant", "content": answer}]) for answer in answers]
    return out


def render(tok, messages, template, *, generation_prompt=False, tools=None) -> list[int]:
    out = tok.apply_chat_template(
        messages, tools=tools, chat_template=template, add_generation_prompt=generation_prompt, enable_thinking=False
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def teach(model, tok, script, steps: int = 100) -> None:
    """Fine-tunes `model` on the conversations as the run renders them (TRL's training template, the tool's schema,
    enable_thinking off): cross-entropy on the assistant turns' tokens only."""
    from trl.chat_template_utils import get_training_chat_template

    template, tools = get_training_chat_template(tok), [script.query_biogrid]
    rows = []
    for prompt, (call, result), answer in conversations(script):
        full = render(tok, prompt + [call, result] + answer, template, tools=tools)
        starts = [len(render(tok, prompt, template, generation_prompt=True, tools=tools))]
        starts.append(len(render(tok, prompt + [call, result], template, generation_prompt=True, tools=tools)))
        ends = [i + 1 for i, t in enumerate(full) if t == tok.eos_token_id]
        mask = [any(s <= i < min(e for e in ends if e > s) for s in starts) for i in range(len(full))]
        rows.append((full, mask))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([i + [tok.pad_token_id] * (width - len(i)) for i, _ in rows])
    mask = torch.tensor([m + [False] * (width - len(m)) for _, m in rows])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(steps):
        logits = model(input_ids=ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits[mask[:, 1:]], ids[:, 1:][mask[:, 1:]])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05, loss.item()  # all but the coin flip (log 2 on one token in ~180) memorised


@pytest.fixture(scope="module")
def agent_dir(tmp_path_factory):
    """A tiny Qwen2 with a byte-level BPE tokenizer and Qwen3's chat template, taught the script's conversations."""
    spec = importlib.util.spec_from_file_location("trl_agent_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # its definitions only: the training runs under `if __name__ == "__main__"`
    draft = build_bpe_chat_tokenizer(["placeholder"], vocab_size=300, special=QWEN3_SPECIAL)
    draft.chat_template = qwen3_template()
    texts = [tok_text for c in conversations(script) for tok_text in [draft.apply_chat_template(
        c[0] + c[1] + c[2], tools=[script.query_biogrid], tokenize=False, enable_thinking=False)]]  # fmt: skip
    tok = build_bpe_chat_tokenizer(texts * 8, vocab_size=1200, special=QWEN3_SPECIAL)
    tok.chat_template = qwen3_template()
    model = build_tiny_model(tok, SPEC, seed=0)
    teach(model, tok, script)
    path = tmp_path_factory.mktemp("agent") / "model"
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def test_trls_agent_example_trains_with_only_its_import_changed(agent_dir, tmp_path):
    (tmp_path / "biogrid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in INTERACTIONS))
    questions = [*QUESTIONS, "Which genes interact with TP53?"]  # the script keeps the "Does the gene" ones
    answers = ["yes", "no", "BRCA1"]
    (tmp_path / "biogrid_qa.jsonl").write_text(
        "".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in zip(questions, answers, strict=True))
    )
    out = tmp_path / "run"
    command = [sys.executable, str(SCRIPT), "--model_name_or_path", str(agent_dir), "--output_dir", str(out)]
    command += ["--max_steps", "1", "--per_device_train_batch_size", "8", "--num_generations", "4"]
    command += ["--max_completion_length", "160", "--bf16", "false", "--report_to", "none", "--logging_steps", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1"}
    proc = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    (step,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert step["step"] == 1
    # Every rollout called the tool, and every call succeeded (its signal.alarm worked: the main thread).
    assert step["tools/rollouts_calling_frac"] == 1.0 and step["tools/failures_per_rollout"] == 0.0, step
    assert not any(k.startswith("tools/") and k.endswith("/failures") and v for k, v in step.items()), step
    for name in ("correctness_reward", "structure_reward", "query_reward"):
        assert f"reward/{name}/mean" in step
    assert step["reward/structure_reward/mean"] == pytest.approx(0.1)  # a call, its response and an answer: all
    # The step trained: the model trainer.save_model wrote differs from the one the run started from.
    before, after = load_file(agent_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
