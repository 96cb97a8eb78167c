"""Hostile-inputs probe: run folders and inputs built by an attacker, run through the real CLI.

Each case builds a hostile run folder or input file under a work folder (symlinks out of a run
folder, YAML and gzip bombs, crafted records, huge lines, deeply nested JSON, import paths in a
run's config) and runs one ``tracerl`` command on it in a subprocess. A case passes when:

- the command ends in exactly one line on stderr, with no traceback (exit 1), or, for cases
  that must succeed (``expect_ok``), exits 0 and meets its own check;
- a sentinel file outside the folder keeps its content and mtime, and no file appears beside it;
- the subprocess's peak resident memory (``VmHWM`` of its own address space, read at exit; the
  ``ru_maxrss`` of ``os.wait4`` is reported too, but on Linux it inherits the parent's high-water
  mark at ``fork``) stays under ``--memory-mib`` (default 1536: torch and a tiny model are ~500);
- it ends within ``--timeout`` seconds.

Cases are tagged by who owns the fix (``runfolder``: run folders, files and config loading;
``view``: ``tracerl view``; ``guards``: tools), so a branch shows which of its own cases pass.

    python benchmarks/reliability/hostile_inputs.py                       # every case (~6 min on 2 busy cores)
    python benchmarks/reliability/hostile_inputs.py --only lock_link yaml_bomb_config
    python benchmarks/reliability/hostile_inputs.py --out benchmarks/results/hostile_inputs.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SECRET = "SECRET sentinel content outside every run folder\n"
RUN_ARGS = ["--set", "rollout.engine.max_turns=2", "--set", "eval.size=2"]
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))
DEEP = "[" * 100_000 + "]" * 100_000
TASK = '{{"id": "{i}", "question": "Who is {i}?", "answers": ["A{i}"]}}\n'
DOC = '{"id": "d", "title": "Ada", "text": "Ada is a writer."}\n'
_WRAPPER = """
import atexit, os, sys
def _peak():
    with open('/proc/self/status') as f:
        hwm = next(l for l in f if l.startswith('VmHWM'))
    with open(os.environ['PROBE_PEAK'], 'w') as out:
        out.write(hwm.split()[1])
atexit.register(_peak)
if sys.argv[1:2] == ['--script']:  # a case that drives the library directly (a tool call)
    import runpy
    runpy.run_path(sys.argv[2], run_name='__main__')
    sys.exit(0)
