"""Issue 50's cases on sizes, verifiers, shipped files and benchmark merges, for hostile_inputs.py.

Each entry of :data:`ROUND4` is ``(name, owner, build, options)``; hostile_inputs.py wraps them in
its ``Case`` and judges them like its own (one line on stderr, nothing outside touched, the memory
bound, the timeout). ``build(work, run)`` returns the CLI arguments (``--script FILE`` runs a file
that drives the library directly).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

RUN_ARGS = ["--set", "rollout.engine.max_turns=2", "--set", "eval.size=2"]
BENCH = Path(__file__).resolve().parents[1]  # benchmarks/


def _ckpt(run: Path) -> Path:
    return run / (run / "LATEST").read_text().strip()


def _edit_json(path: Path, **values: Any) -> None:
    data = json.loads(path.read_text())
    data.update(values)
    path.write_text(json.dumps(data))


def _script(work: Path, body: str) -> list[str]:
    """A script that prints one line on stderr and exits 1 for a UserError (as the CLI would)."""
    (work / "exercise.py").write_text(
        "import sys\nfrom tracerl.errors import UserError\n"
        "if __name__ == '__main__':\n    try:\n" + "".join(f"        {line}\n" for line in body.splitlines())
        + "    except UserError as err:\n        sys.stderr.write(str(err) + '\\n')\n        sys.exit(1)\n")
    return ["--script", "exercise.py"]


# --- item 5, 16: model sizes from config.json --------------------------------------------------


def ckpt_layers_200000(work: Path, run: Path) -> list[str]:
    _edit_json(_ckpt(run) / "policy" / "config.json", num_hidden_layers=200_000)
    return ["eval", "--run", str(run), "--limit", "1", "--no-progress"]


def initial_layers_200000(work: Path, run: Path) -> list[str]:
    _edit_json(run / "initial" / "config.json", num_hidden_layers=200_000)
    return ["train", "--resume", str(run), "--steps", "2"]


def initial_vocab_1e9(work: Path, run: Path) -> list[str]:
    (run / "initial" / "config.json").write_text(
        (run / "initial" / "config.json").read_text().replace('"vocab_size": ', '"vocab_size": 1e9, "was": '))
    return ["train", "--resume", str(run), "--steps", "2"]


def _no_ansi(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    return "raw ANSI codes on stderr" if "\x1b" in done.stderr else None


# --- item 6: a parquet bomb ------------------------------------------------------------------


def parquet_bomb(work: Path, run: Path) -> list[str]:
    """One 800 MB string in a ~26 KB zstd file (needs pyarrow here; without it tracerl's line is its
    own 'needs pyarrow')."""
    bomb = work / "bomb.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist([{"id": "q", "question": "x" * (800 << 20), "answers": ["a"]}]), bomb,
                       compression="zstd")
    except ImportError:
        bomb.write_bytes(b"PAR1")
    (work / "corpus.jsonl").write_text('{"id": "d", "title": "Ada", "text": "Ada is a writer."}\n')
    return ["env-check", "--tasks", str(bomb), "--corpus", str(work / "corpus.jsonl")]


# --- items 7, 8, 15: verifiers, environment factories, tools -----------------------------------


def _verifier_run(work: Path, body: str) -> list[str]:
    (work / "their_judge.py").write_text("import sys\n\ndef verify(answer, task):\n" + body)
    return ["train", "grpo", "--smoke-random", "--steps", "1", "--out", str(work / "new-run"), *RUN_ARGS,
            "--set", "data.verifier=their_judge:verify", "--set", "log.checkpoint_every=1"]


def verifier_exits(work: Path, run: Path) -> list[str]:
    return _verifier_run(work, "    sys.exit(0)\n")


def verifier_huge_int(work: Path, run: Path) -> list[str]:
    return _verifier_run(work, "    return 10**400\n")


def _checkpointed(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    """The run went on and checkpointed (a random policy may never answer, so the verifier may not be
    called: ``verifier_called_exits`` calls it directly)."""
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr.strip()[-200:]}"
    return None if (work / "new-run" / "LATEST").is_file() else "no checkpoint"


def verifier_called_exits(work: Path, run: Path) -> list[str]:
    """The configured verifier (``data.verifier`` resolved as training resolves it) calls sys.exit(0),
    os-level exit aside: scored 0, counted, said once on stderr, and the process goes on."""
    (work / "their_judge.py").write_text("import sys\n\ndef verify(answer, task):\n    sys.exit(0)\n")
    return _script(work, "from tracerl.core.types import Task\n"
                         "from tracerl.envs.verifiers import get_verifier\n"
                         "judge = get_verifier('their_judge:verify')\n"
                         "reward = judge('a', Task('t', 'Q?', ('a',)))\n"
                         "open('result', 'w').write(f'{reward} {judge.failures}')")


def verifier_sleeps(work: Path, run: Path) -> list[str]:
    """A verifier that sleeps an hour, under a 1 s limit: scored 0 and counted, the call abandoned."""
    return _script(work, "import time\n"
                         "from tracerl.core.types import Task\n"
                         "from tracerl.envs.verifiers import GuardedVerifier\n"
                         "guarded = GuardedVerifier(lambda a, t: time.sleep(3600), 'sleeper', timeout_s=1.0)\n"
                         "reward = guarded('a', Task('t', 'Q?', ('a',)))\n"
                         "open('result', 'w').write(f'{reward} {guarded.failures}')")


def _scored_zero(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    if done.returncode != 0:
        return f"exit {done.returncode}"
    got = (work / "result").read_text() if (work / "result").exists() else ""
    return None if got == "0.0 1" else f"reward and failures {got!r}, expected '0.0 1'"


def env_factory_raises(work: Path, run: Path) -> list[str]:
    (work / "their_env.py").write_text("def factory(documents, settings):\n    raise RuntimeError('index down')\n")
    return ["train", "grpo", "--smoke-random", "--steps", "1", "--out", str(work / "new-run"), *RUN_ARGS,
            "--set", "data.environment=their_env:factory"]


def tool_base_exception(work: Path, run: Path) -> list[str]:
    (work / "their_tool.py").write_text(
        "class Escape(BaseException):\n    pass\n\n"
        "def escape(query: str) -> str:\n    \"\"\"Raise a BaseException subclass.\"\"\"\n    raise Escape('out')\n")
    return _script(work, "from tracerl.core.types import Action, Task\n"
                         "from tracerl.envs.base import EnvConfig, ToolEnvironment\n"
                         "from tracerl.envs.tools import ToolSet\n"
                         "from their_tool import escape\n"
                         "env = ToolEnvironment(ToolSet([escape]), EnvConfig(tool_timeout_s=5.0))\n"
                         "obs = env.start(Task('t', 'Q?', ('a',))).step(Action('tool', name='escape', "
                         "arguments={'query': 'q'}))\n"
                         "open('result', 'w').write(f'{obs.infra_failed} {obs.text}')")


def _infra_failure(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    got = (work / "result").read_text() if (work / "result").exists() else ""
    return None if got == "True tool escape raised Escape: out" else f"observation {got!r}"


# --- item 10, 16: shipped files, pretrain --out, a checkpoint's model --------------------------


def _shipped_copy(work: Path, edit: str) -> list[str]:
    return _script(work, "import shutil\nfrom pathlib import Path\n"
                         "from tracerl.testbed.shipped import find_shipped, weights_root\n"
                         "from tracerl.testbed.tiny_config import get_preset\n"
                         "root = Path('weights')\n"
                         "shutil.copytree(weights_root() / 'smoke', root / 'smoke')\n"
                         f"{edit}\n"
                         "find_shipped(get_preset('smoke'), root)")


def shipped_config_edited(work: Path, run: Path) -> list[str]:
    return _shipped_copy(work, "p = root / 'smoke' / 'config.json'\n"
                               "p.write_text(p.read_text().replace('1e-06', '1e-05'))")


def shipped_weights_link(work: Path, run: Path) -> list[str]:
    return _shipped_copy(work, "w = root / 'smoke' / 'model.safetensors'\n"
                               "shutil.move(w, 'elsewhere.safetensors')\n"
                               "w.symlink_to(Path('elsewhere.safetensors').resolve())")


def shipped_sha_int(work: Path, run: Path) -> list[str]:
    return _shipped_copy(work, "import json\nm = root / 'smoke' / 'manifest.json'\n"
                               "m.write_text(json.dumps({**json.loads(m.read_text()), 'sha256': 12345}))")


def pretrain_out_marker_only(work: Path, run: Path) -> list[str]:
    from tracerl.testbed.shipped import weights_root  # imports no torch

    out = work / "D"
    out.mkdir()
    shutil.copyfile(weights_root() / "smoke" / "tiny_config.json", out / "tiny_config.json")
    return ["pretrain", "--preset", "smoke", "--out", str(out)]


def _ckpt_config(old: str, new: str) -> Callable[[Path, Path], list[str]]:
    def build(work: Path, run: Path) -> list[str]:
        path = _ckpt(run) / "config.yaml"
        path.write_text(path.read_text().replace(old, new, 1))
        return ["train", "--resume", str(run), "--steps", "2"]
    return build


# --- items 9, 17: benchmark merges -----------------------------------------------------------


def _shard(seed: int, final: float) -> dict[str, Any]:
    curve = [{"step": 0, "rollouts": 0, "generated_tokens": 0, "accuracy": 0.1}]
    run = {"seed": seed, "curve": curve, "final": {"unseen": final, "train": 0.5, "redrawn": None},
           "effective_ratio": [0.5], "reward_mean": [0.1], "step_seconds": [1.0]}
    return {"setting": {"steps": 1, "seeds": 1}, "runs": {"grpo": [run]}, "seconds": 1.0, "quick": True}


def merge_nan(work: Path, run: Path) -> list[str]:
    """One seed's final NaN: refused naming the file and field, and no JSON or PNG written."""
    (work / "a.json").write_text(json.dumps(_shard(0, 0.3)))
    (work / "b_nan.json").write_text(json.dumps(_shard(1, math.nan)))
    return _script(work, "import runpy\n"
                         f"sys.path.insert(0, {str(BENCH)!r})\n"
                         "sys.argv = ['sample_efficiency.py', '--merge', 'a.json', 'b_nan.json', '--out', 'merged.json']\n"
                         f"runpy.run_path({str(BENCH / 'science' / 'sample_efficiency.py')!r}, run_name='__main__')")


