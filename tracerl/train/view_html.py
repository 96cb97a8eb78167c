"""HTML of ``tracerl view``: pure functions from rollout records (train/rollout_log.py) to markup.

Pages are self-contained (inline CSS and a few lines of inline JS, no CDN, no network) and
rendered on the server side, so the tree is in the HTML itself: a browser without JS, a test
with ``html.parser`` and headless Chromium all see the same nodes.
"""

from __future__ import annotations

from html import escape
from typing import Any

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em;border-top:1px solid #ccc;padding-top:.8em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
th{background:#eee}td.l{text-align:left}
ul.tree,ul.tree ul{list-style:none;margin:0;padding-left:1.4em;border-left:1px dashed #bbb}
ul.tree{border-left:none;padding-left:0}
li.node{margin:.35em 0}
.card{display:inline-block;max-width:60em;border:1px solid #bbb;border-radius:6px;padding:3px 8px;background:#fff}
.card.leaf.win{border-color:#2a8a2a;background:#eefbee}.card.leaf.loss{border-color:#b33;background:#fdf0f0}
.card.branch{box-shadow:0 0 0 2px #f0c36d}
.kind{font-weight:600;margin-right:.5em}.stat{color:#555;margin-right:.8em;font-size:.9em}
.reward{font-weight:700}.text{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.85em}
.obs{white-space:pre-wrap;color:#236;font-family:ui-monospace,monospace;font-size:.8em}
.muted{color:#888}button.fold{font-size:.75em;margin-left:.4em}
.hidden{display:none}
"""

JS = """
document.querySelectorAll('button.fold').forEach(function(b){b.addEventListener('click',function(){
 var ul=b.closest('li').querySelector(':scope>ul');if(ul){ul.classList.toggle('hidden');
 b.textContent=ul.classList.contains('hidden')?'expand':'fold';}});});
"""


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "\u2013"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return escape(str(value))


def page(title: str, body: str) -> str:
    """A whole self-contained HTML document."""
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n{body}\n<script>{JS}</script></body></html>\n")


def node_card(node: dict[str, Any]) -> str:
    """One node: action kind, turn text, observation preview, readiness, predictor value, reward."""
    classes = ["card"]
    if node["is_leaf"]:
        classes += ["leaf", "win" if (node.get("reward") or 0) > 0.5 else "loss"]
    stats = [f'<span class="stat">visits {node.get("visits", 0)}</span>']
    if node.get("readiness") is not None:
        stats.append(f'<span class="stat readiness">l={_fmt(node["readiness"])}</span>')
    if node.get("predictor") is not None:
        stats.append(f'<span class="stat predictor">V={_fmt(node["predictor"])}</span>')
    if node.get("value_target") is not None:
        stats.append(f'<span class="stat">V\u0302={_fmt(node["value_target"])}</span>')
    if node["is_leaf"]:
        stats.append(f'<span class="reward">reward {_fmt(node.get("reward"))}</span>')
    head = (f'<span class="kind">#{node["id"]} {escape(node["action"])}</span>'
            f'<span class="stat">{node.get("assistant_tokens", 0)} tok</span>' + "".join(stats))
    parts = [f'<div class="{" ".join(classes)}" data-node="{node["id"]}">{head}']
    if node.get("text"):
        parts.append(f'<div class="text">{escape(node["text"])}</div>')
    if node.get("observation"):
        parts.append(f'<div class="obs">\u21b3 {escape(node["observation"])}</div>')
    parts.append("</div>")
    return "".join(parts)


def tree_list(nodes: list[dict[str, Any]]) -> str:
    """The tree as nested ``<ul>`` (iterative: deep chains never hit the recursion limit)."""
    children: dict[int | None, list[int]] = {}
    for n in nodes:
        children.setdefault(n["parent"], []).append(n["id"])
    by_id = {n["id"]: n for n in nodes}
    out: list[str] = ['<ul class="tree">']
    stack: list[tuple[int, bool]] = [(r, False) for r in reversed(children.get(None, []))]
    while stack:
        nid, closing = stack.pop()
        if closing:
            out.append("</ul></li>" if children.get(nid) else "</li>")
            continue
        kids = children.get(nid, [])
        card = node_card(by_id[nid])
        if len(kids) > 1:
            card = card.replace('class="card', 'class="card branch', 1)
        fold = '<button class="fold">fold</button>' if kids else ""
        out.append(f'<li class="node">{card}{fold}' + ("<ul>" if kids else ""))
        stack.append((nid, True))
        stack.extend((k, False) for k in reversed(kids))
    out.append("</ul>")
    return "".join(out)


def turn_rows(traj: dict[str, Any], by_id: dict[int, dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """Per turn: action, readiness ``l_k`` after it, credit ``l_k - l_{k-1}``, advantage.

    Only transition turns (those ending in an observation) reach a new boundary ``S_k``; the
    answer turn has no ``l`` of its own (spec section 2: readiness is scored at boundaries).
    """
    readiness = traj.get("readiness")
    advantage = traj.get("turn_advantage") or []
    rows, k = [], 0
    for i, nid in enumerate(traj["node_path"][1:]):
        kind = by_id[nid]["action"] if nid in by_id else "?"
        level = credit = None
        if kind != "answer" and readiness is not None and k + 1 < len(readiness):
            k += 1
            level, credit = readiness[k], (None if readiness[k] is None or readiness[k - 1] is None
                                           else readiness[k] - readiness[k - 1])
        adv = advantage[i] if i < len(advantage) else None
        rows.append((escape(kind), _fmt(level), _fmt(credit), _fmt(adv)))
    return rows


def trajectory_table(tree: dict[str, Any]) -> str:
    """One table per tree: each trajectory's reward, ``l_0`` and its turns' readiness, credit, advantage."""
    by_id = {n["id"]: n for n in tree["nodes"]}
    head = ("<tr><th>leaf</th><th>reward</th><th>answer</th><th>l<sub>0</sub></th><th>turn</th><th>action</th>"
            "<th>l<sub>k</sub></th><th>credit \u0394l</th><th>advantage</th></tr>")
    body = []
    for traj in tree["trajectories"]:
        rows = turn_rows(traj, by_id) or [("\u2013", "\u2013", "\u2013", "\u2013")]
        l0 = traj["readiness"][0] if traj.get("readiness") else None
        flag = ' <span class="muted">(infra failure)</span>' if traj.get("infra_failed") else ""
        for i, (kind, level, credit, adv) in enumerate(rows):
            lead = (f'<td rowspan="{len(rows)}">{traj["leaf"]}</td><td rowspan="{len(rows)}" class="reward">'
                    f'{_fmt(traj.get("reward"))}{flag}</td><td rowspan="{len(rows)}" class="l">'
                    f'{escape(str(traj.get("answer")))}</td><td rowspan="{len(rows)}">{_fmt(l0)}</td>'
                    if i == 0 else "")
            body.append(f'<tr class="turn">{lead}<td>{i + 1}</td><td class="l">{kind}</td><td>{level}</td>'
                        f"<td>{credit}</td><td>{adv}</td></tr>")
    return f'<table class="trajectories">{head}{"".join(body)}</table>'


def _prompt(text: str) -> str:
    """The prompt the policy saw, folded (records written before prompts were logged have none)."""
    return f'<details class="prompt"><summary>prompt</summary><pre>{escape(text)}</pre></details>' if text else ""


def tree_section(index: int, tree: dict[str, Any]) -> str:
    """A tree: question, gold answers, summary, the node tree and the trajectory table."""
    leaves = [n for n in tree["nodes"] if n["is_leaf"]]
    wins = sum((n.get("reward") or 0) > 0.5 for n in leaves)
    branches = sum(1 for n in tree["nodes"] if sum(m["parent"] == n["id"] for m in tree["nodes"]) > 1)
    return (f'<section class="rollout-tree" id="tree-{index}"><h2>Tree {index + 1}: {escape(tree["task_id"])}</h2>'
            f'<p><b>Q:</b> {escape(tree.get("question", ""))} &nbsp; <b>gold:</b> '
            f'{escape(" | ".join(tree.get("answers", [])))}</p>'
            f'{_prompt(tree.get("prompt", ""))}'
            f'<p class="summary">{len(tree["nodes"])} nodes, {len(leaves)} leaves ({wins} rewarded), '
            f'{branches} branching nodes</p>'
            f"{tree_list(tree['nodes'])}{trajectory_table(tree)}</section>")


def metrics_table(record: dict[str, Any] | None, keys: tuple[str, ...]) -> str:
    if not record:
        return '<p class="muted">no metrics line for this step</p>'
    cells = "".join(f"<tr><th>{escape(k)}</th><td>{_fmt(record[k], 4)}</td></tr>" for k in keys if k in record)
    return f'<table class="metrics">{cells}</table>'


STEP_KEYS = ("reward_mean", "accuracy", "loss", "kl", "grad_norm", "effective_ratio", "eval_accuracy",
             "readiness_gain_mean", "rollouts", "generated_tokens", "step_seconds")


def step_page(run_name: str, step: int, trees: list[dict[str, Any]], record: dict[str, Any] | None,
              prev_next: tuple[int | None, int | None]) -> str:
    """The page of one step: metrics, then every rollout tree of the step."""
    nav = ['<a href="index.html">index</a>']
    if prev_next[0] is not None:
        nav.append(f'<a href="step-{prev_next[0]:06d}.html">&larr; step {prev_next[0]}</a>')
    if prev_next[1] is not None:
        nav.append(f'<a href="step-{prev_next[1]:06d}.html">step {prev_next[1]} &rarr;</a>')
    legend = ('<p class="muted">l: reference readiness of the prefix (log-prob of the gold answer); '
              'V: the success predictor\'s P(success) before this step\'s predictor update; '
              'V\u0302: mean reward of the leaves below; credit \u0394l = l<sub>k</sub> - l<sub>k-1</sub>; '
              'advantage: the estimator\'s value on the turn\'s tokens. Orange outline: a branching node.</p>')
    body = (f"<h1>{escape(run_name)} &mdash; step {step}</h1><nav>{' | '.join(nav)}</nav>"
            f"{metrics_table(record, STEP_KEYS)}{legend}<p>{len(trees)} rollout trees</p>"
            + "".join(tree_section(i, t) for i, t in enumerate(trees)))
    return page(f"{run_name} step {step}", body)


INDEX_KEYS = ("reward_mean", "loss", "eval_accuracy", "effective_ratio", "rollouts", "generated_tokens")


def index_page(run_name: str, records: list[dict[str, Any]], pages: dict[int, str]) -> str:
    """Every step of the run with its metrics; steps with a page link to it."""
    steps = sorted({int(r["step"]) for r in records} | set(pages))
    by_step = {int(r["step"]): r for r in records}
    head = "<tr><th>step</th>" + "".join(f"<th>{k}</th>" for k in INDEX_KEYS) + "</tr>"
    rows = []
    for step in steps:
        record = by_step.get(step, {})
        label = f'<a href="{pages[step]}">step {step}</a>' if step in pages else f"step {step}"
        rows.append(f'<tr class="step"><td class="l">{label}</td>'
                    + "".join(f"<td>{_fmt(record.get(k), 4)}</td>" for k in INDEX_KEYS) + "</tr>")
    body = (f"<h1>{escape(run_name)}</h1><p>{len(pages)} step pages, {len(records)} metrics lines</p>"
            f'<table class="index">{head}{"".join(rows)}</table>')
    return page(f"{run_name} rollouts", body)