sys.argv = ['tracerl', *sys.argv[1:]]
from tracerl.cli import app
app()
"""


@dataclass
class Case:
    """One hostile input: ``build(work, run)`` prepares it and returns the CLI arguments."""

    name: str
    owner: str
    build: Callable[[Path, Path], list[str]]
    expect_ok: bool = False
    check: Callable[[Path, subprocess.CompletedProcess[str]], str | None] | None = None
    """Extra check after the command: None when it holds, else what went wrong."""
    needs_run: bool = True
    notes: list[str] = field(default_factory=list)


# --- builders ------------------------------------------------------------------------------


def _link(path: Path, target: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    path.symlink_to(target)


def lock_link(work: Path, run: Path) -> list[str]:
    _link(run / ".lock", work / "outside" / "sentinel.txt")
    return ["train", "--resume", str(run), "--steps", "2"]


def lock_link_fresh(work: Path, run: Path) -> list[str]:
    fresh = work / "fresh"
    fresh.mkdir()
    (fresh / ".lock").symlink_to(work / "outside" / "sentinel.txt")
    return ["train", "grpo", "--smoke-random", "--steps", "1", "--out", str(fresh), *RUN_ARGS]


def config_in_out(work: Path, run: Path) -> list[str]:
    exp = work / "outside"  # the user's own config is the sentinel: it must not change
    shutil.copy(exp / "sentinel.txt", exp / "config.yaml")
    (exp / "config.yaml").write_text("steps: 1\n")
    return ["train", "grpo", "--smoke-random", "--config", str(exp / "config.yaml"), "--out", str(exp)]


def metrics_dangling(work: Path, run: Path) -> list[str]:
    fresh = work / "fresh"
    fresh.mkdir()
    (fresh / "metrics.jsonl").symlink_to(work / "outside" / "created.jsonl")
    return ["train", "grpo", "--smoke-random", "--steps", "1", "--out", str(fresh), *RUN_ARGS]


def metrics_dev_zero(work: Path, run: Path) -> list[str]:
    _link(run / "metrics.jsonl", Path("/dev/zero"))
    return ["train", "--resume", str(run), "--steps", "2"]


def rollouts_link(work: Path, run: Path) -> list[str]:
    target = work / "outside" / "rollouts"
    target.mkdir()
    (target / "step-000009.jsonl.gz").write_bytes(b"theirs")
    _link(run / "rollouts", target)
    return ["train", "--resume", str(run), "--steps", "2"]


def trainer_pt_link(work: Path, run: Path) -> list[str]:
    _link(run / "ckpt-000001" / "trainer.pt", work / "outside" / "sentinel.txt")
    return ["eval", "--run", str(run), "--limit", "1", "--no-progress"]


def latest_link(work: Path, run: Path) -> list[str]:
    _link(run / "LATEST", work / "outside" / "sentinel.txt")
    return ["eval", "--run", str(run), "--limit", "1", "--no-progress"]


def yaml_bomb_config(work: Path, run: Path) -> list[str]:
    (work / "bomb.yaml").write_text(BOMB)
    return ["config", "show", "grpo", "--config", str(work / "bomb.yaml")]


def yaml_bomb_run(work: Path, run: Path) -> list[str]:
    (run / "ckpt-000001" / "config.yaml").write_text(BOMB)
    return ["train", "--resume", str(run), "--steps", "2"]


def import_path_run(work: Path, run: Path) -> list[str]:
    (work / "shipped_plugin.py").write_text(  # the archive's own module, in the folder the user works in
        f"open({str(work / 'outside' / 'imported.txt')!r}, 'w').write('ran')\n"
        "def verify(answer, task):\n    return 0.0\n")
    cfg = run / "ckpt-000001" / "config.yaml"
    cfg.write_text(cfg.read_text().replace("verifier: em", "verifier: shipped_plugin:verify"))
    return ["eval", "--run", str(run), "--limit", "1", "--no-progress"]


def _files(work: Path, tasks: str) -> list[str]:
    (work / "tasks.jsonl").write_text(tasks)
    (work / "corpus.jsonl").write_text(DOC)
    sets = ["data.source=files", f"data.tasks={work / 'tasks.jsonl'}", f"data.corpus={work / 'corpus.jsonl'}"]
    return [a for s in sets for a in ("--set", s)]


def big_question(work: Path, run: Path) -> list[str]:
    big = json.dumps({"id": "big", "question": "Who? " * 200_000, "answers": ["A"]})
    return ["train", "grpo", "--smoke-random", "--out", str(work / "new-run"),
            *_files(work, TASK.format(i=1) + TASK.format(i=2) + big + "\n")]


def huge_line(work: Path, run: Path) -> list[str]:
    with open(work / "tasks.jsonl", "w") as handle:
        handle.write(TASK.format(i=1) + '{"id": "2", "question": "')
        for _ in range(50):
            handle.write("x" * (1 << 20))
        handle.write('", "answers": ["A"]}\n')
    (work / "corpus.jsonl").write_text(DOC)
    return ["env-check", "--tasks", str(work / "tasks.jsonl"), "--corpus", str(work / "corpus.jsonl")]


def deep_json_env_check(work: Path, run: Path) -> list[str]:
    _files(work, TASK.format(i=1) + DEEP + "\n")
    return ["env-check", "--tasks", str(work / "tasks.jsonl"), "--corpus", str(work / "corpus.jsonl")]


def deep_json_train(work: Path, run: Path) -> list[str]:
    return ["train", "grpo", "--smoke-random", "--out", str(work / "new-run"), *_files(work, TASK.format(i=1) + DEEP + "\n")]


def deep_json_convert(work: Path, run: Path) -> list[str]:
    (work / "raw.json").write_text("[" + DEEP + "]")
    return ["data", "convert", "hotpotqa", "--input", str(work / "raw.json"), "--out", str(work / "converted")]


def torn_tasks(work: Path, run: Path) -> list[str]:
    from tracerl.envs.manifest import publish, write_temp_lines  # imports no torch

    data = work / "data"
    data.mkdir()
    rows = [json.loads(TASK.format(i=i)) for i in range(30)]
    publish(data, {"tasks.jsonl": write_temp_lines(data / "tasks.jsonl", rows),
                   "corpus.jsonl": write_temp_lines(data / "corpus.jsonl", [json.loads(DOC)])})
    lines = (data / "tasks.jsonl").read_text().splitlines(keepends=True)
    (data / "tasks.jsonl").write_text("".join(lines[:11]))  # a kill cut it at a line boundary
    return ["env-check", "--tasks", str(data / "tasks.jsonl"), "--corpus", str(data / "corpus.jsonl")]


# --- other engineers' cases (reported here too) ----------------------------------------------


def _step_file(run: Path) -> Path:
    return next((run / "rollouts").glob("step-*.jsonl.gz"))


def view_gzip_bomb(work: Path, run: Path) -> list[str]:
    with gzip.open(_step_file(run), "wb", compresslevel=9) as handle:
        for _ in range(2048):  # 2 GB of one line, ~2 MB compressed
            handle.write(b" " * (1 << 20))
    return ["view", str(run)]


def view_script_injection(work: Path, run: Path) -> list[str]:
    path = _step_file(run)
    records = [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]
    for record in records:
        for node in record["nodes"]:
            node["id"] = f"{node['id']}<script>alert(1)</script>" if node["parent"] is None else node["id"]
            node["visits"] = "<script>alert(2)</script>"
            node["assistant_tokens"] = "<img src=x onerror=alert(3)>"
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))
    return ["view", str(run), "--out", str(work / "view-out")]


def _no_script(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    pages = "".join(p.read_text() for p in (work / "view-out").glob("*.html")) if (work / "view-out").is_dir() else ""
    if done.returncode != 0:
        return None if len(done.stderr.strip().splitlines()) == 1 else "failed without one line"
    bad = [s for s in ("<script>alert", "<img src=x") if s in pages]
    return f"unescaped {bad} in the pages" if bad else None


def view_link(work: Path, run: Path) -> list[str]:
    target = work / "outside" / "site"
    target.mkdir()
    (target / "index.html").write_text("their page")
    _link(run / "view", target)
    return ["view", str(run)]


def view_missing_keys(work: Path, run: Path) -> list[str]:
    _step_file(run).write_bytes(gzip.compress(b'{"tree_id": "t"}\n'))
    return ["view", str(run)]


def tool_huge_message(work: Path, run: Path) -> list[str]:
    """A plug-in tool whose exception message is 10 MB, called once through a real environment
    (a random policy may never call it): the observation the policy would read must be bounded."""
    (work / "loud_tool.py").write_text(
        "def loud(query: str) -> str:\n    \"\"\"Fails with a 10 MB message.\"\"\"\n"
        "    raise RuntimeError('x' * 10_000_000)\n")
    (work / "exercise.py").write_text(
        "from tracerl.core.types import Action, Task\n"
        "from tracerl.envs.data import Document\n"
        "from tracerl.envs.environments import EnvSettings, build_environment\n"
        "if __name__ == '__main__':  # an isolated tool's worker is spawned: it re-imports this file\n"
        "    env = build_environment('search', [Document('d', 'Ada', 'Ada is a writer.')], EnvSettings(),"
        " ['loud_tool:loud'])\n"
        "    episode = env.start(Task(id='t', question='Who?', answers=('Ada',)))\n"
        "    observation = episode.step(Action(kind='tool', name='loud', arguments={'query': 'q'}))\n"
        "    open('observation_chars', 'w').write(str(len(observation.text)))\n"
        "    print(observation.text[:300].replace(chr(10), ' '))\n")
    return ["--script", "exercise.py"]


def _observations_bounded(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr.strip()[-200:]}"
    chars = int((work / "observation_chars").read_text())
    return None if chars < (1 << 20) else f"an observation of {chars} characters"


def _no_run_folder(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    """Bad data must fail before the run folder exists (else it blocks rerunning into --out)."""
    return "the run folder was created" if (work / "new-run").exists() else None


# --- round three: strangers' checkpoints and models ------------------------------------------


def _ckpt(run: Path) -> Path:
    return run / (run / "LATEST").read_text().strip()


def lock_hard_link(work: Path, run: Path) -> list[str]:
    """``.lock`` a hard link to a file outside: the lock moves to a file of its own (the run resumes)."""
    (run / ".lock").unlink()
    os.link(work / "outside" / "sentinel.txt", run / ".lock")
    return ["train", "--resume", str(run), "--steps", "2"]


def view_fifo(work: Path, run: Path) -> list[str]:
    path = _step_file(run)
    path.unlink()
    os.mkfifo(path)
    return ["view", str(run)]


def own_config_fresh(work: Path, run: Path) -> list[str]:
    """The user's own config.yaml in --out, a fresh start without --config: refused, not overwritten."""
    (work / "outside" / "config.yaml").write_text("steps: 1\n")
    return ["train", "grpo", "--smoke-random", "--steps", "1", "--out", str(work / "outside"), *RUN_ARGS]


