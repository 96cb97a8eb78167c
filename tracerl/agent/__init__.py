"""tracerl.agent."""
