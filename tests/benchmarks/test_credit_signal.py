"""credit_signal's measurements on hand-built episodes: AUC, useful searches, the two advantage terms."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from tracerl.core.advantages import AdvantageOptions
from tracerl.core.types import Action, Task, Trajectory, Turn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "science"))
import credit_signal as sig  # noqa: E402


def _search(observation: str, kind: str = "tool") -> Turn:
    return Turn(assistant_ids=[5, 6], observation_ids=[7], text="", observation=observation,
                action=Action(kind=kind, name="search" if kind == "tool" else "", arguments={"query": "q"}))


def _answer() -> Turn:
    return Turn(assistant_ids=[8], observation_ids=[], text="", action=Action(kind="answer", answer="x"))


def test_auc_counts_ties_as_half_and_needs_both_kinds() -> None:
    # pairs (pos, neg): (3,1) (3,2) (2,1) win, (2,2) ties, (1,1) tie, (1,2) loses -> (3 + 0.5 + 0.5) / 6
    assert sig.auc([3.0, 2.0, 1.0], [1.0, 2.0]) == pytest.approx((3 + 0.5 * 2) / 6)
    assert sig.auc([1.0], []) is None and sig.auc([], [1.0]) is None


def test_useful_transitions_need_a_new_supporting_document() -> None:
    traj = Trajectory(task_id="t", group_id="t", prompt_ids=[1], turns=[
        _search("Ann: works at Bo\nCid: lives in Dee"),  # brings Ann, a supporting title
        _search("Ann: works at Bo"),                      # Ann again: nothing new
        _search("Eve: born in Fay"),                      # no supporting title
        _search("Bo: founded by Gil", kind="invalid"),    # an invalid action is never useful
        _search("Bo: founded by Gil"),                    # Bo, new (the invalid turn does not count as seen)
        _answer()])
    assert sig.useful_transitions(traj, ("Ann", "Bo")) == [True, False, False, False, True]


def test_measure_on_one_mixed_group_by_hand() -> None:
    options = AdvantageOptions()  # K 3, g 0.8, kappa 2, w_out 1, w_turn 0.2, eps 0.1
    task = Task(id="t", question="q", answers=("x",), supporting_titles=("Ann",))
    win = Trajectory(task_id="t", group_id="t", prompt_ids=[1], reward=1.0, readiness=[-2.9, -0.9, -0.9],
                     turns=[_search("Ann: a"), _search("Ann: a"), _answer()])
    lose = Trajectory(task_id="t", group_id="t", prompt_ids=[1], reward=0.0, readiness=[-2.9, -2.9],
                      turns=[_search("Eve: e"), _answer()])
    out = sig.measure([win, lose], {"t": task}, [1.0, -1.0], options, "log_ratio")
    # win: d = 3, 1, 1 -> V = 0, ln 3, ln 3; deltas ln 3 (useful), 0 (Ann again). lose: delta 0 (no Ann).
    assert out["useful_vs_not"]["delta_mean_useful"] == pytest.approx(math.log(3))
    assert out["useful_vs_not"]["delta_mean_other"] == pytest.approx(0.0)
    assert out["useful_vs_not"]["auc"] == pytest.approx(1.0)
    assert out["final_value_auc"]["auc"] == pytest.approx(1.0)
    # turn credit of win (T = 2): c0 = (ln 3 + 0.8 * 0) / 1.8 + 2 * 0.8^2 * 1, c1 = 0 + 2 * 0.8 * 1;
    # of lose (T = 1): c0 = 0 + 2 * 0.8 * (-1)
    turn = [0.2 * (math.log(3) / 1.8 + 1.28), 0.2 * 1.6, 0.2 * -1.6]
    mixed = out["advantage_mixed_groups"]
    assert mixed["transitions"] == 3 and mixed["outcome_term_mean"] == pytest.approx(1 / 3)
    assert mixed["turn_term_mean"] == pytest.approx(sum(turn) / 3)
    assert mixed["turn_term_abs_mean"] == pytest.approx(sum(map(abs, turn)) / 3)
    assert mixed["sign_flip_share_success"] == 0.0 and mixed["sign_flip_share_failure"] == 0.0
    assert out["advantage_all_same_groups"]["transitions"] == 0
    # the same episodes in an all-same group (A_out = 0): only the dense part is left
    same = sig.measure([win], {"t": task}, [0.0], options, "log_ratio")["advantage_all_same_groups"]
    assert same["transitions"] == 2 and same["share_of_transitions"] == 1.0
    assert same["turn_term_mean"] == pytest.approx(0.2 * math.log(3) / 1.8 / 2)
    assert same["turn_term_positive_share"] == 0.5
    # raw_diff: deltas in log-prob units (2.0 on the useful search), large enough to flip a failure's sign
    flip = Trajectory(task_id="t", group_id="t", prompt_ids=[1], reward=0.0, readiness=[-12.0, -0.5],
                      turns=[_search("Ann: a"), _answer()])
    raw = sig.measure([flip], {"t": task}, [-0.5], options, "raw_diff")
    assert raw["useful_vs_not"]["delta_mean_useful"] == pytest.approx(11.5)
    # turn term 0.2 * (11.5 + 2 * 0.8 * -0.5) = 2.14 > 0.5: the total turns positive
    assert raw["advantage_mixed_groups"]["sign_flip_share_failure"] == 1.0
