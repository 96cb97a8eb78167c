"""``model.format`` when the user does not set it: ``chat`` for a tokenizer with a chat template.

A chat model trained on the plain ``react`` prompt (no tool list, no template markup) trains on a
prompt it was never tuned for and says nothing. So a config that leaves ``model.format`` unset (in
the preset, the YAML file and every ``--set``) takes ``chat`` when the model's tokenizer has a chat
template, and ``react`` otherwise; the embedded tiny models always take ``react`` (the format
they were pretrained on, although their tokenizer carries a template), by name or by folder. A value the user sets is
kept as it is. The template is found from the files alone (``chat_template.jinja``,
``chat_template.json`` or a ``chat_template`` key in ``tokenizer_config.json``) in the model
folder or the Hugging Face cache; a Hub model not in the cache has those two files fetched (the
run fetches the whole model right after).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracerl.config.checks import EMBEDDED_MODELS, hub_offline, looks_local
from tracerl.config.loading import ConfigError

TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def _folder_has_template(folder: Path) -> bool:
    if any((folder / name).is_file() for name in TEMPLATE_FILES):
        return True
    return _config_has_template(folder / "tokenizer_config.json")


def _config_has_template(path: Path | str | None) -> bool:
    if not path or not Path(path).is_file():
        return False
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False  # the model source check names a broken tokenizer_config.json
    return isinstance(data, dict) and bool(data.get("chat_template"))


def _hub_has_template(repo_id: str) -> bool | None:
    """From the Hugging Face cache (None: not cached and offline), else from two small downloads."""
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = {name: try_to_load_from_cache(repo_id, name) for name in ("tokenizer_config.json", *TEMPLATE_FILES)}
    except ValueError:  # not a repo id: check_model_source names it
        return None
    if any(isinstance(cached[name], str) for name in TEMPLATE_FILES):
        return True
    if isinstance(cached["tokenizer_config.json"], str):
        return _config_has_template(cached["tokenizer_config.json"])
    if hub_offline():
        return None  # check_model_source refuses the model in one line
    return _download_has_template(repo_id)


def _download_has_template(repo_id: str) -> bool:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        try:
            hf_hub_download(repo_id, "chat_template.jinja")
            return True
        except EntryNotFoundError:
            return _config_has_template(hf_hub_download(repo_id, "tokenizer_config.json"))
    except EntryNotFoundError:
        return False
    except Exception as err:  # noqa: BLE001 - network and auth errors have many types
        raise ConfigError(f"model.name_or_path = {repo_id!r}: could not read its tokenizer's chat template from the "
                          f"Hub ({type(err).__name__}); set model.format (chat or react) or fix the model name") from None


def has_chat_template(name_or_path: str) -> bool | None:
    """Whether the tokenizer of ``name_or_path`` has a chat template; None when that cannot be
    told here (no such folder, or a Hub model not cached while ``HF_HUB_OFFLINE`` is set)."""
    if name_or_path in EMBEDDED_MODELS:
        return True  # their tokenizer carries the ChatML template; they still default to react
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        return _folder_has_template(folder)
    if folder.exists() or looks_local(name_or_path):
        return None
    return _hub_has_template(name_or_path)


def tiny_folder(name_or_path: str) -> bool:
    """An embedded tiny model given by its folder (shipped or pretrained: it holds ``tiny_config.json``)."""
    return (Path(name_or_path).expanduser() / "tiny_config.json").is_file()


def default_format(name_or_path: str) -> str:
    """The format of a config that does not set ``model.format`` (module docstring)."""
    if name_or_path in EMBEDDED_MODELS or tiny_folder(name_or_path):
        return "react"
    return "chat" if has_chat_template(name_or_path) else "react"


def sets_format(*layers: dict[str, Any]) -> bool:
    """Whether any config layer (preset, overlay, YAML, ``--set``) gives ``model.format``."""
    return any(isinstance(layer.get("model"), dict) and "format" in layer["model"] for layer in layers)


def format_reason(fmt: str, name_or_path: str) -> str:
    """Why a run uses ``fmt``, in a few words for the console header."""
    if name_or_path in EMBEDDED_MODELS or tiny_folder(name_or_path):
        return "the embedded tiny models' format" if fmt == "react" else "set by model.format"
    template = has_chat_template(name_or_path)
    if fmt == "chat" and template:
        return "the tokenizer has a chat template"
    if fmt == "react" and template is False:
        return "the tokenizer has no chat template"
    return "set by model.format"