def _data_folder(work: Path) -> Path:
    data = work / "data"
    data.mkdir()
    (data / "tasks.jsonl").write_text(TASK.format(i=1) + TASK.format(i=2))
    (data / "corpus.jsonl").write_text(DOC)
    return data


def manifest_crafted(work: Path, run: Path) -> list[str]:
    data = _data_folder(work)
    (data / "convert_manifest.json").write_text(json.dumps(
        {"kind": "tracerl data convert", "status": "complete",
         "files": {"tasks.jsonl": "x", "corpus.jsonl": {"records": [1], "bytes": 1, "sha256": "0"}}}))
    return ["env-check", "--tasks", str(data / "tasks.jsonl"), "--corpus", str(data / "corpus.jsonl")]


def manifest_records_huge(work: Path, run: Path) -> list[str]:
    data = _data_folder(work)
    size = (data / "tasks.jsonl").stat().st_size
    (data / "convert_manifest.json").write_text(
        '{"kind": "tracerl data convert", "status": "complete", "files": {"tasks.jsonl": '
        f'{{"records": 1e400, "bytes": {size}, "sha256": "0"}}}}}}')
    return ["env-check", "--tasks", str(data / "tasks.jsonl"), "--corpus", str(data / "corpus.jsonl")]


def _musique_row(i: int, idx: Any = 0) -> dict[str, Any]:
    return {"id": f"m{i}", "question": f"Who is {i}?", "answer": f"A{i}", "answerable": True,
            "paragraphs": [{"idx": idx, "title": f"T{i}", "paragraph_text": f"T{i} is A{i}.", "is_supporting": True}],
            "question_decomposition": [{"paragraph_support_idx": idx}]}


