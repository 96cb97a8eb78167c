"""HTML of ``tracerl view``: pure functions from typed rollout records (view/records.py) to markup.

Pages are self-contained (inline CSS and a few lines of inline JS, no CDN, no network) and
rendered on the server side, so the tree is in the HTML itself: a browser without JS, a test
with ``html.parser`` and headless Chromium all see the same nodes. Every value reaches the
markup through :func:`_fmt` or ``escape`` (records are validated too: ints are ints), so a
crafted record cannot inject script. A step page opens with a table of contents, one row per
tree; the trees below are folded (``<details>``), so a step of many trees stays one screen tall
until a tree is opened.
"""

from __future__ import annotations

from collections import Counter
from html import escape
from typing import Any, NamedTuple

from tracerl.view.records import NodeView, TrajectoryView, TreeView

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em}details.rollout-tree{margin-top:1em;border-top:1px solid #ccc;padding-top:.5em}
details.rollout-tree>summary{font-size:1.15em;font-weight:600;cursor:pointer}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
th{background:#eee}td.l{text-align:left;white-space:nowrap}
table.index th{font-size:.72em;width:1px;padding:2px 4px}table.index td{font-size:.85em;padding:2px 4px}
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
function openTarget(){var t=location.hash&&document.getElementById(location.hash.slice(1));
 if(t&&t.tagName==='DETAILS'){t.open=true;t.scrollIntoView();}}
window.addEventListener('hashchange',openTarget);openTarget();
document.querySelectorAll('button.all').forEach(function(b){b.addEventListener('click',function(){
 var open=b.dataset.open==='1';
 document.querySelectorAll('details.rollout-tree').forEach(function(d){d.open=open;});});});
"""


def _fmt(value: Any, digits: int = 3) -> str:
    """A value as escaped text: floats to ``digits`` places, None as a dash."""
    if value is None:
        return "\u2013"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return escape(str(value))


def page(title: str, body: str) -> str:
    """A whole self-contained HTML document."""
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n{body}\n<script>{JS}</script></body></html>\n")


def node_card(node: NodeView, branching: bool = False) -> str:
    """One node: action kind, turn text, observation preview, readiness, predictor value, reward."""
    classes = ["card"] + (["branch"] if branching else [])
    if node.is_leaf:
        classes += ["leaf", "win" if (node.reward or 0) > 0.5 else "loss"]
    stats = [f'<span class="stat">visits {_fmt(node.visits)}</span>']
    if node.readiness is not None:
        stats.append(f'<span class="stat readiness">l={_fmt(node.readiness)}</span>')
    if node.predictor is not None:
        stats.append(f'<span class="stat predictor">V={_fmt(node.predictor)}</span>')
    if node.value_target is not None:
        stats.append(f'<span class="stat">V\u0302={_fmt(node.value_target)}</span>')
    if node.is_leaf:
        stats.append(f'<span class="reward">reward {_fmt(node.reward)}</span>')
    head = (f'<span class="kind">#{_fmt(node.id)} {escape(node.action)}</span>'
            f'<span class="stat">{_fmt(node.assistant_tokens)} tok</span>' + "".join(stats))
    parts = [f'<div class="{" ".join(classes)}" data-node="{_fmt(node.id)}">{head}']
    if node.text:
        parts.append(f'<div class="text">{escape(node.text)}</div>')
    if node.observation:
        parts.append(f'<div class="obs">\u21b3 {escape(node.observation)}</div>')
    parts.append("</div>")
    return "".join(parts)


def _children(nodes: tuple[NodeView, ...]) -> dict[int | None, list[int]]:
    children: dict[int | None, list[int]] = {}
    for n in nodes:
        children.setdefault(n.parent, []).append(n.id)
    return children


def tree_list(nodes: tuple[NodeView, ...]) -> str:
    """The tree as nested ``<ul>`` (iterative: deep chains never hit the recursion limit)."""
    children = _children(nodes)
    by_id = {n.id: n for n in nodes}
    out: list[str] = ['<ul class="tree">']
    stack: list[tuple[int, bool]] = [(r, False) for r in reversed(children.get(None, []))]
    while stack:
        nid, closing = stack.pop()
        if closing:
            out.append("</ul></li>" if children.get(nid) else "</li>")
            continue
        kids = children.get(nid, [])
        fold = '<button class="fold">fold</button>' if kids else ""
        out.append(f'<li class="node">{node_card(by_id[nid], len(kids) > 1)}{fold}' + ("<ul>" if kids else ""))
        stack.append((nid, True))
        stack.extend((k, False) for k in reversed(kids))
    out.append("</ul>")
    return "".join(out)


class TurnRow(NamedTuple):
    """One turn of a trajectory: its action; for transition ``k`` (``S_k -> S_{k+1}``), ``k``, the
    readiness ``l_{k+1}`` and value ``V_{k+1}`` after it and its credit ``c_k``; its token advantage."""

    action: str
    transition: int | None
    readiness: float | None
    value: float | None
    credit: float | None
    advantage: float | None


def _at(values: tuple[float | None, ...] | None, i: int) -> float | None:
    return values[i] if values is not None and 0 <= i < len(values) else None


def turn_rows(traj: TrajectoryView, by_id: dict[int, NodeView]) -> list[TurnRow]:
    """Per turn: action and, for a transition turn ``k``, ``l_{k+1}`` and ``V_{k+1}`` at the boundary it
    reaches and its credit ``c_k``; then the mean advantage of its sampled tokens.

    Only transition turns (those ending in an observation) reach a new boundary; the answer turn
    has no ``l``, ``V`` or ``c`` of its own (spec section 2: readiness is scored at boundaries,
    credit is per transition, and ``trace_credit`` puts ``c_k`` on transition ``k``'s tokens).
    """
    rows, k = [], 0
    for i, nid in enumerate(traj.node_path[1:]):
        kind = by_id[nid].action if nid in by_id else "?"
        if kind == "answer":
            rows.append(TurnRow(kind, None, None, None, None, _at(traj.turn_advantage, i)))
            continue
        rows.append(TurnRow(kind, k, _at(traj.readiness, k + 1), _at(traj.values, k + 1), _at(traj.credit, k),
                            _at(traj.turn_advantage, i)))
        k += 1
    return rows


TABLE_HEAD = ("<tr><th>leaf</th><th>reward</th><th>answer</th><th>l<sub>0</sub></th>"
              "<th>A<sub>out</sub> outcome advantage</th><th>turn</th><th>action</th><th>k</th>"
              "<th>l<sub>k+1</sub> readiness after</th><th>V<sub>k+1</sub> value after</th>"
              "<th>c<sub>k</sub> credit</th><th>token advantage</th></tr>")


def trajectory_table(tree: TreeView) -> str:
    """One table per tree: each trajectory's reward, ``l_0``, ``A_out``, and per turn ``l_{k+1}``,
    ``V_{k+1}``, ``c_k`` and the token advantage, each in its own column."""
    by_id = {n.id: n for n in tree.nodes}
    body = []
    for traj in tree.trajectories:
        rows = turn_rows(traj, by_id) or [TurnRow("\u2013", None, None, None, None, None)]
        flag = ' <span class="muted">(infra failure)</span>' if traj.infra_failed else ""
        span = f' rowspan="{len(rows)}"'
        for i, row in enumerate(rows):
            lead = (f'<td{span}>{_fmt(traj.leaf)}</td><td{span} class="reward">{_fmt(traj.reward)}{flag}</td>'
                    f'<td{span} class="l">{_fmt(traj.answer)}</td><td{span}>{_fmt(_at(traj.readiness, 0))}</td>'
                    f'<td class="outcome"{span}>{_fmt(traj.outcome_advantage)}</td>' if i == 0 else "")
            body.append(f'<tr class="turn">{lead}<td>{i + 1}</td><td class="l">{escape(row.action)}</td>'
                        f'<td class="k">{_fmt(row.transition)}</td>'
                        f'<td class="readiness">{_fmt(row.readiness)}</td><td class="value">{_fmt(row.value)}</td>'
                        f'<td class="credit">{_fmt(row.credit)}</td>'
                        f'<td class="advantage">{_fmt(row.advantage)}</td></tr>')
    return f'<table class="trajectories">{TABLE_HEAD}{"".join(body)}</table>'


def _prompt(text: str) -> str:
    """The prompt the policy saw, folded (records written before prompts were logged have none)."""
    return f'<details class="prompt"><summary>prompt</summary><pre>{escape(text)}</pre></details>' if text else ""


class TreeSummary(NamedTuple):
    nodes: int
    leaves: int
    wins: int
    branching: int


def summarize(tree: TreeView) -> TreeSummary:
    """Counts of one tree (branching: nodes with more than one child), linear in its size."""
    leaves = [n for n in tree.nodes if n.is_leaf]
    kids = Counter(n.parent for n in tree.nodes if n.parent is not None)
    return TreeSummary(len(tree.nodes), len(leaves), sum((n.reward or 0) > 0.5 for n in leaves),
                       sum(1 for count in kids.values() if count > 1))


def tree_section(index: int, tree: TreeView) -> str:
    """A tree, folded: question, gold answers, summary, the node tree and the trajectory table."""
    s = summarize(tree)
    return (f'<details class="rollout-tree" id="tree-{index}"><summary>Tree {index + 1}: '
            f'{escape(tree.task_id)}</summary>'
            f'<p><b>Q:</b> {escape(tree.question)} &nbsp; <b>gold:</b> {escape(" | ".join(tree.answers))}</p>'
            f'{_prompt(tree.prompt)}'
            f'<p class="summary">{s.nodes} nodes, {s.leaves} leaves ({s.wins} rewarded), '
            f'{s.branching} branching nodes</p>'
            f"{tree_list(tree.nodes)}{trajectory_table(tree)}</details>")


def _cut(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def contents(trees: list[TreeView]) -> str:
    """The table of contents of a step page: one row per tree, linking to its folded section."""
    head = ("<tr><th>tree</th><th>task</th><th>question</th><th>nodes</th><th>leaves</th>"
            "<th>rewarded</th><th>branching</th></tr>")
    rows = []
    for i, tree in enumerate(trees):
        s = summarize(tree)
        rows.append(f'<tr class="toc"><td class="l"><a href="#tree-{i}">tree {i + 1}</a></td>'
                    f'<td class="l">{escape(tree.task_id)}</td><td class="l">{escape(_cut(tree.question))}</td>'
                    f"<td>{s.nodes}</td><td>{s.leaves}</td><td>{s.wins}</td><td>{s.branching}</td></tr>")
    buttons = ('<button class="all" data-open="1">open all trees</button> '
               '<button class="all" data-open="0">fold all trees</button>')
    return f'<table class="contents">{head}{"".join(rows)}</table><p>{buttons}</p>'


def metrics_table(record: dict[str, Any] | None, keys: tuple[str, ...]) -> str:
    if not record:
        return '<p class="muted">no metrics line for this step</p>'
    cells = "".join(f"<tr><th>{escape(k)}</th><td>{_fmt(record[k], 4)}</td></tr>" for k in keys if k in record)
    return f'<table class="metrics">{cells}</table>'


STEP_KEYS = ("reward_mean", "accuracy", "loss", "kl", "grad_norm", "effective_ratio", "eval_accuracy",
             "readiness_gain_mean", "rollouts", "generated_tokens", "step_seconds")


def _credit_legend(trees: list[TreeView]) -> str:
    """What ``V_k`` and ``c_k`` are, with the options they were computed with (spec section 2)."""
    options = next((t.credit_options for t in trees if t.credit_options is not None), None)
    if options is None:
        return ("V<sub>k</sub>, c<sub>k</sub>, A<sub>out</sub>: not recorded (credit off, "
                "<code>algo.credit: false</code>, or records written before they were kept)")
    forms = {"log_ratio": "log(d<sub>0</sub>/d<sub>k</sub>)", "raw_diff": "l<sub>k</sub> - l<sub>0</sub>",
             "remaining_gap": "(d<sub>0</sub> - d<sub>k</sub>)/d<sub>0</sub>"}
    form = forms.get(options.value, escape(options.value))
    return (f"V<sub>k</sub> = {form} with d<sub>k</sub> = -l<sub>k</sub> + {_fmt(options.eps, 3)} "
            f"(value form <code>{escape(options.value)}</code>); c<sub>k</sub>: TRACE turn credit of "
            f"transition k, the normalised discounted window of V<sub>j+1</sub> - V<sub>j</sub> from j = k "
            f"(K = {_fmt(options.horizon)}, g = {_fmt(options.gamma, 2)}) plus the terminal fill "
            f"&kappa; g<sup>T-k</sup> A<sub>out</sub> (&kappa; = {_fmt(options.terminal_scale, 2)}); "
            f"A<sub>out</sub>: the leaf's group GRPO advantage. The trace_credit estimator puts "
            f"{_fmt(options.w_out, 2)} &times; outcome advantage + {_fmt(options.w_turn, 2)} &times; "
            "c<sub>k</sub> on a transition turn's tokens")


def _legend(trees: list[TreeView]) -> str:
    return ('<p class="muted legend">Node cards: l: reference readiness of the prefix (mean log-prob of the '
            "gold answer); V: the success predictor's P(success) before this step's predictor update; "
            "V\u0302: mean reward of the leaves below; orange outline: a branching node. Tables: "
            "each turn but the answer is a transition k (S<sub>k</sub> &rarr; S<sub>k+1</sub>), scored "
            f"after it (l<sub>k+1</sub>, V<sub>k+1</sub>); {_credit_legend(trees)}; token "
            "advantage: the estimator's value on the turn's sampled tokens (their mean).</p>")


def step_page(run_name: str, step: int, trees: list[TreeView], record: dict[str, Any] | None,
              prev_next: tuple[int | None, int | None]) -> str:
    """The page of one step: metrics, a table of contents, then every rollout tree, folded."""
    nav = ['<a href="index.html">index</a>']
    if prev_next[0] is not None:
        nav.append(f'<a href="step-{prev_next[0]:06d}.html">&larr; step {prev_next[0]}</a>')
    if prev_next[1] is not None:
        nav.append(f'<a href="step-{prev_next[1]:06d}.html">step {prev_next[1]} &rarr;</a>')
    keys = STEP_KEYS + tuple(k for k in index_keys([record] if record else []) if k not in STEP_KEYS + INDEX_KEYS)
    body = (f"<h1>{escape(run_name)} &mdash; step {step}</h1><nav>{' | '.join(nav)}</nav>"
            f"{metrics_table(record, keys)}<p>{len(trees)} rollout trees</p>{contents(trees)}"
            f"{_legend(trees)}" + "".join(tree_section(i, t) for i, t in enumerate(trees)))
    return page(f"{run_name} step {step}", body)


INDEX_KEYS = ("reward_mean", "loss", "eval_accuracy", "effective_ratio", "rollouts", "generated_tokens")
INDEX_FAMILIES = ("readiness_", "credit_", "predictor_")
"""Prefixes of the credit and predictor metrics the index lists beside :data:`INDEX_KEYS`."""


def index_keys(records: list[dict[str, Any]]) -> tuple[str, ...]:
    """:data:`INDEX_KEYS`, then every credit and predictor metric present in the run (family order)."""
    present = {k for r in records for k in r}
    found = [k for family in INDEX_FAMILIES for k in sorted(present) if k.startswith(family)]
    return INDEX_KEYS + tuple(k for k in found if k not in INDEX_KEYS)


def index_page(run_name: str, records: list[dict[str, Any]], pages: dict[int, str]) -> str:
    """Every step of the run with its metrics (credit and predictor ones too); steps with a page link to it.

    ``records`` are metrics lines whose ``step`` is an int (view/site.py checks that)."""
    steps = sorted({int(r["step"]) for r in records} | set(pages))
    by_step = {int(r["step"]): r for r in records}
    keys = index_keys(records)
    # metric names break after their underscores, so many columns fit the window without scrolling
    head = "<tr><th>step</th>" + "".join(f"<th>{escape(k).replace('_', '_<wbr>')}</th>" for k in keys) + "</tr>"
    rows = []
    for step in steps:
        record = by_step.get(step, {})
        label = f'<a href="{escape(pages[step])}">step {step}</a>' if step in pages else f"step {step}"
        rows.append(f'<tr class="step"><td class="l">{label}</td>'
                    + "".join(f"<td>{_fmt(record.get(k), 4)}</td>" for k in keys) + "</tr>")
    body = (f"<h1>{escape(run_name)}</h1><p>{len(pages)} step pages, {len(records)} metrics lines</p>"
            f'<table class="index">{head}{"".join(rows)}</table>')
    return page(f"{run_name} rollouts", body)
