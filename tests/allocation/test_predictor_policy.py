"""The predictor serves the allocator only: no gradient path to (or from) the policy."""

from __future__ import annotations

import torch
from alloc_world import make_engine, shared

from tracerl.allocation.predictor import SuccessPredictor


def test_predictor_has_no_gradient_path_to_the_policy() -> None:
    w, env, policy = shared()
    engine = make_engine(policy, env)
    trees, _ = engine.rollout(w.train[:3], [4, 4, 4], generator=torch.Generator().manual_seed(0))
    pred = SuccessPredictor()
    pred.update(trees)
    policy_params = {id(p) for p in policy.model.parameters()}
    predictor_params = {id(p) for group in pred.optimizer.param_groups for p in group["params"]}
    assert policy_params.isdisjoint(predictor_params)

    # Predictions are plain floats from gradient-free features.
    ids = [n.id for n in trees[0].nodes]
    feats = pred.features([trees[0]] * len(ids), ids)
    assert not feats.requires_grad and feats.dtype == torch.float32
    values = pred.predict_nodes([trees[0]] * len(ids), ids)
    assert all(type(v) is float for v in values)

    # A policy loss that uses the predictor's values leaves the predictor untouched...
    traj = next(iter(trees[0].trajectories.values()))
    logits = policy.model(input_ids=torch.tensor([traj.token_ids])).logits
    loss = logits.log_softmax(-1).mean() * values[0]
    loss.backward()
    assert all(p.grad is None for p in pred.model.parameters())

    # ...and training the predictor neither reads nor changes the policy's gradients or weights.
    grads = [p.grad.clone() for p in policy.model.parameters()]
    weights = [p.detach().clone() for p in policy.model.parameters()]
    pred.update(trees)
    for p, g, wt in zip(policy.model.parameters(), grads, weights, strict=True):
        assert torch.equal(p.grad, g) and torch.equal(p.detach(), wt)
    policy.model.zero_grad(set_to_none=True)
