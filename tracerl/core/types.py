"""Typed data that flows rollout -> scoring -> credit -> loss.

One trajectory type (:class:`Trajectory`) is produced by the rollout engine, scored by the
frozen reference, turned into per-token advantages by an estimator and consumed by the loss.
Rollout trees (:class:`RolloutTree`) hold every prefix as a node so allocators can branch
from any boundary and tree-aware estimators can find the nearest branching anchor.

Token layout of a trajectory (spec section 1): ``prompt_ids`` followed, for each turn, by the
turn's ``assistant_ids`` (sampled by the policy) and ``observation_ids`` (forced, never
trained on). ``S_0`` ends at ``len(prompt_ids)``; ``S_k`` ends after the k-th observation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ActionKind = Literal["tool", "answer", "invalid"]


@dataclass(frozen=True)
class Task:
    """A question with gold answers (the first alias is the scoring target ``y*``)."""

    id: str
    question: str
    answers: tuple[str, ...]
    supporting_titles: tuple[str, ...] = ()
    hops: int | None = None
    supporting_ids: tuple[str, ...] = ()
    """Corpus ids of the gold paragraphs, where the source marks them (titles may repeat)."""

    def __post_init__(self) -> None:
        if not self.answers:
            raise ValueError(f"task {self.id!r}: 'answers' must hold at least one alias")

    @property
    def gold(self) -> str:
        """The scoring target y* (spec section 1: the first alias)."""
        return self.answers[0]


@dataclass(frozen=True)
class Action:
    """A parsed assistant action: a tool call, a final answer, or why the output was invalid."""

    kind: ActionKind
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    answer: str = ""
    error: str = ""


@dataclass
class Turn:
    """One thought-action-observation step.

    ``assistant_ids`` were sampled (with their sampling-time ``logprobs``);
    ``observation_ids`` were forced by the environment (empty for the final answer turn).
    """

    assistant_ids: list[int]
    observation_ids: list[int]
    text: str
    action: Action
    observation: str = ""
    tool_error: bool = False
    logprobs: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.logprobs and len(self.logprobs) != len(self.assistant_ids):
            raise ValueError(
                f"turn logprobs has {len(self.logprobs)} entries for "
                f"{len(self.assistant_ids)} assistant tokens"
            )

    @property
    def is_transition(self) -> bool:
        """A turn that ends in an observation is a transition S_k -> S_{k+1}."""
        return self.action.kind != "answer"


@dataclass
class Trajectory:
    """A finished episode: one leaf of a rollout tree, trained as its full sequence."""

    task_id: str
    group_id: str
    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    answer: str | None = None
    reward: float = 0.0
    infra_failed: bool = False
    tree_id: str = ""
    node_path: list[int] = field(default_factory=list)
    """Tree node ids from the root (index 0) to the leaf (index ``len(turns)``)."""
    readiness: list[float] | None = None
    """Reference readiness ``l_k`` at each prefix S_0..S_T (spec section 2 step 1)."""

    @property
    def token_ids(self) -> list[int]:
        ids = list(self.prompt_ids)
        for turn in self.turns:
            ids += turn.assistant_ids
            ids += turn.observation_ids
        return ids

    @property
    def sampled(self) -> list[bool]:
        """Per-token loss mask: True for policy-generated tokens, False for prompt/observations."""
        mask = [False] * len(self.prompt_ids)
        for turn in self.turns:
            mask += [True] * len(turn.assistant_ids)
            mask += [False] * len(turn.observation_ids)
        return mask

    @property
    def old_logprobs(self) -> list[float]:
        """Sampling-time log-probs aligned with :attr:`token_ids` (0 on forced tokens)."""
        out = [0.0] * len(self.prompt_ids)
        for turn in self.turns:
            out += turn.logprobs if turn.logprobs else [0.0] * len(turn.assistant_ids)
            out += [0.0] * len(turn.observation_ids)
        return out

    @property
    def turn_spans(self) -> list[tuple[int, int]]:
        """``[start, end)`` of each turn's assistant tokens in :attr:`token_ids`."""
        spans = []
        pos = len(self.prompt_ids)
        for turn in self.turns:
            spans.append((pos, pos + len(turn.assistant_ids)))
            pos += len(turn.assistant_ids) + len(turn.observation_ids)
        return spans

    @property
    def boundaries(self) -> list[int]:
        """End positions of the prefixes S_0..S_T (T = number of transitions)."""
        ends = [len(self.prompt_ids)]
        pos = len(self.prompt_ids)
        for turn in self.turns:
            pos += len(turn.assistant_ids) + len(turn.observation_ids)
            if turn.is_transition:
                ends.append(pos)
        return ends

    @property
    def num_transitions(self) -> int:
        return sum(turn.is_transition for turn in self.turns)

    @property
    def generated_tokens(self) -> int:
        return sum(len(turn.assistant_ids) for turn in self.turns)


