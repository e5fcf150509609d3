"""The architecture overrides of a zoo model or a config.json: --layers ... --q-lora, and --set KEY=VALUE.

Every command that reads a model takes the same options; `architecture_options`
adds them to a command in place of its ``overrides`` parameter and hands the
command the dict of the ones given, so each command spells and documents
them alike and lists them once. The flags name the settings most sweeps
change; ``--set`` reaches every other field of the model's config
(``hyperplan zoo list`` names the families; an unknown key's error lists the
valid ones). Which keys exist is the zoo's to say: this module only parses.
"""

from __future__ import annotations

import functools
import inspect
import json
import typing
from typing import Annotated, Any, Callable, Optional

import typer

from planner.errors import InvalidInput

PANEL = "Architecture (zoo models and config.json files)"

#: (parameter, flag, the config field it sets, help): the named flags, in the order --help lists them.
FLAGS: tuple[tuple[str, str, str, str], ...] = (
    ("layers", "--layers", "layers", "Number of (LLM) layers."),
    ("hidden", "--hidden", "hidden", "Hidden size."),
    ("heads", "--heads", "heads", "Attention heads."),
    ("kv_heads", "--kv-heads", "kv_heads", "Key/value heads (GQA)."),
    ("head_dim", "--head-dim", "head_dim", "Channels per attention head."),
    ("vocab", "--vocab", "vocab", "Vocabulary size."),
    ("ffn", "--ffn", "ffn", "MLP width; per routed expert in Llama-style MoE models, of the dense layers in "
                            "DeepSeek-style ones."),
    ("experts", "--experts", "experts", "Routed experts (MoE)."),
    ("top_k", "--top-k", "top_k", "Experts per token (MoE)."),
    ("expert_ffn", "--expert-ffn", "expert_ffn", "Width of each routed expert (DeepSeek-style models)."),
    ("shared_experts", "--shared-experts", "shared_experts", "Always-on shared experts (DeepSeek, Llama 4)."),
    ("kv_lora", "--kv-lora", "kv_lora_rank", "Rank of the compressed key/value latent (MLA)."),
    ("q_lora", "--q-lora", "q_lora_rank", "Rank of the compressed query (MLA; 0: a plain q_proj)."),
)
SET_PARAM = "set_items"


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """`['rope_theta=1e6', 'mlp=relu2', 'deepstack=[8,16]']` -> {'rope_theta': 1000000.0, 'mlp': 'relu2', ...}.

    A value is read as JSON (numbers, true/false, lists, which become tuples), else kept as text; a key may be
    written with dashes. One sentence for a malformed item or a key given twice.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not raw.strip():
            raise InvalidInput(f"--set {item!r} is not KEY=VALUE; write it like --set rope_theta=1000000")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw.strip()
        value = tuple(value) if isinstance(value, list) else value
        if key in out and out[key] != value:
            raise InvalidInput(f"--set {key} is given twice ({out[key]!r} and {value!r}); keep one")
        out[key] = value
    return out


def collect(values: dict[str, Any], set_items: list[str] | None) -> dict[str, Any]:
    """The overrides given: the named flags that were set and --set's pairs, by config field."""
    out = {field: values[param] for param, _, field, _ in FLAGS if values.get(param) is not None}
    for key, value in parse_set(set_items).items():
        if key in out and out[key] != value:
            flag = next(f for _, f, field, _ in FLAGS if field == key)
            raise InvalidInput(f"{key} is set by {flag} {out[key]} and by --set {key}={value}; keep one")
        out[key] = value
    return dict(sorted(out.items()))


def _parameters() -> list[inspect.Parameter]:
    params = [
        inspect.Parameter(param, inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=Annotated[Optional[int], typer.Option(flag, help=text, rich_help_panel=PANEL)])
        for param, flag, _, text in FLAGS
    ]
    params.append(inspect.Parameter(
        SET_PARAM, inspect.Parameter.KEYWORD_ONLY, default=None,
        annotation=Annotated[Optional[list[str]], typer.Option(
            "--set", metavar="KEY=VALUE", rich_help_panel=PANEL,
            help="Set any field of the model's config (repeatable), e.g. --set rope_theta=1e6 --set mlp=relu2; an "
                 "unknown key's error lists the valid ones.")]))
    return params


def architecture_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command` with its ``overrides`` parameter replaced by the architecture options, which it receives as the
    dict of the overrides given (see `collect`)."""
    sig = inspect.signature(command)
    hints = typing.get_type_hints(command, include_extras=True)  # the command's annotations, evaluated
    extra = _parameters()
    params: list[inspect.Parameter] = []
    for p in sig.parameters.values():
        if p.name == "overrides":
            params += extra
        else:  # keyword-only, as the options after them are; typer passes every parameter by name
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation)))

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {p.name: kwargs.pop(p.name, None) for p in extra}
        set_items = values.pop(SET_PARAM)
        return command(*args, overrides=collect(values, set_items), **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper
