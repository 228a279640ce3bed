"""Test support code: a git-backed Hub-compatible server and the pytest fixtures around it."""