def musique_infinity(work: Path, run: Path) -> list[str]:
    rows = [json.dumps(_musique_row(1)), json.dumps(_musique_row(2)).replace('"idx": 0', '"idx": Infinity'),
            json.dumps(_musique_row(3))]
    (work / "raw.jsonl").write_text("\n".join(rows) + "\n")
    return ["data", "convert", "musique", "--input", str(work / "raw.jsonl"), "--out", str(work / "converted")]


def _converted_two(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr.strip()[-200:]}"
    tasks = (work / "converted" / "tasks.jsonl").read_text().splitlines()
    listed = "raw.jsonl:2" in done.stdout + done.stderr
    return None if len(tasks) == 2 and listed else f"{len(tasks)} tasks written, bad row listed: {listed}"


def convert_converted(work: Path, run: Path) -> list[str]:
    """A file already in tracerl's format given to a converter: one line, not one error per row."""
    (work / "tasks.jsonl").write_text("".join(TASK.format(i=i) for i in range(50)))
    return ["data", "convert", "musique", "--input", str(work / "tasks.jsonl"), "--out", str(work / "converted")]


def raw_musique_as_tasks(work: Path, run: Path) -> list[str]:
    (work / "raw.jsonl").write_text(json.dumps(_musique_row(1)) + "\n")
    (work / "corpus.jsonl").write_text(DOC)
    return ["env-check", "--tasks", str(work / "raw.jsonl"), "--corpus", str(work / "corpus.jsonl")]


def _metrics_step(value: str) -> Callable[[Path, Path], list[str]]:
    def build(work: Path, run: Path) -> list[str]:
        path = run / "metrics.jsonl"
        record = json.loads(path.read_text().splitlines()[0])
        record["step"] = "@STEP@"
        path.write_text(json.dumps(record).replace('"@STEP@"', value) + "\n")
        return ["train", "--resume", str(run), "--steps", "2"]
    return build


