"""The ``tracerl`` command line: parses arguments and calls into the package; no logic here.

Every command runs under :func:`_guarded`: a failure the user caused prints ONE line on
stderr (``<command> failed: <what and what to do>``) and exits 1 (2 for usage errors); a bug
keeps its traceback. ``tracerl --debug ...`` (or ``TRACERL_DEBUG=1``) shows the traceback of
any failure. The decision is :func:`tracerl.errors.one_line`.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import typer

from tracerl.config.preset_help import presets_epilog
from tracerl.envs.health import MIN_REACHABILITY
from tracerl.errors import UsageError, exit_code, one_line

try:  # typer >= 0.20 vendors its own click: its usage errors are not click's classes
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover - an older typer on the real click
    from click import exceptions as _click_errors

app = typer.Typer(
    name="tracerl",
    help="RL for multi-turn tool-using LLM agents (TRACE allocation and TRACE credit).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # a bug's traceback must not dump tensors and configs
)
world_app = typer.Typer(help="Build and inspect SynthWiki worlds.", no_args_is_help=True)
app.add_typer(world_app, name="world")

_STATE: dict[str, Any] = {"debug": False, "writing": None}
F = TypeVar("F", bound=Callable[..., Any])


def _print_version(value: bool) -> None:
    if value:
        from tracerl import __version__

        typer.echo(f"tracerl {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: bool = typer.Option(False, "--debug", envvar="TRACERL_DEBUG",
                               help="Show the full traceback of any failure (also: TRACERL_DEBUG=1)."),
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """RL for multi-turn tool-using LLM agents (TRACE allocation and TRACE credit)."""
    _STATE["debug"] = debug


def main(args: list[str] | None = None) -> None:
    """The ``tracerl`` console script: :data:`app`, with click's usage errors in one line.

    Typer prints a usage error as a framed panel of several lines; a script or CI log reads
    one line better: ``tracerl train: No such option: --stpes (see tracerl train --help)``, exit 2.

    A copy started by torchrun (``WORLD_SIZE`` > 1) leaves through
    :func:`tracerl.distributed.launch.leave_rank` once its command has returned.
    """
    world = os.environ.get("WORLD_SIZE", "1").strip() or "1"
    if not world.isdigit() or len(world) > 6:  # set by torchrun; anything else is a shell's leftover
        typer.echo(f"tracerl: WORLD_SIZE = {world[:20]!r} is not a process count; unset it (torchrun sets it)", err=True)
        sys.exit(2)
    if int(world) > 1:
        from tracerl.distributed.launch import leave_rank

        faulthandler.enable()  # a rank that aborts prints every thread's Python stack
        try:
            _run_app(args)
        except SystemExit as done:
            leave_rank(done.code)
    _run_app(args)


def _run_app(args: list[str] | None) -> None:
    try:
        code = app(args=args, prog_name="tracerl", standalone_mode=False)
    except _click_errors.UsageError as err:
        where, message = err.ctx.command_path if err.ctx is not None else "tracerl", err.format_message()
        if message.strip():  # empty when no arguments were given: the help was printed instead
            typer.echo(f"{where}: {' '.join(message.split())} (see {where} --help)", err=True)
        sys.exit(err.exit_code)
    except _click_errors.ClickException as err:
        typer.echo(f"tracerl: {' '.join(err.format_message().split())}", err=True)
        sys.exit(err.exit_code)
    except (typer.Abort, click.exceptions.Abort):
        typer.echo("Aborted.", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def _guarded(what: str) -> Callable[[F], F]:
    """Run a command so that a user-caused failure ends in one line on stderr and a non-zero exit."""

    def wrap(command: F) -> F:
        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
            _STATE["writing"] = None
            try:
                return command(*args, **kwargs)
            except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
                raise  # click's own exits and usage errors (exit 2) print as click prints them
            except Exception as exc:  # KeyboardInterrupt is not an Exception: it propagates
                message = None if _STATE["debug"] else one_line(exc, writing=_STATE["writing"])
                if message is None:
                    raise  # a bug (or --debug): the traceback is the report
                typer.echo(f"{what} failed: {message}", err=True)
                raise typer.Exit(code=exit_code(exc)) from None

        return run  # type: ignore[return-value]

    return wrap

# --- environments (world build, env-check) -------------------------------------------------


@world_app.command("build")
@_guarded("world build")
def world_build(
    seed: int = typer.Option(..., help="Fact seed: who is related to whom (a new seed is an unseen world)."),
    out: str = typer.Option(..., help="Output folder for corpus.jsonl, train.jsonl and test.jsonl."),
    name_seed: int = typer.Option(0, help="Name seed: the entity names, shared across fact seeds."),
    num_train: int = typer.Option(2000, help="Training questions."),
    num_test: int = typer.Option(500, help="Test questions."),
    max_hops: int = typer.Option(4, help="Longest question chain (1..5)."),
    distractors: int = typer.Option(1, help="Look-alike siblings per base name."),
    size: str = typer.Option("tiny", help="tiny: the embedded tiny model's world sizes (~700 entities, names "
                             "it can read; eval/train --model tiny need them); full: SynthWiki's 2,800 entities."),
) -> None:
    """Write a SynthWiki world; the same seeds give byte-identical files."""
    from tracerl.envs.synthwiki import build_world, write_world
    from tracerl.testbed.world_sizes import world_config

    config = world_config(size, name_seed=name_seed, fact_seed=seed, num_train=num_train, num_test=num_test,
                          max_hops=max_hops, distractors=distractors)
    world = build_world(config)
    paths = write_world(world, out)
    typer.echo(f"{len(world.documents)} documents, {len(world.train)} train / {len(world.test)} test "
               f"questions -> {paths['corpus'].parent}")


@app.command("env-check")
@_guarded("env-check")
def env_check(
    tasks: str = typer.Option(..., help="Tasks JSONL (id, question, answers, supporting_titles/supporting_ids)."),
    corpus: str = typer.Option(None, help="Corpus JSONL (id, title, text); or give --retriever-url."),
    retriever_url: str = typer.Option(None, "--retriever-url", help="Check the http_search environment: the "
                                      "retrieval server at this URL (tracerl serve-retriever, or Search-R1's)."),
    policy: str = typer.Option("oracle", help="oracle (search each gold paragraph's title, open it by id if missed, "
                                              "answer gold) or random."),
    limit: int = typer.Option(None, help="Check only the first N tasks."),
    seed: int = typer.Option(0, help="Seed of the random policy."),
    min_reachability: float = typer.Option(MIN_REACHABILITY, "--min-reachability", help="Exit 1 (after the JSON) when the "
                                           "oracle's answer_reachability is below this; 0: never."),
) -> None:
    """Run a scripted policy through the real environment and print a JSON summary.

    The oracle reports answer_reachability (gold answer present in what it read),
    evidence_hit_rate and retrieval_hit_rate; not its own success, which it cannot fail.
    """
    import json

    from tracerl.envs.health import check_reachability
    from tracerl.rollout.env_check import run_env_check

    if not 0.0 <= min_reachability <= 1.0:
        raise UsageError(f"--min-reachability must be in [0, 1] (0: never fail), got {min_reachability}")
    if (corpus is None) == (retriever_url is None):
        raise UsageError("give --corpus CORPUS (the search environment) or --retriever-url URL (http_search)")
    summary = run_env_check(tasks, corpus, policy=policy, limit=limit, seed=seed, retriever_url=retriever_url)
    typer.echo(json.dumps(summary, indent=2))
    if policy == "oracle":
        check_reachability(summary["answer_reachability"], min_reachability, summary["tasks"],
                           f"tasks {tasks} over corpus {corpus or retriever_url}", "--min-reachability 0 accepts it")


@app.command("serve-retriever")
@_guarded("serve-retriever")
def serve_retriever(
    corpus: str = typer.Option(..., help="Corpus JSONL (id, title, text) to index with bm25s."),
    port: int = typer.Option(8000, help="Port to listen on; 0 picks a free one (printed)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (127.0.0.1: this machine only)."),
    top_k: int = typer.Option(3, "--top-k", help="Documents per query when a request gives no topk."),
    latency_ms: float = typer.Option(0.0, "--latency-ms", help="TEST/BENCHMARK ONLY: wait this long before "
                                     "answering each request, to stand in for a remote retriever."),
) -> None:
    """Serve a corpus over HTTP with Search-R1's POST /retrieve API (plus POST /open, GET /info), for
    data.environment=http_search; needs pip install -e ".[serve]"."""
    from tracerl.envs.retriever_server import serve

    serve(corpus, host=host, port=port, top_k=top_k, latency_ms=latency_ms, echo=typer.echo)

# --- data (convert raw QA files) -----------------------------------------------------------

data_app = typer.Typer(help="Bring your own data: convert raw QA files to tracerl's JSONL.", no_args_is_help=True)
app.add_typer(data_app, name="data")
_ERRORS_SHOWN = 20


@data_app.command("convert")
@_guarded("data convert")
def data_convert(
    fmt: str = typer.Argument(..., metavar="FORMAT", help="hotpotqa, musique, 2wiki or search-r1."),
    input_: str = typer.Option(..., "--input", help="Raw file in the data set's official format (json, jsonl, parquet)."),
    out: str = typer.Option(..., "--out", help="Output folder for tasks.jsonl and corpus.jsonl."),
    limit: int = typer.Option(None, "--limit", help="Keep the first N converted questions (and their paragraphs)."),
    corpus: str = typer.Option(None, "--corpus", help="search-r1 only: corpus JSONL (id, title, text or id, contents)."),
    eval_input: str = typer.Option(None, "--eval-input",
                                   help="Held-out raw file (e.g. dev) -> eval_tasks.jsonl, paragraphs in the same corpus."),
) -> None:
    """Convert raw HotpotQA, MuSiQue, 2WikiMultihopQA or Search-R1 files; bad rows are skipped and listed."""
    from tracerl.envs.convert import convert

    _STATE["writing"] = out
    report = convert(fmt, input_, out, limit=limit, corpus=corpus, eval_raw=eval_input)
    for line in report.errors[:_ERRORS_SHOWN]:
        typer.echo(f"skipped {line}", err=True)
    if len(report.errors) > _ERRORS_SHOWN:
        typer.echo(f"... and {len(report.errors) - _ERRORS_SHOWN} more skipped rows", err=True)
    where = ", ".join(str(p) for p in report.paths.values())
    held_out = f" + {report.eval_tasks} held-out" if eval_input else ""
    typer.echo(f"{report.tasks} tasks{held_out}, {report.documents} documents, {len(report.errors)} skipped rows "
               f"-> {where}")
    if "corpus" not in report.paths:
        typer.echo("note: no corpus written; give data.corpus (or --corpus) before training", err=True)

# --- models (pretrain, eval) ----------------------------------------------------------------


@app.command("pretrain")
@_guarded("pretrain")
def pretrain(
    out: str = typer.Option(None, "--out", help="Also copy the model to this folder."),
    steps: int = typer.Option(None, help="Optimiser steps (default from the preset)."),
    seed: int = typer.Option(None, help="Seed of data and initialisation (default 0)."),
    preset: str = typer.Option("default", help="A tiny_config.py preset: default (a few minutes on 2 CPU cores), "
                                               "smoke (seconds), bench_hops, bench_hops_lookalike, ..."),
    threads: int = typer.Option(0, help="torch CPU threads; 0: $TRACERL_THREADS or all available cores."),
    ship: bool = typer.Option(False, "--ship", help="Replace the package's shipped copy of the preset "
                                                    "(tracerl/testbed/weights/PRESET, new manifest); in a source checkout."),
) -> None:
    """Pretrain the embedded tiny base model here (or reuse this machine's cached pretraining) and print its
    folder. Runs use the copy shipped in the package; this re-makes it."""
    from tracerl.models.threads import set_threads
    from tracerl.testbed.tiny import pretrained_folder

    set_threads(threads)  # under load, torch's default thread count made pretraining ~7x slower
    _STATE["writing"] = out
    path = pretrained_folder(preset, out=out, steps=steps, seed=seed, ship=ship)
    typer.echo(str(path))


@app.command("eval")
@_guarded("eval")
def eval_model(
    model: str = typer.Option(None, help="Model folder, hub name, or tiny (the embedded model); or use --run."),
    run: str = typer.Option(None, "--run", help="Run folder: its latest checkpoint with the run's format, limits "
                                               "and held-out data (--tasks/--corpus replace the data)."),
    tasks: str = typer.Option(None, help="Tasks JSONL (id, question, answers); needed with --model."),
    corpus: str = typer.Option(None, help="Corpus JSONL (id, title, text) for the search tool; needed with --model."),
    retriever_url: str = typer.Option(None, "--retriever-url", help="With --model, instead of --corpus: search "
                                      "over the retrieval server at this URL (the http_search environment)."),
    samples: int = typer.Option(1, help="Rollouts per task (k of pass@k; use with --temperature 1)."),
    limit: int = typer.Option(None, help="Evaluate only the first N tasks."),
    out: str = typer.Option(None, help="Write one trajectory per line to this JSONL file."),
    format: str = typer.Option("react", help="Agent format with --model: react or chat."),  # noqa: A002
    temperature: float = typer.Option(0.0, help="0: greedy, as training's evaluation; 1 to sample (pass@k)."),
    max_turns: int = typer.Option(8, help="Assistant turns per episode (--model)."),
    max_turn_tokens: int = typer.Option(128, help="Tokens per assistant turn (--model)."),
    max_total_tokens: int = typer.Option(2048, help="Tokens per episode, prompt included (--model)."),
    tiny_preset: str = typer.Option("default", help="Preset of --model tiny."),
    seed: int = typer.Option(0, help="Sampling seed."),
    device: str = typer.Option("cpu", help="torch device for the model."),
    progress: bool = typer.Option(True, help="Show progress on stderr (a bar on a terminal, else a line per 10%)."),
    trust_run_code: bool = typer.Option(False, "--trust-run-code",
                                        help="With --run: allow the run's config to import its plug-ins (import paths)."),
) -> None:
    """Roll a model out on a task split; print EM, F1, pass@k, turns, tool calls, error-action rate."""
    import json

    from tracerl.config.checks import check_device

    check_device(device, field="--device")
    if temperature < 0:
        raise UsageError(f"--temperature must be >= 0 (0: greedy), got {temperature}")
    if (model is None) == (run is None):
        raise UsageError("give --model MODEL (with --tasks and --corpus) or --run RUN_DIR")
    _STATE["writing"] = out
    if run is not None:
        from tracerl.train.evaluation import eval_run

        metrics = eval_run(run, tasks_path=tasks, corpus_path=corpus, samples=samples, limit=limit, out=out,
                           temperature=temperature, seed=seed, device=device, show_progress=progress,
                           trust_code=trust_run_code)
    else:
        from tracerl.rollout.engine import EngineConfig
        from tracerl.rollout.evaluate import run_eval
        from tracerl.config.checks import check_model_source

        if not (tasks and (corpus or retriever_url)):
            raise UsageError("--model needs --tasks and --corpus or --retriever-url (or evaluate a run with --run RUN_DIR)")
        note = check_model_source(model, field="--model")
        if note:
            typer.echo(f"note: {note}", err=True)
        config = EngineConfig(max_turns=max_turns, max_turn_tokens=max_turn_tokens,
                              max_total_tokens=max_total_tokens, temperature=temperature)
        metrics = run_eval(model, tasks, corpus, samples=samples, limit=limit, out=out, format_name=format,
                           config=config, seed=seed, device=device, tiny_preset=tiny_preset, show_progress=progress,
                           retriever_url=retriever_url)
    typer.echo(json.dumps(metrics, indent=2))


# --- training (train, config show, plot, demo) ----------------------------------------------

config_app = typer.Typer(help="Inspect training configs.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@app.command("train", epilog=presets_epilog())
@_guarded("train")
def train(
    preset: str = typer.Argument(None, help="A method preset (every one is listed below, one line each)."),
    out: str = typer.Option(None, "--out", help="Run folder (metrics.jsonl, checkpoints)."),
    config: str = typer.Option(None, "--config", help="YAML file layered over the preset."),
    set_: list[str] = typer.Option(None, "--set", help="Override, e.g. --set optim.lr=1e-5 (repeatable)."),
    steps: int = typer.Option(None, help="Train until this many steps in total."),
    smoke: bool = typer.Option(False, "--smoke", help="The smoke-pretrained tiny model (shipped in the package) on a "
                               "tiny world: seconds; calls tools, rewards some episodes, scores credit."),
    smoke_random: bool = typer.Option(False, "--smoke-random", help="--smoke on a random tiny model whose vocabulary "
                                      "is built from the run's format and tools (custom ones); never calls a tool."),
    resume: str = typer.Option(None, "--resume", help="Continue the run in this folder exactly; --steps and --set of "
                               "steps, eval.*, log.*, dist.*, model.device/threads, data.retriever_url may change, "
                               "nothing else."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Remove the previous run in --out first (tracerl's "
                                   "files only, listed on stderr; other files there stay)."),
    device: str = typer.Option(None, "--device", help="With --resume: continue on this device (e.g. cuda:0)."),
    nproc: int = typer.Option(None, "--nproc", help="Training processes (FSDP2, one per GPU), launched through "
                              "torchrun; rank 0 drives. Sets dist.nproc; with --resume, any count."),
    trust_run_code: bool = typer.Option(False, "--trust-run-code",
                                        help="With --resume: allow the run's config to import its plug-ins (import paths)."),
) -> None:
    """Train a policy with one of the method presets."""
    from tracerl.distributed.launch import check_launch, launched_rank, launched_world, relaunch
    from tracerl.train.run import resume_training, start_training

    if steps is not None and steps < 1:
        raise UsageError(f"--steps must be >= 1, got {steps}")
    if nproc is not None and nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {nproc}")
    if nproc is None and launched_world() > 1:  # under torchrun (ours drops --nproc: its parser would take it)
        nproc = launched_world()
    set_ = [*(set_ or []), *([f"dist.nproc={nproc}"] if nproc is not None and not resume else [])]
    smoke_mode = _smoke_mode(smoke, smoke_random)
    if launched_rank() > 0:  # under torchrun: ranks > 0 serve the sharded update
        from tracerl.distributed.trainer import serve_rank

        serve_rank(preset, config, set_, smoke_mode, resume, nproc, trust_code=trust_run_code)
        return
    _STATE["writing"] = resume or out
    if device is not None and not resume:
        raise UsageError("--device goes with --resume; a fresh start takes --set model.device=...")
    _check_resume_flags(resume, out, overwrite, smoke_mode)
    if nproc is not None and nproc > 1 and launched_world() == 1:  # checked here, then torchrun starts N copies
        if not resume and (not preset or not out):
            raise UsageError("give a PRESET and --out RUN_DIR (or --resume RUN_DIR)")
        check_launch(preset, config, set_, smoke_mode, resume, out, nproc, trust_code=trust_run_code,
                     overwrite=overwrite)
        _pretrain_smoke_model(smoke_mode, preset, config, set_)
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default, given so it prints no banner
        raise typer.Exit(relaunch(nproc, sys.argv[1:]))
    driver = _rank0_driver() if launched_world() > 1 else None  # rank 0 under torchrun drives the sharded update
    if resume:
        start = resume_training(resume, steps=steps, device=device, nproc=nproc, trust_code=trust_run_code,
                                start_driver=driver, preset=preset, config_file=config, overrides=set_)
    else:
        if not preset or not out:
            raise UsageError("give a PRESET and --out RUN_DIR (or --resume RUN_DIR)")
        _preflight(preset, config, set_ or [], smoke_mode)
        if overwrite:  # after the checks: a refused config removes nothing
            from tracerl.runs.overwrite import overwrite_run_folder

            overwrite_run_folder(out, notify=lambda line: typer.echo(line, err=True))
        _pretrain_smoke_model(smoke_mode, preset, config, set_)
        start = start_training(preset, out, config_file=config, overrides=set_ or [], steps=steps, smoke=smoke_mode,
                               start_driver=driver)
    start()


def _check_resume_flags(resume: str | None, out: str | None, overwrite: bool, smoke: bool | str) -> None:
    """Flags that choose a fresh run's folder or model do not go with --resume (which keeps the run's own)."""
    if not resume:
        return
    if overwrite:
        raise UsageError("give --resume RUN_DIR (continue it) or --overwrite (start over in --out), not both")
    if out is not None and os.path.abspath(out) != os.path.abspath(resume):
        raise UsageError(f"--resume continues {resume} in place; drop --out {out} (or start a new run there "
                         "without --resume)")
    if smoke:
        raise UsageError("--smoke/--smoke-random choose a fresh run's model; a resumed run keeps its own: drop it")


def _rank0_driver() -> Any:
    """Rank 0's hook that shards the policy (torch.distributed is imported only under torchrun)."""
    from tracerl.distributed.trainer import start_driver

    return start_driver


