"""What ``verl_cpu_scale.py`` plugs into verl's processes (imported there by module name, with this
folder on ``PYTHONPATH``):

* :class:`TimedTraceManager` and :class:`TimedVerlManager`: TRACE's manager and verl's own
  ``AgentLoopManagerTQ``, each timed the same way: from the call of ``generate_sequences`` until
  every prompt of the batch is ``finished`` in TransferQueue (what verl's trainer waits for): wall
  seconds, the tokens the servers sampled for the batch (TRACE's manager counts a tree's shared
  turns once), the tokens of the batch's samples (the sum of their ``response_mask`` in
  TransferQueue: a leaf's whole path, no tool observations), the samples, and
  the TaskRunner's peak RSS (``ru_maxrss``: the manager runs in verl's TaskRunner). One line a
  training batch on stdout: ``VERL_CPU_SCALE {json}``.
* :class:`CorpusSearch`: a verl native tool (``BaseTool``) searching the same corpus with the same
  BM25 search tool tracerl's environment uses (the tracerl YAML ``TRACERL_SCALE_CONFIG`` names).
* a ``tracerl_react`` tool parser for verl's ``tool_agent`` loop: a turn stops at ``]``; its first
  ``Action: name[arg]`` is a call of ``name`` with ``{"query": arg}``; ``answer`` (or none) ends
  the episode.
* :func:`compute_score`: verl's custom reward, the ``Action: answer[...]`` text against the gold
  answers with tracerl's exact-match verifier.
"""

from __future__ import annotations

import json
import os
import re
import resource
import time
from typing import Any

import transfer_queue as tq
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse
from verl.trainer.ppo.v1 import AgentLoopManagerTQ

from tracerl.integrations.verl.manager import TraceAgentLoopManager, batch_rows

CONFIG_ENV = "TRACERL_SCALE_CONFIG"
"""Environment variable naming the tracerl YAML whose corpus the search tool serves."""
ARM_ENV = "VERL_CPU_SCALE_ARM"
"""Environment variable naming the TRACE arm (``trace``, ``trace_alloc``) in the timed records."""
POLL_S = 0.05
"""How often the timing wrapper reads the batch's tags (a 20 Hz read of TransferQueue's index)."""
_ACTION = re.compile(r"Action:[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*\[([^\]\n]*)\]")


def _generated_tokens(uids: list[str], partition: str) -> tuple[int, int]:
    """(sampled tokens, samples) of the batch's samples in TransferQueue (keys ``{uid}_...``)."""
    listing = tq.kv_list(partition_id=partition).get(partition, {})
    prefixes = tuple(f"{u}_" for u in uids)
    keys = [k for k in listing if k.startswith(prefixes)]
    if not keys:
        return 0, 0
    masks = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=["response_mask"])["response_mask"]
    return int(sum(int(masks[i].sum()) for i in range(len(keys)))), len(keys)


def _wait_finished(uids: list[str], partition: str) -> None:
    """Until every prompt of the batch is ``finished`` (or ``failure``) in TransferQueue: verl's
    ``AgentLoopManagerTQ.generate_sequences`` returns once its agent loops are started, and its
    trainer then waits for these tags (TRACE's manager returns after setting them)."""
    while True:
        listing = tq.kv_list(partition_id=partition).get(partition, {})
        if all(listing.get(u, {}).get("status") in ("finished", "failure") for u in uids):
            return
        time.sleep(POLL_S)


