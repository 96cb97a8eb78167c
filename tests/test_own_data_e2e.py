"""The own-data path, run from docs/own-data.md as written: convert 100 MuSiQue questions,
build a small local BPE Qwen3, train 5 steps of ``trace`` with ``model.format=chat``, evaluate
with ``--run`` and render the run with ``tracerl view``.

The commands are read from the page's "End to end on MuSiQue with a small local model" block;
``tracerl ...`` runs through the real CLI (typer's runner) and ``python examples/...`` through the
script's ``main``, in a temporary folder (paths into the repository, such as the raw sample and
the example script, point at this checkout).
"""

from __future__ import annotations

import gzip
import html
import importlib.util
import json
import math
import re
import shlex
from pathlib import Path

import pytest
from transformers.utils import logging as hf_logging
from typer.testing import CliRunner

from tracerl.cli import app

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## End to end on MuSiQue with a small local model"


def readme_commands() -> list[list[str]]:
    """The bash block under :data:`HEADING`, one argument list per command (continuations joined)."""
    section = (ROOT / "docs" / "own-data.md").read_text(encoding="utf-8").split(f"\n{HEADING}\n", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert match is not None, f"no bash block under {HEADING!r}"
    text = match.group(1).replace("\\\n", " ")
    return [shlex.split(line) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _in_checkout(arg: str) -> str:
    """Repository paths (the raw sample, the example) made absolute; everything else as written."""
    key, eq, value = arg.rpartition("=") if "=" in arg else ("", "", arg)
    if value.startswith(("tests/", "examples/")):
        value = str(ROOT / value)
    return f"{key}{eq}{value}"


def run_command(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """Run one command of the page; returns (stdout, stderr)."""
    args = [_in_checkout(a) for a in args]
    if args[0] == "tracerl":
        result = CliRunner().invoke(app, args[1:])
        assert result.exit_code == 0, f"{shlex.join(args)}\n{result.output}\n{result.exception!r}"
        return result.stdout, result.stderr
    assert args[0] == "python" and args[1].endswith("make_tiny_bpe_qwen3.py"), args
    spec = importlib.util.spec_from_file_location("make_tiny_bpe_qwen3", args[1])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    bars = hf_logging.is_progress_bar_enabled()
    try:
        module.main(args[2:])
    finally:  # the script turns them off for its process, here the test session's: restore what it was
        (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
    captured = capsys.readouterr()
    return captured.out, captured.err


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _setting(args: list[str], key: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"{key}="))


def test_docs_end_to_end_on_musique_with_a_small_local_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    commands = readme_commands()
    assert [c[:2] if c[0] == "python" else c[:3] for c in commands] == [
        ["tracerl", "data", "convert"], ["python", "examples/make_tiny_bpe_qwen3.py"],
        ["tracerl", "train", "trace"], ["tracerl", "eval", "--run"], ["tracerl", "view", _option(commands[2], "--out")],
    ]
    convert, build, train, evaluate, view = commands
    monkeypatch.chdir(tmp_path)

    # 1. 100 questions (the sample holds exactly 100 answerable rows)
    out, _ = run_command(convert, capsys)
    data = Path(_option(convert, "--out"))
    raw_rows = (ROOT / _option(convert, "--input")).read_text(encoding="utf-8").splitlines()
    tasks = [json.loads(line) for line in (data / "tasks.jsonl").read_text(encoding="utf-8").splitlines()]
    assert _option(convert, "--limit") == "100" and len(raw_rows) == len(tasks) == 100
    assert out.startswith("100 tasks, ") and (data / "corpus.jsonl").is_file()

    # 2. the local BPE Qwen3 that model.name_or_path names
    out, _ = run_command(build, capsys)
    model_dir = Path(_option(build, "--out"))
    assert _setting(train, "model.name_or_path") == str(model_dir) and "parameters" in out
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["head_dim"] == 32

    # 3. five steps of trace with the chat template
    assert _setting(train, "model.format") == "chat" and _option(train, "--steps") == "5"
    run_command(train, capsys)
    run = Path(_option(train, "--out"))
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(m["loss"]) for m in metrics) and metrics[-1]["total_rollouts"] == 5 * 8
    with gzip.open(run / "rollouts" / "step-000001.jsonl.gz", "rt", encoding="utf-8") as handle:
        trees = [json.loads(line) for line in handle]
    by_id = {t["id"]: t for t in tasks}
    for tree in trees:  # the prompt the policy saw is the tokenizer's template, turn markup and all
        assert tree["prompt"].startswith("<|im_start|>system\n") and "<tools>" in tree["prompt"]
        assert f"<|im_start|>user\n{by_id[tree['task_id']]['question']}<|im_end|>\n" in tree["prompt"]
        assert tree["prompt"].endswith("<|im_start|>assistant\n")

    # 4. evaluation of the latest checkpoint on the held-out tenth
    out, _ = run_command(evaluate, capsys)
    result = json.loads(out)
    assert Path(result["checkpoint"]).name == "ckpt-000005" and Path(result["checkpoint"]).parent.name == run.name
    assert result["tasks"] == 4 and {"em", "f1", "mean_turns"} <= set(result)

    # 5. the viewer: an index linking each step's page; pages name the MuSiQue questions
    out, _ = run_command(view, capsys)
    index = Path(out.strip())
    assert index == Path(_option(view, "--out")) / "index.html" and index.is_file()
    pages = sorted(index.parent.glob("step-*.html"))
    assert [p.name for p in pages] == [f"step-{s:06d}.html" for s in range(1, 6)]
    assert all(p.name in index.read_text(encoding="utf-8") for p in pages)
    page = pages[0].read_text(encoding="utf-8")
    assert html.escape(by_id[trees[0]["task_id"]]["question"]) in page and "<summary>prompt</summary>" in page
