"""The verl-free half of the verl bridge, in the default suite: nothing imports verl, and the
rows round-trip keeps tracerl's advantages exact on a hand-built tree."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tracerl.core.advantages import AdvantageBatch, AdvantageOptions, get_estimator
from tracerl.core.types import Action, RolloutTree, Trajectory, Turn
from tracerl.integrations.verl.rows import batch_from_fields, pad_rows, rows_from_trees


def test_default_imports_never_load_verl() -> None:
    """tracerl, its CLI, its core and the bridge's rows module import without verl."""
    code = (
        "import sys, tracerl, tracerl.cli, tracerl.core.advantages, tracerl.integrations.verl.rows\n"
        "print(sorted(m for m in sys.modules if m == 'verl' or m.startswith('verl.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _turn(n_sampled: int, n_obs: int, kind: str = "tool") -> Turn:
    return Turn(list(range(10, 10 + n_sampled)), [7] * n_obs, "", Action(kind=kind))


def _tree() -> RolloutTree:
    """Root 0 -> turn node 1 (a branching anchor) -> answers 2 (reward 1) and 3 (reward 0)."""
    tree = RolloutTree(tree_id="t0", task_id="q0", prompt_ids=[1, 2, 3])
    first = tree.add_child(0, _turn(2, 3))
    for reward in (1.0, 0.0):
        leaf = tree.add_child(first, _turn(1, 0, "answer"))
        turns = [tree.nodes[first].turn, tree.nodes[leaf].turn]
        traj = Trajectory("q0", "t0", [1, 2, 3], turns, reward=reward, readiness=[-2.0, -0.5 - reward])
        tree.add_leaf(leaf, traj)
    return tree


def test_rows_hold_the_leaves_in_response_coordinates() -> None:
    rows = rows_from_trees([_tree()])
    # response = 2 sampled + 3 observation + 1 sampled; the reward on the last sampled token
    assert rows.response_mask.tolist() == [[1, 1, 0, 0, 0, 1]] * 2
    assert rows.token_level_rewards[:, 5].tolist() == [1.0, 0.0]
    assert list(rows.non_tensor["tracerl_turn_spans"][0]) == [[0, 2], [5, 6]]
    assert list(rows.non_tensor["tracerl_node_path"][1]) == [0, 1, 3]


@pytest.mark.parametrize("name", ["trace_credit", "tree_anchor"])
def test_rebuilt_batch_gives_the_same_advantages(name: str) -> None:
    """Hand check of tree_anchor: group advantages +1/-1 (population std 0.5), plus the same
    contrast under anchor node 1 on the answer turn: turn 0 gets +-1, the answer +-2."""
    tree = _tree()
    rows = rows_from_trees([tree])
    options = AdvantageOptions()
    estimator = get_estimator(name)
    want = estimator(AdvantageBatch(rows.trajectories, {"t0": tree}), options)
    want = pad_rows([a[len(t.prompt_ids):] for t, a in zip(rows.trajectories, want, strict=True)], 6)
    got = estimator(batch_from_fields(rows.non_tensor, rows.response_mask), options)
    assert torch.equal(pad_rows(got, 6), want)
    if name == "tree_anchor":
        assert want.tolist() == [[1, 1, 0, 0, 0, 2], [-1, -1, 0, 0, 0, -2]]


def test_bad_fields_name_the_row() -> None:
    rows = rows_from_trees([_tree()])
    mask = rows.response_mask.clone()
    mask[1, 3] = 1
    with pytest.raises(ValueError, match="row 1: response_mask differs"):
        batch_from_fields(rows.non_tensor, mask)
    fields = dict(rows.non_tensor)
    del fields["tracerl_readiness"]
    with pytest.raises(ValueError, match="no field 'tracerl_readiness'"):
        batch_from_fields(fields, rows.response_mask)


def test_verl_reference_rows_give_the_hf_readiness() -> None:
    """``VerlReference`` turns scoring jobs into (prefix + opener, answer) rows, each distinct row
    once; with per-token log-probs of those rows (here from the same HF model, as verl's reference
    worker returns them) it gives ``score_prefixes_batched``'s readiness."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from helpers_tiny import tiny_model

    from tracerl.errors import UserError
    from tracerl.integrations.verl.reference import VerlReference
    from tracerl.models.batched_scoring import score_prefixes_batched
    from tracerl.models.scoring_plan import ScoreRequest

    model = tiny_model(50, seed=3).eval()
    calls = []

    def compute(rows):
        calls.append(len(rows))
        out = []
        for prompt, response in rows:
            ids = torch.tensor([list(prompt) + list(response)])
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits.float(), -1)[0]
            out.append(torch.stack([logp[len(prompt) - 1 + j, tok] for j, tok in enumerate(response)]))
        return out

    jobs = [ScoreRequest((5, 6, 7, 8, 9), (2, 5), (11, 12), (4,)), ScoreRequest((5, 6, 7), (2,), (11, 12), (4,))]
    reference = VerlReference()
    with pytest.raises(UserError, match="tracerl_sync trainer hands over"):
        reference(None, jobs)
    reference.compute, reference.check = compute, model
    got = reference(None, jobs)
    want = score_prefixes_batched(model, jobs)
    assert calls == [2]  # (5, 6, 4 | 11, 12) is asked twice, sent once
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert reference.max_gap < 1e-5 and reference.rows == 2
