"""tracerl.rollout."""
