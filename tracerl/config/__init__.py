"""The run's config: the schema (one dataclass per section, :mod:`.schema`), loading and merging
YAML and ``--set`` overrides (:mod:`.loading`, :mod:`.yaml_safe`), the checks run at load
(:mod:`.checks`, :mod:`.ranges`, :mod:`.trace_checks`, :mod:`.executor`, :mod:`.dist`), the named
presets (:mod:`.presets`) and the generated reference of every field and metric (:mod:`.docs`,
:mod:`.metric_docs`, :mod:`.reference`). Nothing here builds a model or touches a run folder."""
