# A training script in the pattern of TRL 1.16's examples/scripts/grpo_agent.py (an agent that answers yes/no
# questions about gene interactions by querying a SQLite database through a tool), run by
# tests/rollout/test_trl_agent_script.py. Its tool (a read-only SQL query under its own signal.alarm timeout), its
# three reward functions, the dataset formatting, TrlParser and the GRPOTrainer call are the example's; the only
# change to the TRL script is the import of GRPOTrainer. The example downloads its two datasets from the Hub and
# names a Hub model; here both datasets are local JSON Lines files in the working directory and the model is a
# local directory (--model_name_or_path), since nothing is downloaded in the tests.
import re
import signal
import sqlite3
import textwrap
from contextlib import contextmanager

from datasets import load_dataset
from trl import GRPOConfig, ModelConfig, ScriptArguments, TrlParser

from grpo_fast.trainer import GRPOTrainer  # the one change: `from trl import GRPOTrainer` in TRL's script


def query_reward(completions, answer, **kwargs):
    """Rewards the query strategy: at most three queries, no LIMIT 1 or PRAGMA probes, WHERE clauses, and tool
    results that support the final answer."""
    rewards = []
    for completion, expected in zip(completions, answer, strict=False):
        reward, queries, results = 0.0, [], []
        for turn in completion:
            for call in turn.get("tool_calls") or []:
                queries.append(call["function"]["arguments"].get("sql_command", "").lower())
            if turn.get("role") == "tool" and turn.get("content"):
                results.append(turn["content"])
        if len(queries) > 3:
            reward -= 1.5
        with_where = 0
        for query in queries:
            if "limit 1" in query:
                reward -= 1.0
            if " where " in query:
                with_where += 1
            else:
                reward -= 0.5
        reward += min(with_where, 3) * 0.4
        hits, failed = [], False
        for result in results:
            if isinstance(result, dict) and "error" in result:
                failed = True
            elif isinstance(result, list):
                hits.extend(result)
        if failed:
            reward -= 2.0
        elif not queries:
            reward -= 1.5
        elif (hits and expected.lower() == "yes") or (not hits and expected.lower() == "no"):
            reward += 2.0
        else:
            reward -= 1.5
        rewards.append(reward)
    return rewards


def correctness_reward(completions, answer, **kwargs):
    """Rewards a final answer of *yes* or *no* (in stars) that is right; penalises a wrong or missing one."""
    rewards = []
    for completion, expected in zip(completions, answer, strict=False):
        match = re.search(r"\*(yes|no)\*", completion[-1]["content"].lower())
        if match is None:
            rewards.append(-0.5)
        else:
            rewards.append(0.6 if match.group(1) == expected.lower() else -1.0)
    return rewards


def structure_reward(completions, **kwargs):
    """Rewards a tool call followed by its response (more with other content besides)."""
    rewards = []
    for completion in completions:
        called = responded = other = False
        for turn in completion:
            if turn.get("role") == "assistant" and turn.get("tool_calls"):
                called = True
            elif turn.get("role") == "tool":
                responded = True
            elif (turn.get("content") or "").strip() not in ("", "<think>"):
                other = True
        if called and responded:
            rewards.append(0.1 if other else 0.05)
        else:
            rewards.append(-0.15 if called else 0.0)
    return rewards


class TimeoutError(Exception):
    """A query ran past its time."""


@contextmanager
def timeout(seconds):
    """Raises TimeoutError in the block after `seconds` (SIGALRM: the main thread only)."""

    def on_alarm(signum, frame):
        raise TimeoutError(f"Operation timed out after {seconds} seconds")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)


def query_biogrid(sql_command: str) -> list[tuple]:
    """
    Execute a read-only SQL command on the BioGRID database.

    BioGRID is a curated database of protein, genetic and chemical interactions.

    Args:
        sql_command: The SQL command to execute.

    Returns:
        A list of tuples containing the query results.
    """
    with timeout(5):
        conn = sqlite3.connect("file:biogrid.db?mode=ro", uri=True)
        cursor = conn.cursor()
        try:
            cursor.execute(sql_command)
            results = cursor.fetchall()
        finally:
            conn.close()
    return results


PREAMBLE = textwrap.dedent("""\
    You have access to the BioGRID SQLite database (table `interactions`).
    Genes appear in the columns `Aliases_Interactor_A` and `Aliases_Interactor_B`.
    Final answer must be enclosed in stars, e.g. *Yes* or *No*.
    """)


def format_example(example):
    return {"prompt": [{"role": "user", "content": f"{PREAMBLE}\nQuestion: {example['question']}"}]}


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()

    biogrid = load_dataset("json", data_files="biogrid.jsonl", split="train").to_pandas()
    biogrid.columns = [c.replace(" ", "_") for c in biogrid.columns]
    conn = sqlite3.connect("biogrid.db")
    try:
        biogrid.to_sql("interactions", conn, if_exists="replace", index=False)
    finally:
        conn.close()

    dataset = load_dataset("json", data_files="biogrid_qa.jsonl", split="train")
    dataset = dataset.filter(lambda example: example["question"].startswith("Does the gene "))
    dataset = dataset.map(format_example, remove_columns=["question"])

    training_args.chat_template_kwargs = {"enable_thinking": False}

    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        train_dataset=dataset,
        eval_dataset=None,
        tools=[query_biogrid],
        reward_funcs=[correctness_reward, structure_reward, query_reward],
        args=training_args,
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
