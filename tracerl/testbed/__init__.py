"""The testbed: the embedded tiny base model, its SynthWiki data and its pretraining."""
