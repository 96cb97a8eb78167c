"""Plug-ins by name or import path: verifiers, environments, tools, estimators, formats.

The custom-tool example of the README (examples/city_tools.py) trains here with ``--smoke-random``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tracerl.core.advantages import ESTIMATORS, AdvantageBatch, AdvantageOptions, get_estimator, grpo
from tracerl.core.types import Action, Task
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.data import Document
from tracerl.envs.environments import EnvSettings, build_environment
from tracerl.envs.tools import ToolSet
from tracerl.envs.verifiers import get_verifier
from tracerl.config.schema import resolve_config
from tracerl.config.loading import ConfigError
from tracerl.train.loop import Trainer
from tracerl.runs.metrics import read_metrics

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HERE = __name__


@pytest.fixture()
def examples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def not_a_tool(city):  # noqa: ANN001, ANN201 - no type hints, no docstring: rejected as a tool
    return city


def notes_environment(documents: list[Document], settings: EnvSettings) -> ToolEnvironment:
    """A custom environment factory: one ``note(topic)`` tool over the documents' titles."""
    titles = ", ".join(d.title for d in documents[:2])

    def note(topic: str) -> str:
        """A note about a topic."""
        return f"{topic}: see {titles}"

    return ToolEnvironment(ToolSet([note]), settings.config)


def half_grpo(batch: AdvantageBatch, options: AdvantageOptions) -> list:
    """A custom estimator by import path: half of GRPO's advantages."""
    return [0.5 * a for a in grpo(batch, options)]


def readiness_estimator(batch: AdvantageBatch, options: AdvantageOptions) -> list:
    """Declares that it reads readiness, so the config must turn credit on."""
    return grpo(batch, options)


readiness_estimator.needs_readiness = True  # type: ignore[attr-defined]


def _config(*overrides: str):
    return resolve_config("grpo", smoke="random", overrides=list(overrides))


@pytest.mark.parametrize(("override", "message"), [
    ("data.verifier=bleu", "data.verifier = 'bleu' is not valid; allowed values: answered, em, f1 or a "
                           "package.module:attribute path"),
    ("data.verifier=no_such_pkg.rewards:judge", "data.verifier = 'no_such_pkg.rewards:judge': verifier "
                                                "'no_such_pkg.rewards:judge': cannot import module 'no_such_pkg.rewards'"),
    ("data.environment=tracerl.envs.search:no_such_factory", "data.environment = 'tracerl.envs.search:no_such_factory': "
                                                            "environment 'tracerl.envs.search:no_such_factory': module "
                                                            "'tracerl.envs.search' has no attribute 'no_such_factory'"),
    ("data.environment=wiki", "data.environment = 'wiki' is not valid; allowed values: http_search, search"),
    ("data.tools=[city_tools:area]", "data.tools: tool 'city_tools:area': module 'city_tools' has no attribute 'area'"),
    (f"data.tools=[{HERE}:not_a_tool]", f"data.tools: tool '{HERE}:not_a_tool': tool 'not_a_tool' needs a docstring"),
    ("data.tools=[city_tools:population, city_tools:population]", "names a tool twice"),
    ("data.tools=[3]", "\"data.tools\""),  # the loader rejects it, naming the field
    ("model.format=xml", "model.format = 'xml' is not valid; allowed values: chat, react, search_r1"),
    ("algo.estimator=ppo", "algo.estimator = 'ppo' is not valid; allowed values:"),
    (f"algo.estimator={HERE}:readiness_estimator", f"algo.estimator = '{HERE}:readiness_estimator' needs algo.credit = true"),
])
def test_config_names_the_field_and_the_path(examples_on_path: None, override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(override)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_needs_readiness_is_declared_by_the_estimator() -> None:
    assert getattr(ESTIMATORS.get("trace_credit"), "needs_readiness") is True
    assert not getattr(ESTIMATORS.get("grpo"), "needs_readiness")
    with pytest.raises(ConfigError, match="algo.estimator = 'trace_credit' needs algo.credit = true"):
        _config("algo.estimator=trace_credit", "algo.credit=false")
    assert _config(f"algo.estimator={HERE}:readiness_estimator", "algo.credit=true").algo.credit


def test_verifier_and_estimator_by_import_path(examples_on_path: None) -> None:
    contains = get_verifier("city_tools:contains")
    task = Task("t", "Where?", ("Paris",))
    assert contains("It is Paris.", task) == 1.0 and contains("Parisian", task) == 0.0
    assert get_estimator(f"{HERE}:half_grpo") is half_grpo
    assert _config("data.verifier=city_tools:contains").data.verifier == "city_tools:contains"
    assert _config("data.tools=city_tools:population").data.tools == ["city_tools:population"]  # one path


def test_environment_factory_by_import_path_gets_the_extra_tools(examples_on_path: None) -> None:
    docs = [Document("d1", "Velmora", "A novel."), Document("d2", "Tarsik", "An author.")]
    settings = EnvSettings(top_k=2, config=EnvConfig(max_turns=3))
    env = build_environment(f"{HERE}:notes_environment", docs, settings, ["city_tools:population"])
    assert list(env.tools) == ["note", "population"] and env.config.max_turns == 3
    episode = env.start(Task("t", "Q?", ("x",)))
    assert episode.step(Action(kind="tool", name="note", arguments={"topic": "books"})).text == \
        "books: see Velmora, Tarsik"
    assert episode.step(Action(kind="tool", name="population", arguments={"city": "Paris"})).text == "2.1 million"
    with pytest.raises(ValueError, match="tool 'note' clashes with a tool of environment"):
        build_environment(f"{HERE}:notes_environment", docs, settings, [env.tools["note"]])


def test_custom_tool_trains_with_smoke_and_is_listed(examples_on_path: None, tmp_path: Path) -> None:
    """The README's example: ``data.tools=[city_tools:population] model.tool_list=true --smoke-random``."""
    config = _config("data.tools=[city_tools:population]", "model.tool_list=true", "steps=1",
                     "data.verifier=city_tools:contains")
    trainer = Trainer(config, tmp_path / "run")
    tools = trainer.data.environment.tools
    assert list(tools) == ["search", "open", "population"]
    task = trainer.data.train[0]
    prompt = trainer.fmt.render_prompt(task, tools)
    assert prompt.startswith("Actions: search[query] open[title] population[city] answer[text]\n")
    episode = trainer.data.environment.start(task)
    assert episode.step(Action(kind="tool", name="population", arguments={"city": "Tokyo"})).text == "14 million"
    trainer.run()
    record = read_metrics(tmp_path / "run")[-1]
    assert record["step"] == 1 and math.isfinite(record["loss"])