@dataclass
class Node:
    """One prefix of a rollout tree: the root is the prompt (depth 0), other nodes hold a turn."""

    id: int
    parent: int | None
    depth: int
    turn: Turn | None = None
    children: list[int] = field(default_factory=list)
    reward: float | None = None
    """Terminal reward; set on leaves only."""
    visits: int = 0
    """Number of leaves under this node (n_node in the visit-weighted backup)."""
    value_target: float | None = None
    """Visit-weighted backup Vhat (spec section 3): mean reward of the leaves below."""
    readiness: float | None = None
    """Reference readiness ``l`` of this prefix for the tree's gold answer, once scored (a boundary
    node's score is shared by every leaf below it; see ``ReferenceScorer.score``)."""
    hidden: list[float] | None = None
    """The policy's last-layer hidden state [H] at this prefix's last token, when the backend
    recorded it (the success predictor's ``hidden`` input); set on every node a turn started from."""

    @property
    def is_leaf(self) -> bool:
        return self.reward is not None

    @property
    def is_boundary(self) -> bool:
        """Branching is allowed only at the prompt or right after an observation."""
        return self.turn is None or self.turn.is_transition


@dataclass
class RolloutTree:
    """All rollouts of one prompt: the group of a GRPO-style estimator is the tree's leaves."""

    tree_id: str
    task_id: str
    prompt_ids: list[int]
    nodes: list[Node] = field(default_factory=list)
    trajectories: dict[int, Trajectory] = field(default_factory=dict)
    """Finished trajectory per leaf node id."""

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes.append(Node(id=0, parent=None, depth=0))

    @property
    def root(self) -> Node:
        return self.nodes[0]

    def add_child(self, parent: int, turn: Turn) -> int:
        node = Node(id=len(self.nodes), parent=parent, depth=self.nodes[parent].depth + 1, turn=turn)
        self.nodes.append(node)
        self.nodes[parent].children.append(node.id)
        return node.id

    def path(self, node_id: int) -> list[int]:
        """Node ids from the root down to ``node_id`` inclusive."""
        out = []
        current: int | None = node_id
        while current is not None:
            out.append(current)
            current = self.nodes[current].parent
        return out[::-1]

    def prefix_ids(self, node_id: int) -> list[int]:
        """Token ids of the prefix that ends at ``node_id`` (what a branch resumes from)."""
        ids = list(self.prompt_ids)
        for nid in self.path(node_id)[1:]:
            turn = self.nodes[nid].turn
            assert turn is not None
            ids += turn.assistant_ids + turn.observation_ids
        return ids

    def add_leaf(self, node_id: int, trajectory: Trajectory) -> None:
        self.nodes[node_id].reward = trajectory.reward
        trajectory.tree_id = self.tree_id
        trajectory.node_path = self.path(node_id)
        self.trajectories[node_id] = trajectory

    def leaves(self) -> list[int]:
        return [n.id for n in self.nodes if n.is_leaf]

    def branch_anchors(self) -> list[int]:
        """Non-root nodes with more than one child: where local contrast was bought."""
        return [n.id for n in self.nodes if n.parent is not None and len(n.children) > 1]

    def backup(self) -> None:
        """Visit counts and visit-weighted value targets, leaves upward (spec section 3)."""
        for node in reversed(self.nodes):  # children always have larger ids than parents
            if node.is_leaf:
                failed = node.id in self.trajectories and self.trajectories[node.id].infra_failed
                # Infrastructure failures say nothing about the policy: they carry no visits.
                node.visits = 0 if failed else 1
                node.value_target = None if failed else float(node.reward)  # type: ignore[arg-type]
                continue
            kids = [self.nodes[c] for c in node.children if self.nodes[c].visits > 0]
            node.visits = sum(k.visits for k in kids)
            node.value_target = (
                sum(k.visits * k.value_target for k in kids) / node.visits  # type: ignore[misc,operator]
                if node.visits
                else None
            )
