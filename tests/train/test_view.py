"""Rollout records and ``tracerl view``: hand-built trees with readable numbers, the parsed HTML,
and the page as headless Chromium renders it (skipped when chromium is not installed)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.core.advantages import _spread
from tracerl.core.types import Action, RolloutTree, Task, Trajectory, Turn
from tracerl.train.rollout_log import RolloutLog, logged_steps, read_step, step_file
from tracerl.train.view import ViewError, render_run

TASK = Task(id="t1", question="Where was Ada born?", answers=("Lumen",))


def _turn(kind: str, text: str, observation: str = "", n: int = 2) -> Turn:
    action = Action(kind="answer", answer=text) if kind == "answer" else Action(kind="tool", name="search")
    return Turn(assistant_ids=list(range(n)), observation_ids=[9] * (3 if observation else 0), text=text,
                action=action, observation=observation)


def branching_tree() -> tuple[RolloutTree, list[Trajectory]]:
    """Root -> search (node 1) -> two answers: 'Lumen' (node 2, reward 1) and 'Varo' (node 3, reward 0).

    Readiness: l_0 = -2.0 at the prompt, l_1 = -0.5 after the search (credit +1.5).
    """
    tree = RolloutTree(tree_id="t1@0", task_id="t1", prompt_ids=[1, 2, 3])
    search = tree.add_child(0, _turn("tool", "Action: search[Ada]", "Ada Stone was born in Lumen."))
    trajs = []
    for answer, reward in (("Lumen", 1.0), ("Varo", 0.0)):
        leaf = tree.add_child(search, _turn("answer", f"Action: answer[{answer}]"))
        traj = Trajectory(task_id="t1", group_id="t1", prompt_ids=[1, 2, 3],
                          turns=[tree.nodes[search].turn, tree.nodes[leaf].turn],  # type: ignore[list-item]
                          answer=answer, reward=reward, readiness=[-2.0, -0.5])
        tree.add_leaf(leaf, traj)
        trajs.append(traj)
    tree.nodes[0].readiness, tree.nodes[search].readiness = -2.0, -0.5
    return tree, trajs


class ConstantPredictor:
    """A stand-in with the predictor's public API: P(success) = 0.1 * (node id + 1)."""

    def predict_nodes(self, trees, node_ids):  # noqa: ANN001, ANN201
        return [0.1 * (n + 1) for n in node_ids]


