"""Reading a run folder back for people: the static HTML viewer (:mod:`.site` writes the pages,
:mod:`.records` reads the rollout records, :mod:`.html` renders them) and the training curves
(:mod:`.plot`)."""
