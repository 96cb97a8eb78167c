"""tracerl.allocation."""