def _trainer_pt(edit: Callable[[dict[str, Any]], Any]) -> Callable[[Path, Path], list[str]]:
    def build(work: Path, run: Path) -> list[str]:
        import torch

        path = _ckpt(run) / "trainer.pt"
        state = torch.load(path, weights_only=True)
        torch.save(edit(state), path)
        return ["train", "--resume", str(run), "--steps", "2"]
    return build


def _set(state: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**state, **changes}


def _short_rng(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    return _set(state, rng={**state["rng"], "torch": torch.zeros(3, dtype=torch.uint8)})


def _optimizer_shapes(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    optimizer = state["optimizer"]  # AdamW moments of the first parameter, of a shape it does not have
    optimizer["state"][0] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros(2, 2), "exp_avg_sq": torch.zeros(2, 2)}
    return state


def _policy_config(where: str, edit: Callable[[dict[str, Any]], None], command: str) -> Callable[[Path, Path], list[str]]:
    def build(work: Path, run: Path) -> list[str]:
        path = (_ckpt(run) / "policy" if where == "ckpt" else run / "initial") / "config.json"
        config = json.loads(path.read_text())
        edit(config)
        path.write_text(json.dumps(config))
        if command == "eval":
            return ["eval", "--run", str(run), "--limit", "1", "--no-progress"]
        return ["train", "--resume", str(run), "--steps", "2"]
    return build


def _more_layers(config: dict[str, Any]) -> None:
    config["num_hidden_layers"] = config.get("num_hidden_layers", 1) + 1


def _wider(config: dict[str, Any]) -> None:
    config["hidden_size"] = config.get("hidden_size", 32) * 2


def _drop_unk(path: Path) -> None:
    data = json.loads(path.read_text())
    vocab = data["model"].get("vocab")
    if isinstance(vocab, dict):
        vocab.pop(data["model"].get("unk_token", "[UNK]"), None)
    data["added_tokens"] = [t for t in data.get("added_tokens", []) if "UNK" not in t.get("content", "")]
    path.write_text(json.dumps(data))


def tokenizer_no_unk(work: Path, run: Path) -> list[str]:
    """A word-level tokenizer.json without its unknown token: fails at the first unseen word."""
    _drop_unk(run / "initial" / "tokenizer.json")
    return ["train", "--resume", str(run), "--steps", "2"]


def tokenizer_no_unk_eval(work: Path, run: Path) -> list[str]:
    _drop_unk(_ckpt(run) / "policy" / "tokenizer.json")
    (work / "tasks.jsonl").write_text(TASK.format(i="Zyxwq"))
    (work / "corpus.jsonl").write_text(DOC)
    return ["eval", "--run", str(run), "--limit", "1", "--no-progress", "--tasks", str(work / "tasks.jsonl"),
            "--corpus", str(work / "corpus.jsonl")]


def reference_types(work: Path, run: Path) -> list[str]:
    (run / "initial" / "reference.json").write_text(json.dumps({"path": str(run / "initial"), "fingerprint": [1]}))
    return ["train", "--resume", str(run), "--steps", "2"]


def _chat_template(template: str) -> Callable[[Path, Path], list[str]]:
    def build(work: Path, run: Path) -> list[str]:
        folder = _ckpt(run)
        (folder / "policy" / "chat_template.jinja").write_text(template)
        config = folder / "config.yaml"
        config.write_text(config.read_text().replace("format: react", "format: chat"))
        return ["eval", "--run", str(run), "--limit", "1", "--no-progress"]
    return build


LOOP_TEMPLATE = ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
                 "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}")
DOUBLING_TEMPLATE = ("{% set s = namespace(x='ab') %}{% for i in range(40) %}{% set s.x = s.x ~ s.x %}{% endfor %}"
                     "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}")


