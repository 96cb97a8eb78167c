"""One start-then-branch round through the executor protocol, for tests that compare trees
built two ways (serial vs concurrent tools, lockstep vs independent turns)."""

from __future__ import annotations

import json

from tracerl.core.protocol import ExpandRequest, StartRequest, task_record, to_json
from tracerl.rollout.engine import RolloutEngine
from tracerl.rollout.executor import LocalExecutor


def start_and_branch(engine: RolloutEngine, tasks) -> tuple[list[dict], list[float]]:  # noqa: ANN001
    """3 chains per task, then 2 continuations from depth 1 of each first chain, through the
    executor protocol: per call its deltas as JSON without log-probs and its cost (rollouts,
    generated tokens; not the call's seconds or backend counters), and the log-probs in order."""
    executor = LocalExecutor(engine)
    started = executor.start([StartRequest(f"t{i}", task_record(t), 3, seed=5) for i, t in enumerate(tasks)])
    requests = []
    for delta in started.deltas:
        tree = engine.tree(delta.tree_id)
        node = tree.trajectories[min(tree.trajectories)].node_path[1]
        if engine.can_expand(delta.tree_id, node):
            requests.append(ExpandRequest(delta.tree_id, node, 2, seed=6))
    expanded = executor.expand(requests)
    records = [{"deltas": json.loads(to_json(r))["deltas"], "cost": (r.rollouts, r.generated_tokens)}
               for r in (started, expanded)]
    logprobs: list[float] = []
    for record in records:
        for delta in record["deltas"]:
            for node in delta["nodes"]:
                logprobs += node["turn"].pop("logprobs")
            for traj in delta["trajectories"]:
                for turn in traj["turns"]:
                    turn.pop("logprobs")
    return records, logprobs
