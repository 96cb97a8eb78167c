"""Rollout records and ``tracerl view``: hand-built trees with readable numbers, the parsed HTML,
and the page as headless Chromium renders it (skipped when chromium is not installed)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.runs.rollout_log import RolloutLog, logged_steps, read_step, step_file
from tracerl.view.site import ViewError, render_run
from view_fixtures import C_LOSS, C_WIN, OPTIONS, TASK, V1, branching_tree, wide_tree, write_run


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
    # search turn: w_out * A (+1, no anchor above it) + w_turn * c_0; answer turn: A + the anchor's +1
    assert wins[0]["readiness"] == [-2.0, -0.5]
    assert wins[0]["turn_advantage"] == pytest.approx([1.0 + 0.2 * C_WIN, 2.0], abs=1e-5)
    assert wins[0]["node_path"] == [0, 1, 2]


def test_record_holds_the_values_and_credit_the_estimator_used(tmp_path: Path) -> None:
    write_run(tmp_path, steps=1)
    (record,) = read_step(tmp_path, 1)
    win, loss = sorted(record["trajectories"], key=lambda t: -t["reward"])
    assert (win["outcome_advantage"], loss["outcome_advantage"]) == (1.0, -1.0)
    assert win["values"] == pytest.approx([0.0, V1], abs=1e-5) and loss["values"] == win["values"]
    assert win["credit"] == pytest.approx([C_WIN], abs=1e-5) and loss["credit"] == pytest.approx([C_LOSS], abs=1e-5)
    assert record["credit_options"] == {"value": "log_ratio", "eps": 0.1, "horizon": 3, "gamma": 0.8,
                                        "terminal_scale": 2.0, "w_out": 1.0, "w_turn": 0.2}
    write_run(tmp_path / "off", steps=1, credit=None)  # algo.credit off: nothing to record
    (off,) = read_step(tmp_path / "off", 1)
    assert off["credit_options"] is None and off["trajectories"][0]["credit"] is None


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
    assert page.external == []  # self-contained: no script or stylesheet from elsewhere
    listing = _Collect()
    listing.feed(index.read_text())
    assert listing.links == ["step-000001.html", "step-000002.html"]
    assert "0.5000" in " ".join(listing.text)  # step 2's loss


def _cells(html: str, name: str) -> list[str]:
    return re.findall(rf'<td class="{name}"[^>]*>([^<]*)</td>', html)


def test_the_table_shows_l_v_c_and_token_advantage_under_their_names(tmp_path: Path) -> None:
    write_run(tmp_path / "run", steps=1)
    html = (render_run(tmp_path / "run").parent / "step-000001.html").read_text()
    for name in ("l<sub>k+1</sub> readiness after", "V<sub>k+1</sub> value after", "c<sub>k</sub> credit",
                 "token advantage", "A<sub>out</sub> outcome advantage"):
        assert f"<th>{name}</th>" in html
    assert _cells(html, "outcome") == ["1.000", "-1.000"] and _cells(html, "k") == ["0", "\u2013"] * 2
    assert "\u0394l" not in html and "1.500" not in html  # the raw readiness difference is no column
    # rows: win's search and answer turn, then loss's; the answer turn has no l, V or c of its own
    assert _cells(html, "readiness") == ["-0.500", "\u2013", "-0.500", "\u2013"]
    assert _cells(html, "value") == [f"{V1:.3f}", "\u2013"] * 2 == ["1.253", "\u2013", "1.253", "\u2013"]
    assert _cells(html, "credit") == [f"{C_WIN:.3f}", "\u2013", f"{C_LOSS:.3f}", "\u2013"]
    assert _cells(html, "credit")[::2] == ["2.853", "-0.347"]
    assert _cells(html, "advantage") == [f"{1 + 0.2 * C_WIN:.3f}", "2.000", f"{-1 + 0.2 * C_LOSS:.3f}", "-2.000"]
    assert "K = 3" in html and "&kappa; = 2.00" in html  # the legend names the options used


def test_step_page_has_a_contents_table_and_folded_trees(tmp_path: Path) -> None:
    log = RolloutLog(tmp_path, {"t1": TASK}, credit=OPTIONS)
    trees = [branching_tree()[0] for _ in range(3)]
    for i, tree in enumerate(trees):
        tree.tree_id = f"t1@{i}"
    log.write(1, trees, [torch.zeros(len(t.token_ids)) for tree in trees for t in tree.trajectories.values()])
    html = (render_run(tmp_path).parent / "step-000001.html").read_text()
    toc = re.findall(r'<tr class="toc"><td class="l"><a href="#(tree-\d+)">', html)
    assert toc == ["tree-0", "tree-1", "tree-2"]
    assert re.findall(r'<details class="rollout-tree" id="(tree-\d+)">', html) == toc  # folded until opened
    assert html.count('<tr class="toc">') == 3 and "<td>4</td><td>2</td><td>1</td><td>1</td>" in html


def test_index_lists_the_credit_and_predictor_metrics(tmp_path: Path) -> None:
    write_run(tmp_path, steps=1)
    (tmp_path / "metrics.jsonl").write_text(json.dumps(
        {"step": 1, "reward_mean": 0.5, "readiness_gain_mean": 1.5, "predictor_brier": 0.125,
         "predictor_auc": 0.75, "kl": 0.01}) + "\n")
    html = render_run(tmp_path).read_text()
    assert "<th>predictor_<wbr>brier</th>" in html  # long metric names break at underscores, not the page
    heads = re.findall(r"<th>([^<]*)</th>", html.replace("<wbr>", ""))
    assert heads[-3:] == ["readiness_gain_mean", "predictor_auc", "predictor_brier"]
    assert "<td>1.5000</td><td>0.7500</td><td>0.1250</td>" in html


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


def _content_bottom(shot: Path) -> int:
    """The lowest pixel row holding anything darker than the page background (#fafafa)."""
    from PIL import Image

    image = Image.open(shot).convert("L")
    px = image.load()
    width, height = image.size
    return max((y for y in range(height) if any(px[x, y] < 240 for x in range(0, width, 2))), default=0)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_chromium_a_step_of_many_trees_is_one_screen_until_a_tree_is_opened(tmp_path: Path) -> None:
    trees = [wide_tree(i) for i in range(8)]
    RolloutLog(tmp_path, {"t1": TASK}).write(1, [t for t, _ in trees],
                                             [torch.zeros(len(x.token_ids)) for _, trajs in trees for x in trajs])
    page = render_run(tmp_path).parent / "step-000001.html"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1000,12000", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert 300 < _content_bottom(shot) < 1500  # the trees unfolded: 7,161 px
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri() + "#tree-3"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    opened = re.findall(r'<details class="rollout-tree" id="(tree-\d+)" open="">', dom)
    assert opened == ["tree-3"] and dom.count('class="node"') == 8 * 8  # a link to a tree opens it
