"""Contract suites every implementation must pass (pytest is needed only to run them)."""
