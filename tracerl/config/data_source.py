"""Which data a run reads: ``data.source`` inferred from the user's data paths, or refused.

Without this, ``--set data.tasks=... --set data.corpus=...`` (no ``data.source=files``) trained
on SynthWiki, exited 0, and recorded the paths in ``config.yaml`` as if they were used. Plain
dict and string logic, used by :func:`~tracerl.config.schema.resolve_config` and ``DataConfig``.
"""

from __future__ import annotations

from typing import Any

DATA_PATHS = ("tasks", "corpus", "eval_tasks")
"""``data`` fields that only the ``files`` source reads."""


def infer_data_source(user: dict[str, Any]) -> dict[str, Any]:
    """``data.source = files`` where the user's own layers (YAML file, ``--set``) give data paths
    but no source, so ``--set data.tasks=...`` alone trains on that file instead of SynthWiki.

    ``user``: the merged YAML file and overrides (nested dicts); returned with the source added.
    An explicit ``data.source = synthwiki`` beside paths is left for the config to refuse.
    """
    data = user.get("data")
    if not isinstance(data, dict) or "source" in data or not any(data.get(k) for k in DATA_PATHS):
        return user
    return {**user, "data": {**data, "source": "files"}}


def synthwiki_ignores_paths(source: str, paths: dict[str, str]) -> str | None:
    """The one-line refusal when the ``synthwiki`` source would silently ignore data paths."""
    given = [f"data.{k}" for k, v in paths.items() if v]
    if source != "synthwiki" or not given:
        return None
    return (f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} set but data.source = 'synthwiki' "
            "ignores data files; use data.source=files (or drop the paths)")
