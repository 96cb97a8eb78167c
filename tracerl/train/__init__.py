"""tracerl.train."""
