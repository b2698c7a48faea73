"""TRL's column conventions, tokenised: the loss tokens are exactly the completion / assistant tokens."""

from __future__ import annotations

import json
import logging

import pytest

from grpo_fast.sft.config import SFTDataConfig
from grpo_fast.sft.data import load_sft_rows, tokenize_rows


def loss_text(tok, example) -> str:
    return tok.decode(example.input_ids[example.loss_mask].tolist())


def test_prompt_completion_strings_train_the_completion_and_eos_and_ignore_other_columns(tok):
    rows = [{"prompt": "(3*7)%10=", "completion": "1", "rewards": [1.0], "row_index": 4}]
    (example,), stats = tokenize_rows(rows, tok, SFTDataConfig())
    prompt = tok("(3*7)%10=")["input_ids"]
    assert example.input_ids.tolist() == prompt + tok("1", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert example.loss_mask.tolist() == [False] * len(prompt) + [True, True]
    assert stats["format"] == "prompt_completion" and stats["loss_tokens"] == 2


def test_column_names_come_from_the_config(tok):
    rows = [{"question": "1+1=", "answer": "2", "prompt": "unused"}]
    (example,), _ = tokenize_rows(rows, tok, SFTDataConfig(prompt_column="question", completion_column="answer"))
    assert loss_text(tok, example) == "2</s>"


def test_string_prompts_are_encoded_like_the_grpo_run_encodes_them(chat_tok):
    """With a chat template ("auto"), a string prompt becomes a user turn plus the generation prompt."""
    (example,), _ = tokenize_rows([{"prompt": "hi", "completion": "yo"}], chat_tok, SFTDataConfig())
    assert chat_tok.decode(example.input_ids.tolist()) == "u:hi a:yo</s>"
    assert loss_text(chat_tok, example) == "yo</s>"
    cfg = SFTDataConfig(use_chat_template="false", system_prompt="be brief")
    (plain,), _ = tokenize_rows([{"prompt": "hi", "completion": "yo"}], chat_tok, cfg)
    assert chat_tok.decode(plain.input_ids.tolist()) == "hiyo</s>"


def test_chat_prompt_completion_trains_the_rendered_assistant_turn(chat_tok):
    row = {
        "prompt": [{"role": "user", "content": "hi"}],
        "completion": [{"role": "assistant", "content": "yo"}],
    }
    (example,), _ = tokenize_rows([row], chat_tok, SFTDataConfig(system_prompt="x"))
    assert chat_tok.decode(example.input_ids.tolist()) == "s:x u:hi a:yo</s> "
    assert loss_text(chat_tok, example) == "yo</s> "  # the end of turn is trained, no extra EOS
    row["prompt"] = "hi"  # a string prompt with a chat completion is a user turn, whatever use_chat_template says
    (example,), _ = tokenize_rows([row], chat_tok, SFTDataConfig(use_chat_template="false"))
    assert chat_tok.decode(example.input_ids.tolist()) == "u:hi a:yo</s> " and loss_text(chat_tok, example) == "yo</s> "


def test_messages_train_every_assistant_turn_and_nothing_else(chat_tok):
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "bb"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "dd"},
    ]
    (example,), stats = tokenize_rows([{"messages": messages, "id": 7}], chat_tok, SFTDataConfig())
    ids, mask = example.input_ids.tolist(), example.loss_mask.tolist()
    assert chat_tok.decode(ids) == "s:s u:a a:bb</s> u:c a:dd</s> "
    spans = "".join(chat_tok.decode([t]) if m else "|" for t, m in zip(ids, mask, strict=True))
    assert [s for s in spans.split("|") if s] == ["bb</s> ", "dd</s> "]
    assert stats["format"] == "messages"


def test_a_template_that_rewrites_earlier_turns_is_refused_with_the_row(chat_tok):
    chat_tok.chat_template = (
        "{% for m in messages %}{% if loop.last or m['role'] != 'assistant' %}{{ m['content'] }} {% endif %}"
        "{% endfor %}{% if add_generation_prompt %}a:{% endif %}"
    )
    turns = [{"role": r, "content": c} for r, c in (("user", "a"), ("assistant", "b"), ("user", "c"))]
    with pytest.raises(ValueError, match="row 0 .*prefix"):
        tokenize_rows([{"messages": [*turns, {"role": "assistant", "content": "d"}]}], chat_tok, SFTDataConfig())


def test_text_trains_every_token_but_the_first(tok):
    (example,), stats = tokenize_rows([{"text": "abc"}], tok, SFTDataConfig())
    assert example.loss_mask.tolist() == [False, True, True, True]
    assert loss_text(tok, example) == "bc</s>" and stats["format"] == "text"


def test_truncation_keeps_the_start_and_rows_without_loss_tokens_are_skipped(tok, caplog):
    rows = [
        {"prompt": "12345", "completion": "678"},  # truncated to 12345 67
        {"prompt": "1234567", "completion": "8"},  # nothing of the completion left
    ]
    with caplog.at_level(logging.WARNING):
        (example,), stats = tokenize_rows(rows, tok, SFTDataConfig(max_length=7))
    assert tok.decode(example.input_ids.tolist()) == "1234567" and loss_text(tok, example) == "67"
    assert stats["truncated"] == 2 and stats["skipped_no_loss"] == 1 and stats["examples"] == 1
    assert "skipped 1 of 2 rows" in caplog.text


def test_unknown_columns_and_bad_rows_are_reported(tok):
    with pytest.raises(ValueError, match="data.format: cannot tell .*'messages', or 'text'"):
        tokenize_rows([{"question": "q"}], tok, SFTDataConfig())
    with pytest.raises(ValueError, match=r"data.format: messages needs column\(s\) \['messages'\]"):
        tokenize_rows([{"text": "q"}], tok, SFTDataConfig(format="messages"))
    with pytest.raises(ValueError, match="row 1"):
        tokenize_rows([{"text": "a"}, {"txt": "b"}], tok, SFTDataConfig())


def test_rows_load_from_a_jsonl_file_a_list_or_a_dataset(tmp_path):
    import datasets

    rows = [{"prompt": "p", "completion": "c", "reward": 1.0}]
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_sft_rows(str(path)) == rows
    assert load_sft_rows(rows) is rows
    assert load_sft_rows(datasets.Dataset.from_list(rows)) == rows
    with pytest.raises(ValueError, match="data.source: required"):
        load_sft_rows("")