def write_run(run_dir: Path, steps: int = 2) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    log = RolloutLog(run_dir, {"t1": TASK})
    for step in range(1, steps + 1):
        tree, trajs = branching_tree()
        advantages = [_spread(t, torch.tensor([0.5, a])) for t, a in zip(trajs, (1.0, -1.0))]
        log.write(step, [tree], advantages, ConstantPredictor())
    lines = [{"step": s, "reward_mean": 0.5, "loss": 0.25 * s, "rollouts": 2} for s in range(1, steps + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_rollout_record_holds_the_tree_readiness_advantage_and_predictor(tmp_path: Path) -> None:
    write_run(tmp_path, steps=1)
    (record,) = read_step(tmp_path, 1)
    assert (record["question"], record["answers"]) == ("Where was Ada born?", ["Lumen"])
    nodes = record["nodes"]
    assert [n["parent"] for n in nodes] == [None, 0, 1, 1]
    assert [n["is_leaf"] for n in nodes] == [False, False, True, True]
    assert [n["reward"] for n in nodes] == [None, None, 1.0, 0.0]
    assert [n["visits"] for n in nodes] == [2, 2, 1, 1]
    assert nodes[1]["value_target"] == 0.5 and nodes[1]["observation"] == "Ada Stone was born in Lumen."
    assert [n["predictor"] for n in nodes] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert [n["readiness"] for n in nodes] == [-2.0, -0.5, None, None]
    wins = [t for t in record["trajectories"] if t["reward"] == 1.0]
    assert wins[0]["readiness"] == [-2.0, -0.5] and wins[0]["turn_advantage"] == [0.5, 1.0]
    assert wins[0]["node_path"] == [0, 1, 2]


def test_record_and_page_show_the_decoded_prompt(tmp_path: Path) -> None:
    tree, trajs = branching_tree()
    log = RolloutLog(tmp_path, {"t1": TASK}, decode=lambda ids: "<|im_start|>user\n" + " ".join(map(str, ids)))
    log.write(1, [tree], [torch.zeros(len(t.token_ids)) for t in trajs])
    (record,) = read_step(tmp_path, 1)
    assert record["prompt"] == "<|im_start|>user\n1 2 3"
    page = (render_run(tmp_path).parent / "step-000001.html").read_text(encoding="utf-8")
    assert "<summary>prompt</summary><pre>&lt;|im_start|&gt;user\n1 2 3</pre>" in page
    write_run(tmp_path / "old", steps=1)  # without a decoder: no prompt text, no fold on the page
    assert read_step(tmp_path / "old", 1)[0]["prompt"] == ""
    assert "<summary>prompt" not in (render_run(tmp_path / "old").parent / "step-000001.html").read_text()


def test_files_are_gzip_and_truncation_drops_later_steps(tmp_path: Path) -> None:
    write_run(tmp_path, steps=3)
    assert gzip.decompress(step_file(tmp_path, 2).read_bytes()).count(b"\n") == 1
    assert logged_steps(tmp_path) == [1, 2, 3]
    assert RolloutLog(tmp_path, {}).truncate_after(1) == [2, 3]
    assert logged_steps(tmp_path) == [1]
    assert RolloutLog(tmp_path, {}, enabled=False).write(5, [], []) is None
    assert logged_steps(tmp_path) == [1]


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.classes: list[str] = []
        self.links: list[str] = []
        self.external: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.classes += (a.get("class") or "").split()
        if tag == "a" and a.get("href"):
            self.links.append(a["href"] or "")
        if tag in ("script", "link", "img") and (a.get("src") or a.get("href")):
            self.external.append(a.get("src") or a.get("href") or "")

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_pages_show_nodes_rewards_credit_and_link_steps(tmp_path: Path) -> None:
    write_run(tmp_path / "run")
    index = render_run(tmp_path / "run")
    page = _Collect()
    page.feed((index.parent / "step-000001.html").read_text())
    text = " ".join(page.text)
    assert page.classes.count("node") == 4 and page.classes.count("turn") == 4  # 4 nodes; 2 leaves x 2 turns
    assert page.classes.count("win") == 1 and page.classes.count("loss") == 1 and page.classes.count("branch") == 1
    assert "reward 1.000" in text and "reward 0.000" in text
    assert "l=-0.500" in text and "V=0.200" in text
    assert "1.500" in text  # credit l_1 - l_0 = -0.5 - (-2.0)
    assert page.external == []  # self-contained: no script or stylesheet from elsewhere
    listing = _Collect()
    listing.feed(index.read_text())
    assert listing.links == ["step-000001.html", "step-000002.html"]
    assert "0.5000" in " ".join(listing.text)  # step 2's loss


def test_view_errors_are_one_line(tmp_path: Path) -> None:
    write_run(tmp_path / "run", steps=1)
    with pytest.raises(ViewError, match="logged steps: 1"):
        render_run(tmp_path / "run", step=7)
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(app, ["view", str(tmp_path / "empty")])
    assert result.exit_code == 1 and "log.rollouts" in result.stderr and len(result.stderr.splitlines()) == 1
    ok = CliRunner().invoke(app, ["view", str(tmp_path / "run"), "--out", str(tmp_path / "html")])
    assert ok.exit_code == 0 and (tmp_path / "html" / "step-000001.html").is_file()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install -y "
                    "--no-install-recommends chromium); the html.parser tests above still check the pages")
def test_chromium_renders_the_tree(tmp_path: Path) -> None:
    write_run(tmp_path / "run", steps=1)
    page = render_run(tmp_path / "run").parent / "step-000001.html"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert dom.count('class="node"') == 4 and "reward 1.000" in dom and "V=0.400" in dom
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=900,700", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    from PIL import Image

    pixels = Image.open(shot).convert("L")
    low, high = pixels.getextrema()
    assert high - low > 100  # text and cards on the page, not a blank canvas
