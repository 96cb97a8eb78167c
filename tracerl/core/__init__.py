"""Pure math and typed data: imports torch and numpy only, never models or the trainer."""