def _smoke_mode(smoke: bool, smoke_random: bool) -> bool | str:
    """``smoke=`` of resolve_config: "pretrained" (--smoke), "random" (--smoke-random) or False."""
    if smoke and smoke_random:
        raise UsageError("give --smoke (the smoke-pretrained tiny model) or --smoke-random, not both")
    return "random" if smoke_random else "pretrained" if smoke else False


def _pretrain_smoke_model(smoke: bool | str, preset: str, config_file: str | None, overrides: list[str]) -> None:
    from tracerl.train.smoke import pretrain_for_run

    pretrain_for_run(smoke, preset, config_file, overrides, lambda text: typer.echo(text, err=True, nl=False))


def _preflight(preset: str, config_file: str | None, overrides: list[str], smoke: bool | str) -> None:
    """Check what a fresh run needs (config, data files, model source) before its folder exists."""
    from tracerl.train.preflight import checked_config

    for note in checked_config(preset, config_file=config_file, overrides=overrides, smoke=smoke)[1]:
        typer.echo(f"note: {note}", err=True)


@config_app.command("show")
@_guarded("config show")
def config_show(
    preset: str = typer.Argument(None, help="A method preset (default: grpo, the base config every preset overlays)."),
    config: str = typer.Option(None, "--config", help="YAML file layered over the preset."),
    set_: list[str] = typer.Option(None, "--set", help="Override, e.g. --set optim.lr=1e-5."),
    smoke: bool = typer.Option(False, "--smoke", help="Show the --smoke variant (the smoke-pretrained tiny model)."),
    smoke_random: bool = typer.Option(False, "--smoke-random", help="Show the --smoke-random variant (a random tiny model)."),
    explain: bool = typer.Option(False, "--explain", help="Comment every field with its meaning and default."),
    no_import: bool = typer.Option(False, "--no-import", help="Read someone else's config safely: print the layers "
                                   "without building them (import paths listed, not imported; nothing checked)."),
) -> None:
    """Print the fully resolved config of a preset as YAML, after the same checks as `train`.

    A config's import paths (data.verifier: pkg.mod:fn) are code: they are imported here as in
    `train`; use --no-import to read a config you do not trust."""
    if no_import:
        from tracerl.config.no_import import unresolved_yaml

        typer.echo(unresolved_yaml(preset or "grpo", config_file=config, overrides=set_ or [],
                                   smoke=_smoke_mode(smoke, smoke_random)), nl=False)
        return
    from tracerl.config.schema import config_to_yaml
    from tracerl.config.docs import explained_yaml
    from tracerl.train.preflight import checked_config

    resolved, notes = checked_config(preset or "grpo", config_file=config, overrides=set_ or [],
                                     smoke=_smoke_mode(smoke, smoke_random))
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    typer.echo(explained_yaml(resolved) if explain else config_to_yaml(resolved), nl=False)


