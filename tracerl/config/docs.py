"""Every config field with its default and meaning, read from the code so it cannot drift.

A field's meaning is the docstring written under it in its dataclass (the CleanRL idiom: the
field docstring is the help). Python keeps no such docstrings at run time, so they are read
from the class source with :mod:`ast`. A field without one may share the docstring of the
field right after it when that docstring names it (``clip_low`` / ``clip_high``), else it
needs an entry in :data:`EXTRA_DOCS`; ``tests/train/test_reference.py`` fails on a field
with neither. Used by ``tracerl config show --explain`` and the generated
``docs/reference.md``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

import yaml

from tracerl.config.schema import TrainConfig
from tracerl.config.loading import to_dict

EXTRA_DOCS: dict[str, str] = {
    "preset": "The method preset the run was built from (``tracerl train PRESET``).",
    "steps": "Training steps of the run (``--steps`` overrides it; a resume trains up to it).",
    "seed": "Seed of data order, sampling, initialisation and every random stream of the run.",
    "data.first_fact_seed": "Fact seed of the first SynthWiki training world (the others follow it).",
    **{f"data.world.num_{kind}": f"Entities of this kind in a SynthWiki world ({kind})."
       for kind in ("people", "cities", "countries", "books", "bands", "companies")},
    "data.world.min_hops": "Shortest question chain (lookups a question needs), 1..5.",
    "data.world.max_hops": "Longest question chain, 1..5.",
    "data.world.num_train": "Training-split questions per world.",
    "data.world.num_test": "Test-split questions per world (the held-out world's are evaluated).",
    "model.lora": "LoRA adapter settings (``model.lora.r > 0`` switches it on).",
    "rollout.scheme": "Rollout planner: ``chain`` (GRPO groups), ``dapo``, ``tree_random`` or ``trace``.",
    "rollout.engine": "Episode limits and sampling of the rollout engine (training and evaluation).",
    "rollout.schemes": "Options of the rollout planners (group size, tree shape, TRACE allocation).",
    "algo.estimator": "Advantage estimator: ``grpo``, ``rloo``, ``gigpo``, ``tree_grpo``, ``tree_anchor``, "
                      "``trace_credit`` or an import path.",
    "algo.advantage": "Options of the advantage estimators (TRACE credit's window, weights, value form).",
    "optim.lr": "Peak learning rate of AdamW.",
    "optim.weight_decay": "AdamW's decoupled weight decay.",
    "optim.betas": "AdamW's (beta1, beta2).",
    "optim.grad_clip": "Clip the gradient's global norm to this value before each optimiser step.",
    "optim.warmup_steps": "Linear warmup steps of the learning rate before ``optim.schedule`` applies.",
    "optim.loss_agg": "How per-token losses are averaged: ``token-mean``, ``seq-mean-token-mean``, ...",
    "eval": "Held-out evaluation during training.",
}
"""Meanings of fields that have no docstring in their dataclass (dotted config keys)."""


@dataclass(frozen=True)
class ConfigField:
    """One config key: ``key`` (dotted), its ``default`` (``TrainConfig()``'s), ``doc`` ('' if none)."""

    key: str
    default: Any
    doc: str
    section: bool = False


@functools.cache
def attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under it in ``cls``'s source (``{}`` when the source is unavailable)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:], strict=False):  # pairs of neighbours
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    names = [f.name for f in dataclasses.fields(cls)]
    for name, following in zip(names, names[1:], strict=False):  # one docstring for a pair (clip_low / clip_high)
        if name not in docs and following in docs and name in docs[following]:
            docs[name] = docs[following]
    return docs


def _nested(cls: type, name: str) -> type | None:
    hint = typing.get_type_hints(cls)[name]
    candidates = [hint, *typing.get_args(hint)]
    return next((c for c in candidates if dataclasses.is_dataclass(c)), None)


def config_fields(cls: type = TrainConfig, prefix: str = "", defaults: dict[str, Any] | None = None) -> list[ConfigField]:
    """Every field of ``cls`` and its nested sections, depth first in declaration order."""
    defaults = to_dict(TrainConfig()) if defaults is None else defaults
    docs, out = attribute_docs(cls), []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        nested = _nested(cls, f.name)
        doc = docs.get(f.name) or EXTRA_DOCS.get(key, "")
        if nested is not None:
            doc = doc or inspect.cleandoc(nested.__doc__ or "").split("\n\n")[0]
            out.append(ConfigField(key, None, doc, section=True))
            out += config_fields(nested, f"{key}.", defaults[f.name])
        else:
            out.append(ConfigField(key, defaults[f.name], doc))
    return out


def undocumented_fields() -> list[str]:
    """Dotted keys without a meaning (what the reference test fails on)."""
    return [f.key for f in config_fields() if not f.doc.strip()]


def yaml_value(value: Any) -> str:
    """A value as it reads in a YAML file, on one line (``null``, ``[0.9, 0.99]``, ``1.0e-05``)."""
    return yaml.safe_dump([value], default_flow_style=True, width=10**6).strip()[1:-1]


def _comment(text: str, indent: str) -> list[str]:
    flat = " ".join(text.split())
    return [f"{indent}# {line}" for line in textwrap.wrap(flat, width=max(40, 96 - len(indent)))]


def explained_yaml(config: TrainConfig) -> str:
    """``config`` as YAML with every field's meaning as comments above it and its default when changed.

    Still valid YAML: ``--config`` reads it back to the same config.
    """
    values, lines = to_dict(config), []
    for field in config_fields():
        parts = field.key.split(".")
        indent = "  " * (len(parts) - 1)
        if field.section:
            lines += _comment(field.doc, indent) + [f"{indent}{parts[-1]}:"]
            continue
        value: Any = values
        for part in parts:
            value = value[part]
        changed = "" if value == field.default else f" (default: {yaml_value(field.default)})"
        lines += _comment(field.doc + changed, indent) + [f"{indent}{parts[-1]}: {yaml_value(value)}"]
    return "\n".join(lines) + "\n"