def _nothing_written(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    written = [p.name for p in (work / "merged.json", work / "merged.png") if p.exists()]
    return f"wrote {written}" if written else None


ROUND4: list[tuple[str, str, Callable[[Path, Path], list[str]], dict[str, Any]]] = [
    ("ckpt_layers_200000", "sizes", ckpt_layers_200000, {}),
    ("initial_layers_200000", "sizes", initial_layers_200000, {}),
    ("initial_vocab_1e9", "sizes", initial_vocab_1e9, {"check": _no_ansi}),
    ("parquet_bomb", "sizes", parquet_bomb, {"needs_run": False}),
    ("verifier_exits", "verifiers", verifier_exits, {"expect_ok": True, "check": _checkpointed, "needs_run": False}),
    ("verifier_huge_int", "verifiers", verifier_huge_int, {"expect_ok": True, "check": _checkpointed,
                                                           "needs_run": False}),
    ("verifier_called_exits", "verifiers", verifier_called_exits, {"expect_ok": True, "check": _scored_zero,
                                                                   "needs_run": False}),
    ("verifier_sleeps", "verifiers", verifier_sleeps, {"expect_ok": True, "check": _scored_zero, "needs_run": False}),
    ("env_factory_raises", "verifiers", env_factory_raises, {"needs_run": False}),
    ("tool_base_exception", "verifiers", tool_base_exception, {"expect_ok": True, "check": _infra_failure,
                                                               "needs_run": False}),
    ("shipped_config_edited", "shipped", shipped_config_edited, {"needs_run": False}),
    ("shipped_weights_link", "shipped", shipped_weights_link, {"needs_run": False}),
    ("shipped_sha_int", "shipped", shipped_sha_int, {"needs_run": False}),
    ("pretrain_out_marker_only", "shipped", pretrain_out_marker_only, {"needs_run": False}),
    ("ckpt_model_edited", "shipped", _ckpt_config("name_or_path: random-tiny", "name_or_path: tiny"), {}),
    ("ckpt_preset_edited", "shipped", _ckpt_config("preset: grpo", "preset: trace"), {}),
    ("merge_nan", "merges", merge_nan, {"check": _nothing_written, "needs_run": False}),
]
"""(name, owner, build, Case options) of each case."""
