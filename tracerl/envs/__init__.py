"""tracerl.envs."""
