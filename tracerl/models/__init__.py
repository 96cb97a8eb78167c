"""tracerl.models."""