def _timed(manager: Any, prompts: Any, call: Any, name: str) -> None:
    rows = batch_rows(prompts)
    validate = bool(rows[0].get("validate", False)) if rows else False
    uids = [str(r["uid"]) for r in rows]
    start = time.perf_counter()
    call(prompts)
    if validate:
        return
    _wait_finished(uids, "train")
    seconds = time.perf_counter() - start
    tokens, samples = _generated_tokens(uids, "train")
    metrics = getattr(manager, "last_metrics", None) or {}
    # what the servers sampled: TRACE's manager counts it (a tree's shared turns once); verl's
    # samples each sampled their own tokens
    sampled = metrics.get("generated_tokens", tokens)
    record = {"manager": name, "step": int(rows[0].get("global_steps", 0)), "seconds": seconds,
              "sampled_tokens": int(sampled), "sample_tokens": tokens, "samples": samples, "prompts": len(rows),
              "taskrunner_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              # the readiness helper's counters, when the manager reports them (None otherwise)
              "readiness_tokens_forwarded": metrics.get("readiness_tokens_forwarded"),
              "readiness_tokens_full_prefix": metrics.get("readiness_tokens_full_prefix"),
              "manager_rollout_seconds": metrics.get("rollout_seconds"),
              # TRACE's step split (None for verl's loop): tree expansion (the servers and tools)
              # and readiness scoring by the frozen reference; the rest is planning
              "generation_seconds": metrics.get("generation_seconds"),
              "readiness_seconds": metrics.get("readiness_seconds"),
              "predictor_seconds": metrics.get("predictor_seconds"),
              "transfer_queue_seconds": metrics.get("transfer_queue_seconds"),
              "reference_rows": metrics.get("reference_rows"),
              "stage1_rollouts": metrics.get("stage1_rollouts"), "stage2_rollouts": metrics.get("stage2_rollouts"),
              "root_topup": metrics.get("root_topup"), "tree_worker_imbalance": metrics.get("tree_worker_imbalance")}
    print("VERL_CPU_SCALE " + json.dumps(record), flush=True)


class TimedTraceManager(TraceAgentLoopManager):
    def generate_sequences(self, prompts: Any) -> None:
        _timed(self, prompts, super().generate_sequences, os.environ.get(ARM_ENV, "trace"))


class TimedVerlManager(AgentLoopManagerTQ):
    def generate_sequences(self, prompts: Any) -> None:
        _timed(self, prompts, super().generate_sequences, "verl_grpo_tool_agent")


class CorpusSearch(BaseTool):
    """``search(query)`` over the corpus of the tracerl YAML at ``$TRACERL_SCALE_CONFIG``."""

    def __init__(self, config: dict, tool_schema: Any) -> None:
        from tracerl.config.schema import resolve_config
        from tracerl.train.data import load_task_data, run_environment

        super().__init__(config, tool_schema)
        cfg = resolve_config("trace", config_file=os.environ[CONFIG_ENV])
        documents = load_task_data(cfg.data, cfg.rollout.engine, cfg.seed).documents
        self.tools = run_environment(documents, cfg.data, cfg.rollout.engine).tools

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        text = self.tools.call("search", {"query": str(parameters.get("query", ""))})
        return ToolResponse(text=f"\nObservation: {text}\n"), 0.0, {}


@ToolParser.register("tracerl_react")
class ReactToolParser(ToolParser):
    """The react format's first action of a turn as verl's function call (module docstring). A
    turn stops at ``]`` (the react format's stop: ``stop_token_ids``, which vLLM and the
    ``tracerl_hf`` server honour), as TRACE's turns do."""

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self.tokenizer.encode("]", add_special_tokens=False))

    async def extract_tool_calls(self, responses_ids: list[int], tools: Any = None) -> tuple[str, list[FunctionCall]]:
        text = self.tokenizer.decode(responses_ids)
        found = _ACTION.search(text)
        if found is None or found.group(1) == "answer":
            return text, []
        return text, [FunctionCall(name=found.group(1), arguments=json.dumps({"query": found.group(2)}))]


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **_: Any) -> float:
    """1.0 when the episode's ``Action: answer[...]`` matches a gold answer (tracerl's ``em``)."""
    from tracerl.core.types import Task
    from tracerl.envs.verifiers import exact_match

    answers = [m.group(2) for m in _ACTION.finditer(solution_str) if m.group(1) == "answer"]
    if not answers:
        return 0.0
    if hasattr(ground_truth, "tolist"):  # a numpy array out of the parquet
        ground_truth = ground_truth.tolist()
    gold = tuple(str(a) for a in (ground_truth if isinstance(ground_truth, (list, tuple)) else [ground_truth]))
    return exact_match(answers[0], Task(id="verl", question="", answers=gold))