class _Payload:
    """A pickle that runs a shell command when loaded (what a crafted DCP ``.metadata`` holds)."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"echo pwned > {self.target}",))


def dcp_pickle(work: Path, run: Path) -> list[str]:
    """A sharded-looking checkpoint whose ``dcp/.metadata`` is a code-running pickle: refused, not run."""
    import pickle

    _trainer_pt(lambda state: _set(state, optimizer=None))(work, run)
    dcp = _ckpt(run) / "dcp"
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(pickle.dumps(_Payload(work / "outside" / "pwned.txt")))
    return ["train", "--resume", str(run), "--steps", "2"]


def view_many_keys(work: Path, run: Path) -> list[str]:
    path = run / "metrics.jsonl"
    record = json.loads(path.read_text().splitlines()[0])
    with open(path, "w") as handle:
        for step in range(60):
            line = {**record, "step": step, **{f"k{step}_{i}": 1.0 for i in range(40_000)}}
            handle.write(json.dumps(line) + "\n")
    return ["view", str(run)]


def tasks_json_dev_zero(work: Path, run: Path) -> list[str]:
    (work / "tasks.json").symlink_to("/dev/zero")
    (work / "corpus.jsonl").write_text(DOC)
    return ["env-check", "--tasks", str(work / "tasks.json"), "--corpus", str(work / "corpus.jsonl")]


def tasks_fifo(work: Path, run: Path) -> list[str]:
    os.mkfifo(work / "tasks.jsonl")
    (work / "corpus.jsonl").write_text(DOC)
    return ["env-check", "--tasks", str(work / "tasks.jsonl"), "--corpus", str(work / "corpus.jsonl")]


def config_fifo(work: Path, run: Path) -> list[str]:
    os.mkfifo(work / "config.yaml")
    return ["config", "show", "grpo", "--config", str(work / "config.yaml")]


def escape_in_config(work: Path, run: Path) -> list[str]:
    config = _ckpt(run) / "config.yaml"
    config.write_text(config.read_text() + '"\\e]0;pwned\\a\\e[2J": 1\n')  # YAML's escapes: ESC, BEL
    return ["eval", "--run", str(run), "--limit", "1", "--no-progress"]


def _no_escape(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    return "a raw escape character reached the terminal" if "\x1b" in done.stderr + done.stdout else None


def world_huge(work: Path, run: Path) -> list[str]:
    return ["train", "grpo", "--smoke-random", "--steps", "1", "--out", str(work / "new-run"),
            "--set", "data.world.num_people=1000000000"]


def verifier_os_system(work: Path, run: Path) -> list[str]:
    return ["config", "show", "grpo", "--set", "data.verifier=os:system"]


def config_no_import(work: Path, run: Path) -> list[str]:
    """A stranger's config naming a module that runs code at import: ``config show --no-import`` reads it."""
    (work / "their_plugin.py").write_text(
        f"open({str(work / 'outside' / 'imported.txt')!r}, 'w').write('ran')\n"
        "def verify(answer, task):\n    return 0.0\n")
    (work / "their.yaml").write_text("data:\n  verifier: their_plugin:verify\n")
    return ["config", "show", "grpo", "--config", str(work / "their.yaml"), "--no-import"]


def _shown_not_imported(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr.strip()[-200:]}"
    return None if "their_plugin:verify" in done.stdout else "the config was not shown"


