"""Browser test fixtures: real a2a-sdk agents (tests/a2a_agents.py)."""

from tests.a2a_agents import echo_agent_factory  # noqa: F401  (fixture)