@config_app.command("reference")
@_guarded("config reference")
def config_reference(
    out: str = typer.Option(None, "--out", help="Write the page here (e.g. docs/reference.md) instead of stdout."),
) -> None:
    """Every metrics.jsonl key and every config field with default and meaning, as Markdown."""
    from tracerl.config.reference import reference_markdown

    page = reference_markdown()
    if out is None:
        typer.echo(page, nl=False)
        return
    from pathlib import Path

    from tracerl.runs.folder import write_atomic

    _STATE["writing"] = out
    write_atomic(Path(out), page.encode())
    typer.echo(out)


@app.command("plot")
@_guarded("plot")
def plot(
    runs: list[str] = typer.Argument(..., help="Run folders to compare."),
    out: str = typer.Option("curves.png", "--out", help="PNG file to write."),
    smooth: float = typer.Option(0.0, "--smooth", help="EMA smoothing in [0, 1) drawn over the raw points (e.g. 0.6)."),
) -> None:
    """Learning curves: held-out accuracy vs generated tokens and vs rollouts; mixed groups, reward, loss, turns."""
    from pathlib import Path

    from tracerl.view.plot import plot_runs

    _STATE["writing"] = out
    typer.echo(str(plot_runs([Path(r) for r in runs], Path(out), smooth=smooth)))


@app.command("view")
@_guarded("view")
def view(
    run_dir: str = typer.Argument(..., help="Run folder (trained with log.rollouts=true, the default)."),
    step: int = typer.Option(None, "--step", help="Render only this step (default: every logged step)."),
    out: str = typer.Option(None, "--out", help="Output folder (default RUN_DIR/view)."),
) -> None:
    """Static HTML of a run's rollout trees: one page per step (turns, branches, rewards, readiness,
    credit, predictor values) and an index with each step's metrics. Prints the index path."""
    from tracerl.view.site import render_run

    _STATE["writing"] = out
    typer.echo(str(render_run(run_dir, out=out, step=step)))


@app.command("demo")
@_guarded("demo")
def demo(
    out: str = typer.Option("demo_out", "--out", help="Output folder (runs, plots, summary.json)."),
    minutes: float = typer.Option(None, help="Wall-clock budget for the RL phase (default from the demo config)."),
) -> None:
    """The embedded default end to end: world, tiny base model, TRACE training, evaluation, plots."""
    from tracerl.train.demo import run_demo

    _STATE["writing"] = out
    run_demo(out, train_minutes=minutes)


if __name__ == "__main__":
    main()