CASES = [
    Case("lock_link", "runfolder", lock_link),
    Case("lock_link_fresh", "runfolder", lock_link_fresh, needs_run=False),
    Case("config_in_out", "runfolder", config_in_out, needs_run=False),
    Case("metrics_dangling_link", "runfolder", metrics_dangling, needs_run=False),
    Case("metrics_dev_zero", "runfolder", metrics_dev_zero),
    Case("rollouts_link", "runfolder", rollouts_link),
    Case("trainer_pt_link", "runfolder", trainer_pt_link),
    Case("latest_link", "runfolder", latest_link),
    Case("yaml_bomb_config", "runfolder", yaml_bomb_config, needs_run=False),
    Case("yaml_bomb_run", "runfolder", yaml_bomb_run),
    Case("import_path_run", "runfolder", import_path_run),
    Case("big_question", "runfolder", big_question, needs_run=False, check=_no_run_folder),
    Case("huge_line", "runfolder", huge_line, needs_run=False),
    Case("deep_json_env_check", "runfolder", deep_json_env_check, needs_run=False),
    Case("deep_json_train", "runfolder", deep_json_train, needs_run=False, check=_no_run_folder),
    Case("deep_json_convert", "runfolder", deep_json_convert, needs_run=False),
    Case("torn_tasks", "runfolder", torn_tasks, needs_run=False),
    Case("view_gzip_bomb", "view", view_gzip_bomb),
    Case("view_script_injection", "view", view_script_injection, expect_ok=True, check=_no_script),
    Case("view_link", "view", view_link),
    Case("view_missing_keys", "view", view_missing_keys),
    Case("tool_huge_message", "guards", tool_huge_message, expect_ok=True, check=_observations_bounded,
         needs_run=False),
    Case("lock_hard_link", "runfolder", lock_hard_link, expect_ok=True),
    Case("view_fifo", "view", view_fifo),
    Case("own_config_fresh", "runfolder", own_config_fresh, needs_run=False),
    Case("manifest_crafted", "runfolder", manifest_crafted, needs_run=False),
    Case("manifest_records_huge", "runfolder", manifest_records_huge, needs_run=False),
    Case("musique_infinity", "runfolder", musique_infinity, expect_ok=True, check=_converted_two, needs_run=False),
    Case("convert_converted", "runfolder", convert_converted, needs_run=False),
    Case("raw_musique_as_tasks", "runfolder", raw_musique_as_tasks, needs_run=False),
    Case("metrics_step_null", "runfolder", _metrics_step("null")),
    Case("metrics_step_1e400", "runfolder", _metrics_step("1e400")),
    Case("metrics_step_list", "runfolder", _metrics_step("[3]")),
    Case("trainer_pt_empty", "runfolder", _trainer_pt(lambda state: {})),
    Case("trainer_pt_list", "runfolder", _trainer_pt(lambda state: [1, 2])),
    Case("trainer_pt_step_text", "runfolder", _trainer_pt(lambda state: _set(state, step="1"))),
    Case("trainer_pt_short_rng", "runfolder", _trainer_pt(_short_rng)),
    Case("trainer_pt_optimizer_shapes", "runfolder", _trainer_pt(_optimizer_shapes)),
    Case("ckpt_config_mismatch", "runfolder", _policy_config("ckpt", _wider, "eval")),
    Case("initial_config_mismatch", "runfolder", _policy_config("initial", _more_layers, "resume")),
    Case("tokenizer_no_unk", "runfolder", tokenizer_no_unk),
    Case("tokenizer_no_unk_eval", "runfolder", tokenizer_no_unk_eval),
    Case("reference_types", "runfolder", reference_types),
    Case("chat_template_loops", "runfolder", _chat_template(LOOP_TEMPLATE)),
    Case("chat_template_doubling", "runfolder", _chat_template(DOUBLING_TEMPLATE)),
    Case("dcp_pickle", "runfolder", dcp_pickle),
    Case("view_many_keys", "view", view_many_keys),
    Case("tasks_json_dev_zero", "runfolder", tasks_json_dev_zero, needs_run=False),
    Case("tasks_fifo", "runfolder", tasks_fifo, needs_run=False),
    Case("config_fifo", "runfolder", config_fifo, needs_run=False),
    Case("escape_in_config", "runfolder", escape_in_config, check=_no_escape),
    Case("world_huge", "runfolder", world_huge, needs_run=False, check=_no_run_folder),
    Case("verifier_os_system", "runfolder", verifier_os_system, needs_run=False),
    Case("config_no_import", "runfolder", config_no_import, expect_ok=True, check=_shown_not_imported,
         needs_run=False),
]


from hostile_round4_bounds import ROUND4  # noqa: E402 - issue 50: sizes, verifiers, shipped files, merges

CASES += [Case(name, owner, build, **options) for name, owner, build, options in ROUND4]

from hostile_round4_files import ROUND4_FILES  # noqa: E402 - issue 50: temporaries, atomic outputs, anchors, pickles

CASES += [Case(name, owner, build, **options) for name, owner, build, options in ROUND4_FILES]


# --- running -------------------------------------------------------------------------------


