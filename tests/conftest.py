"""Test configuration: the local Hub server and olah fixtures live in tests/hub_fixtures.py."""

pytest_plugins = ["hub_fixtures"]
