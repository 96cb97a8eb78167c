"""The run folder's lifecycle as the :class:`~tracerl.train.loop.Trainer` sees it.

:class:`RunLifecycle` (the Trainer's base class) claims and locks the run folder, reads or writes
its ``initial/`` policy, checkpoints the trainer's state (:meth:`RunLifecycle.save`), restores it
on resume (:meth:`RunLifecycle._restore`) and releases the folder (:meth:`RunLifecycle.close`).
The folder's files and their atomic writes are :mod:`tracerl.runs.folder`'s, the checkpoint
format :mod:`tracerl.runs.checkpoint`'s; the training step is :mod:`tracerl.train.loop`'s.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tracerl.envs.bounded import read_limited
from tracerl.errors import UserError
from tracerl.testbed.loading import load_model
from tracerl.models.threads import set_threads
from tracerl.runs.checkpoint import (
    LATEST,
    RESUME_FIELDS,
    CheckpointError,
    check_tokenizer,
    check_trainer_state,
    model_load_error,
    RngState,
    first_nonfinite,
    latest_checkpoint,
    load_policy_into,
    load_trainer_state,
    save_checkpoint,
)
from tracerl.config.schema import TrainConfig, config_to_yaml
from tracerl.runs.initial import has_initial, initial_source, write_initial
from tracerl.runs.folder import (
    LOCK_FILE,
    RunFolderError,
    RunLock,
    check_run_folder,
    discard_partial_run,
    refuse_if_state,
    remove_stale_temps,
    run_entries,
    write_atomic,
)

INITIAL = "initial"
"""Run sub-folder with the initial policy (a copy, or a checked reference to an on-disk base
model; see runs/initial.py): the frozen reference is always rebuilt from it."""


class NonFiniteTrainingError(UserError, RuntimeError):
    """Training produced NaN/inf: too many skipped steps in a row, or non-finite weights at a save.

    A :class:`~tracerl.errors.UserError` (the fix is a setting: the learning rate, the rewards), so
    the command line prints its one line; still a ``RuntimeError`` for code that catches that."""


@contextmanager
def restoring(path: Path, field: str) -> Iterator[None]:
    """Turn a failure to restore one part of ``trainer.pt`` into one :class:`CheckpointError` line
    naming the file and the field (torch and numpy raise from deep inside, naming neither)."""
    try:
        yield
    except CheckpointError:
        raise
    except (RuntimeError, TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as err:
        why = " ".join(str(err).split())[:160] or type(err).__name__
        raise CheckpointError(f"{path}: field {field!r} does not fit this run ({type(err).__name__}: {why}); "
                              "the checkpoint is damaged or not this run's: restore it or start a new run") from None


def check_optimizer_shapes(optimizer: Any) -> None:
    """Raise ``ValueError`` when a loaded optimiser state tensor (AdamW's moments) does not have its
    parameter's shape: ``load_state_dict`` checks only group sizes, so the first step would fail."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            for name, value in optimizer.state.get(param, {}).items():
                if hasattr(value, "shape") and value.dim() > 0 and tuple(value.shape) != tuple(param.shape):
                    raise ValueError(f"state {name!r} has shape {tuple(value.shape)}, its parameter "
                                     f"{tuple(param.shape)}")


def refuse_foreign_config(path: Path, text: bytes) -> None:
    """Refuse a fresh start over a ``config.yaml`` that is not the one it would write (the user's
    own file, say): the run would silently overwrite it. An identical file is no loss."""
    if not os.path.lexists(path):
        return
    if os.path.isfile(path) and not os.path.islink(path):
        try:
            if read_limited(path, len(text), "config file") == text:
                return
        except (OSError, ValueError):
            pass
    raise RunFolderError(f"{path} already exists and is not this run's config; a fresh start writes its resolved "
                         f"config there: move your file out of {path.parent} (and give it with --config), "
                         "or choose another --out")


class RunLifecycle:
    """The run-folder half of :class:`~tracerl.train.loop.Trainer` (its base class).

    Uses the Trainer's ``config``, ``run_dir``, ``fmt``, the model, optimiser, scheduler, scaler,
    predictor, generator, counters, executor and logs; :meth:`_claim_run_folder` sets ``lock``.
    """

    config: TrainConfig
    run_dir: Path
    resume_from: Path | None
    lock: RunLock
    _created_dir: bool
    fmt: Any
    model: Any
    tokenizer: Any
    optimizer: Any
    scheduler: Any
    scaler: Any
    predictor: Any
    generator: Any
    executor: Any
    log: Any
    rollout_log: Any
    step_index: int
    cursor: int
    totals: dict[str, int]
    nonfinite: dict[str, int]
    tool_health: Any
    divergence: Any
    data: Any
    driver: Any = None
    """Rank 0's :class:`~tracerl.distributed.trainer.Driver` when ``dist.nproc > 1``."""

    def _claim_run_folder(self, resume: bool) -> Path | None:
        """Lock the folder, clear temporaries, check its state; the checkpoint to resume from."""
        self._created_dir = not self.run_dir.exists()
        check_run_folder(self.run_dir)  # no link inside may lead a write or a delete outside it
        self._fresh_start = not resume
        # What was here before this start (a user's identical config.yaml, a view/ of theirs): a failed
        # start removes only what it created.
        self._entries_before = {p.name for p in run_entries(self.run_dir)} if self.run_dir.is_dir() else set()
        if not resume:  # before the lock file is created: a refused start leaves the folder as it was
            refuse_foreign_config(self.run_dir / "config.yaml", config_to_yaml(self.config).encode())
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.lock = RunLock(self.run_dir)
        try:
            remove_stale_temps(self.run_dir, holding_lock=True)
            folder = latest_checkpoint(self.run_dir) if resume else None
            if not resume:
                refuse_if_state(self.run_dir, holding_lock=True)
            elif folder is None:  # killed before the first checkpoint: nothing trained survives
                discard_partial_run(self.run_dir)
            if folder is None:
                text = config_to_yaml(self.config).encode()
                if not resume:
                    refuse_foreign_config(self.run_dir / "config.yaml", text)
                write_atomic(self.run_dir / "config.yaml", text)
            elif not has_initial(self.run_dir / INITIAL):
                raise RunFolderError(f"{self.run_dir / INITIAL} is missing: the frozen reference of this run "
                                     "cannot be rebuilt, so it cannot be resumed")
        except BaseException:
            self.lock.release()
            raise
        return folder

    def _initial_policy(self) -> tuple[Any, Any]:
        """The initial policy: read from ``initial/`` on resume, else built and ``initial/`` written
        atomically (a reference for an on-disk base model, a copy otherwise; runs/initial.py).
        Sets the CPU thread count first (models/threads.py: loading and everything after use it)."""
        cfg = self.config
        set_threads(cfg.model.threads, cfg.model.device)
        initial = self.run_dir / INITIAL
        # A LoRA base is loaded on the CPU and moved once cast to the working precision
        # (tracerl.train.loop.prepare_policy), so the GPU never holds its float32 copy (2x the budgeted memory).
        device = "cpu" if cfg.model.lora.r > 0 else cfg.model.device
        if self.resume_from is not None:
            source = initial_source(initial)  # a vanished or changed referenced base model is named here
            try:
                model, tokenizer = load_model(source, dtype=cfg.model.dtype, device=device)
            except Exception as err:  # noqa: BLE001 - a stranger's folder fails in any way; memory errors excepted
                raise model_load_error(err, source, "the run cannot be resumed") from None
            check_tokenizer(tokenizer, source)
            return model, tokenizer
        vocab = None
        if cfg.model.name_or_path == "random-tiny":
            from tracerl.envs.coverage import tool_texts
            from tracerl.testbed.tiny_data import vocabulary_texts
            vocab = vocabulary_texts(cfg.data.world, self.fmt) + tool_texts(self.data.environment.tools)
        model, tokenizer = load_model(
            cfg.model.name_or_path, vocabulary_texts=vocab, tiny_preset=cfg.model.tiny_preset,
            dtype=cfg.model.dtype, device=device, seed=cfg.seed)
        write_initial(initial, model, tokenizer, cfg.model.name_or_path)
        return model, tokenizer

    def _last_good(self) -> str:
        pointer = self.run_dir / LATEST
        if not pointer.exists():
            return "No checkpoint was written yet"
        return f"The last good checkpoint is {self.run_dir / pointer.read_text().strip()} (LATEST)"

    def save(self) -> Path:
        """Checkpoint the current step (once: saving a step already in ``LATEST`` returns it).

        Raises :class:`NonFiniteTrainingError` and writes nothing when a weight is NaN or infinite,
        so ``LATEST`` stays on the previous good checkpoint.
        """
        current = latest_checkpoint(self.run_dir)
        if current is not None and current.name == f"ckpt-{self.step_index:06d}":
            return current
        streamed = self.driver is not None and self.driver.streamed  # no whole policy here: checked as written
        bad = None if streamed else first_nonfinite(self.model.named_parameters())
        if bad is not None:
            raise NonFiniteTrainingError(f"parameter {bad} is not finite at step {self.step_index}; "
                                         f"not checkpointing it. {self._last_good()}")
        state = {
            "step": self.step_index,
            "cursor": self.cursor,
            "totals": dict(self.totals),
            "nonfinite": dict(self.nonfinite),
            "optimizer": self.optimizer.state_dict() if self.driver is None else None,  # sharded: in dcp/
            "scheduler": self.scheduler.state_dict(),
            "predictor": self.predictor.state_dict() if self.predictor is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": RngState.capture(self.generator).to_dict(),
            "tool_health": self.tool_health.state_dict(),  # per-tool failure streaks
            "eval_trees_started": self.executor.eval_state()["trees_started"],  # seeds evaluation episodes
            "divergence": self.divergence.state_dict(),  # the running baselines of the divergence tests
        }
        sharded = {"write_sharded": self.driver.save} if self.driver is not None else {}  # every rank's shards
        policy = self.driver.policy() if self.driver is not None else self.model
        return save_checkpoint(self.run_dir, self.step_index, policy, self.tokenizer, state,
                               config_to_yaml(self.config), self.config.log.keep_last, **sharded)

    def _weights(self) -> Any:
        """What the rollout backend syncs from: the policy, or (sharded training) what the driver gives."""
        return self.driver.weights() if self.driver is not None else self.model

    def _restore(self, folder: Path) -> None:
        if self.driver is None or not self.driver.streamed:  # streamed: the shards come from dcp/ below
            load_policy_into(self.model, folder)
        state = load_trainer_state(folder)  # checked field by field (runs/checkpoint.py)
        path = folder / "trainer.pt"
        check_trainer_state(state, path, require=RESUME_FIELDS)
        if state["optimizer"] is None or self.driver is not None:  # written or read by sharded training
            from tracerl.runs.sharded import load_sharded_state  # the sharded path only

            load_sharded_state(folder, self.model, self.optimizer, self.driver)
        else:
            with restoring(path, "optimizer"):
                self.optimizer.load_state_dict(state["optimizer"])
                check_optimizer_shapes(self.optimizer)
        with restoring(path, "scheduler"):
            self.scheduler.load_state_dict(state["scheduler"])
            if not isinstance(self.scheduler.last_epoch, int) or isinstance(self.scheduler.last_epoch, bool):
                raise TypeError("last_epoch is not an integer")
        if self.predictor is not None and state["predictor"] is not None:
            with restoring(path, "predictor"):
                self.predictor.load_state_dict(state["predictor"])
        if self.scaler is not None and state.get("scaler"):
            with restoring(path, "scaler"):
                self.scaler.load_state_dict(state["scaler"])
        self.step_index, self.cursor, self.totals = state["step"], state["cursor"], state["totals"]
        self.nonfinite = dict(state.get("nonfinite", self.nonfinite))
        with restoring(path, "rng"):
            RngState.from_dict(state["rng"]).restore(self.generator)
        with restoring(path, "tool_health"):
            self.tool_health.load_state_dict(state.get("tool_health", {}))
        self.executor.load_eval_state({"trees_started": state.get("eval_trees_started", 0)})
        with restoring(path, "divergence"):
            self.divergence.load_state_dict(state.get("divergence", {}))
        self.executor.sync_weights(self._weights(), self.step_index)  # the backend samples from the loaded weights
        self.log.truncate_after(self.step_index)
        self.rollout_log.truncate_after(self.step_index)

    def close(self, *, discard: bool = False) -> None:
        """Release the run folder (idempotent). ``discard``: a fresh start failed during set-up,
        so remove what it wrote (and the folder when this Trainer created it)."""
        if getattr(self, "driver", None) is not None:  # the other ranks stop serving
            self.driver.close()
            self.driver = None
        if getattr(self, "log", None) is not None:
            self.log.close()
        executor, self.executor = getattr(self, "executor", None), None
        if executor is not None:  # Ray workers and a cluster the executor started go with it
            executor.close()
        engine, self.reference_engine = getattr(self, "reference_engine", None), None
        if engine is not None:
            engine.close()
        if discard and self.lock.held:
            self._discard_own_entries()
        self.lock.release()

    def discards_after(self, error: BaseException | None) -> bool:
        """Whether ending with ``error`` should leave no run state: a fresh start that failed (an
        ``Exception``; Ctrl-C keeps its state for ``--resume``) before it wrote a metrics line or a
        checkpoint (``rollout.engine.max_total_tokens=1`` fails in the first rollout), so the corrected
        command can start over in the same folder. A run that logged a step keeps its metrics for the
        user to read, and a failing tool or verifier keeps its state: its line names the resume that
        continues it."""
        from tracerl.envs.health import ToolHealthError
        from tracerl.envs.verifiers import VerifierError

        if not (isinstance(error, Exception) and not isinstance(error, (ToolHealthError, VerifierError))
                and getattr(self, "_fresh_start", False) and self.lock.held):
            return False
        metrics = self.run_dir / "metrics.jsonl"
        if metrics.exists() and metrics.stat().st_size > 0:
            return False
        try:
            return latest_checkpoint(self.run_dir) is None
        except CheckpointError:  # never ours to judge: keep everything
            return False

    def _discard_own_entries(self) -> None:
        """Remove what this start wrote (run state, config.yaml, rollouts/, tensorboard/, ...), never an
        entry that was there before it; the folder too when this start created it and nothing is left."""
        before: set[str] = getattr(self, "_entries_before", set())
        discard_partial_run(self.run_dir)  # run state: a fresh start found none
        for entry in run_entries(self.run_dir):
            if entry.name in before or entry.name == LOCK_FILE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink(missing_ok=True)
        if self._created_dir and [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]:
            (self.run_dir / LOCK_FILE).unlink()
            self.lock.release()
            self.run_dir.rmdir()