_TREE = {"root": ROOT}
"""The tracerl source tree under test (``--root``: e.g. an older checkout, to see what it fails)."""


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRACERL_THREADS="1", PROBE_PEAK=str(work / "peak_kib"))
    env["PYTHONPATH"] = os.pathsep.join([str(_TREE["root"]), str(work), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("TRACERL_DEBUG", None)
    return env


def build_run(base: Path) -> Path:
    """A finished 1-step smoke run (random-tiny) that the run-folder cases copy and damage."""
    run = base / "template-run"
    if not (run / "LATEST").exists():
        shutil.rmtree(run, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "tracerl.cli", "train", "grpo", "--smoke-random", "--steps", "1",
                        "--out", str(run), *RUN_ARGS], check=True, env=_env(base), capture_output=True, timeout=600,
                       cwd=base)  # not this tree's root: `-m` would import the tracerl found there
    return run


def _outside_state(outside: Path) -> dict[str, Any]:
    return {str(p.relative_to(outside)): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
            for p in sorted(outside.rglob("*")) if not p.is_symlink()}


def run_case(case: Case, base: Path, template: Path | None, timeout: float, memory_mib: float) -> dict[str, Any]:
    """Build ``case`` in a fresh work folder, run its command, and judge it (see module doc)."""
    work = base / case.name
    shutil.rmtree(work, ignore_errors=True)
    (work / "outside").mkdir(parents=True)
    (work / "outside" / "sentinel.txt").write_text(SECRET)
    run = work / "run"
    if template is not None:
        shutil.copytree(template, run, symlinks=True)
    args = case.build(work, run)
    before = _outside_state(work / "outside")
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", _WRAPPER, *args], cwd=work, env=_env(work),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        timed_out = True
    seconds = time.monotonic() - started
    done = subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)
    peak_file = work / "peak_kib"
    peak_mib = int(peak_file.read_text()) / 1024 if peak_file.exists() else None
    lines = stderr.strip().splitlines()
    problems = []
    if timed_out:
        problems.append(f"no end within {timeout:.0f} s")
    elif case.expect_ok and case.check is None and proc.returncode != 0:
        problems.append(f"exit {proc.returncode}")
    elif not case.expect_ok and (proc.returncode != 1 or len(lines) != 1 or "Traceback" in stderr):
        problems.append(f"exit {proc.returncode} with {len(lines)} stderr lines")
    if case.check is not None and not timed_out:
        problem = case.check(work, done)
        if problem:
            problems.append(problem)
    if any(SECRET[i:i + 16] in stderr for i in range(0, len(SECRET) - 16, 8)):
        problems.append("the sentinel's content was echoed")
    if _outside_state(work / "outside") != before:
        problems.append("something outside the folder changed")
    if peak_mib is None or peak_mib > memory_mib:
        problems.append(f"peak RSS {peak_mib} MiB over {memory_mib:.0f}" if peak_mib else "no peak RSS (killed?)")
    return {"case": case.name, "owner": case.owner, "ok": not problems, "problems": problems,
            "exit": proc.returncode, "stderr_lines": len(lines), "line": lines[-1][:300] if lines else "",
            "seconds": round(seconds, 1), "peak_rss_mib": round(peak_mib, 1) if peak_mib else None}


def probe(names: list[str] | None, base: Path, timeout: float = 180, memory_mib: float = 1536) -> list[dict[str, Any]]:
    """Run the cases named (all when None) under ``base``; one result dict per case."""
    cases = [c for c in CASES if names is None or c.name in names]
    unknown = set(names or []) - {c.name for c in CASES}
    if unknown:
        raise SystemExit(f"unknown cases: {', '.join(sorted(unknown))}; valid: {', '.join(c.name for c in CASES)}")
    template = build_run(base) if any(c.needs_run for c in cases) else None
    return [run_case(c, base, template if c.needs_run else None, timeout, memory_mib) for c in cases]


def main() -> None:
    from tracerl.testbed.provenance import git_state  # the commit of the probed tree (issue 48)

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="Case names (default: all).")
    parser.add_argument("--work", default="/tmp/tracerl-hostile", help="Work folder (recreated per case).")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--memory-mib", type=float, default=1536.0)
    parser.add_argument("--out", default=None, help="Write the results as JSON here.")
    parser.add_argument("--root", default=str(ROOT), help="tracerl source tree to probe (default: this one).")
    args = parser.parse_args()
    _TREE["root"] = Path(args.root).resolve()
    base = Path(args.work)
    base.mkdir(parents=True, exist_ok=True)
    results = probe(args.only, base, args.timeout, args.memory_mib)
    for r in results:
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']:24s} [{r['owner']}] {r['seconds']:6.1f}s "
              f"{r['peak_rss_mib']} MiB  {'; '.join(r['problems']) or r['line'][:100]}")
    summary = {"root": str(_TREE["root"]), "memory_bound_mib": args.memory_mib, "timeout_s": args.timeout, "cases": results,
               "passed": sum(r["ok"] for r in results), "total": len(results), "git": git_state(_TREE["root"])}
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{summary['passed']}/{summary['total']} cases passed")


if __name__ == "__main__":
    main()
