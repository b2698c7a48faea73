"""The run's `Rollouts` (grpo_fast.rollout.generation) from its config and the trainer's arguments: one engine
call per prompt, multi-turn rollouts with tools and environments, or a custom rollout function; and the same kind
rebuilt in an engine process from its recipe (`rollouts_from_recipe`).

Tools and environment factories given as strings are registered names (TOOLS, ENVIRONMENTS) or
"package.module:attribute"; the trainer's `tools=`, `environment_factory=` and `rollout_func=` arguments take the
objects themselves, as TRL's GRPOTrainer does, and replace the config's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace

from grpo_fast.registry import Registry, callable_contract
from grpo_fast.rollout.chat_turns import ChatFormat, prepare_tool_template
from grpo_fast.rollout.contract import Capabilities
from grpo_fast.rollout.environments import Environments
from grpo_fast.rollout.generation import CustomRollouts, Rollouts, SingleTurn
from grpo_fast.rollout.multi_turn import MULTI_TURN, MultiTurn
from grpo_fast.rollout.prompts import PromptEncoder
from grpo_fast.rollout.tools import Tool

TOOLS = Registry("tool", {"multiply": "grpo_fast.rollout.builtin_tools:multiply"}, contract=callable_contract("tool"))
ENVIRONMENTS = Registry(
    "environment",
    {"python": "grpo_fast.rollout.python_tool:PythonEnvironment"},
    contract=callable_contract("environment"),
)


def build_rollouts(
    rollout,
    prompts: PromptEncoder,
    tokenizer,
    stop_ids: tuple[int, ...],
    *,
    tools: Sequence[Callable] | None = None,
    environment_factory: Callable | Mapping[str, Callable] | None = None,
    rollout_func: Callable | None = None,
    trainer=None,
) -> Rollouts:
    """The Rollouts of config section `rollout` (its tools, environment_factory, rollout_func, tool limits), with
    the trainer's own objects in place of the config's strings where given; `trainer` is what rollout_func gets."""
    funcs = list(tools) if tools is not None else [TOOLS.get(name) for name in rollout.tools]
    factory = environment_factory if environment_factory is not None else _factory(rollout.environment_factory)
    custom = rollout_func if rollout_func is not None else _custom(rollout.rollout_func)
    if custom is not None:
        if funcs or factory is not None:
            raise ValueError("rollout_func: a custom rollout function replaces the tool loop; pass tools or it")
        return CustomRollouts(lambda prompts_: custom(prompts_, trainer), tokenizer, stop_ids)
    if not funcs and factory is None:
        return SingleTurn(prompts)
    prompts.chat_template = prepare_tool_template(tokenizer)  # TRL's, for every prompt of a run with tools
    return MultiTurn(
        prompts,
        ChatFormat(tokenizer, chat_template=prompts.chat_template, template_kwargs=prompts.template_kwargs),
        [Tool.of(fn) for fn in funcs],
        None if factory is None else Environments.of(factory),
        max_iterations=rollout.max_tool_calling_iterations,
        max_completion_length=rollout.max_completion_length,
        max_model_len=rollout.max_model_len,
        timeout=rollout.tool_timeout_seconds,
        workers=rollout.tool_workers,
    )


def configured_capabilities(rollout) -> Capabilities:
    """The capabilities of the rollout kind config section `rollout` names (tools and factories by name or import
    path, which an engine process can import); the trainer's own objects are checked once built
    (`Rollouts.capabilities`)."""
    if rollout.rollout_func:
        return CustomRollouts.capabilities
    if rollout.tools or rollout.environment_factory:
        return MULTI_TURN
    return SingleTurn.capabilities


def rollouts_from_recipe(recipe: dict, tokenizer) -> Rollouts:
    """The rollout kind of `Rollouts.recipe()`, in an engine process: its tools and environment factories imported
    by name or path, its limits and prompt settings, with this process's tokenizer."""
    if recipe["kind"] == "single_turn":
        return SingleTurn(None)
    data = SimpleNamespace(
        system_prompt=recipe["system_prompt"],
        use_chat_template=recipe["use_chat_template"],
        chat_template_kwargs=recipe["chat_template_kwargs"],
    )
    prompts = PromptEncoder(tokenizer, data, max_tokens=recipe["max_prompt_tokens"])
    prepare_tool_template(tokenizer)  # the response schema TRL adds to the tokenizer, as the trainer's got it
    prompts.chat_template = recipe["chat_template"]  # the trainer's, whatever this process's tokenizer holds
    factory = _factory(recipe["environment_factory"])
    kind = MultiTurn(
        prompts,
        ChatFormat(tokenizer, chat_template=prompts.chat_template, template_kwargs=prompts.template_kwargs),
        [Tool.of(TOOLS.get(path)) for path in recipe["tools"]],
        None if factory is None else Environments.of(factory),
        max_iterations=recipe["max_iterations"],
        max_completion_length=recipe["max_completion_length"],
        max_model_len=recipe["max_model_len"],
        timeout=recipe["timeout"],
        workers=recipe["workers"],
    )
    if kind.rendering() != recipe["rendering"]:
        kind.close()
        raise RuntimeError(
            "rollout.mode async: the engine process's tokenizer renders prompts to other ids than the trainer's "
            f"(a probe conversation: {recipe['rendering']} in the trainer, {kind.rendering()} here); give both the "
            "same tokenizer (its saved class, as grpo_fast.data.tokenizer.load_tokenizer loads it) and chat template"
        )
    return kind


def _factory(spec: str | Mapping[str, str] | None):
    if spec is None:
        return None
    if isinstance(spec, Mapping):
        return {name: ENVIRONMENTS.get(s) for name, s in spec.items()}
    return ENVIRONMENTS.get(spec)


def _custom(spec: str | None):
    if spec is None:
        return None
    return Registry("rollout function", contract=callable_contract("rollout function")).get(spec)
