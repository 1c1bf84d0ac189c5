"""Console test fixtures: the gateway's (real SDK agents registered on the live platform)."""

from tests.gateway.conftest import (  # noqa: F401  (fixtures)
    caller,
    echo_agent,
    echo_agent_factory,
    make_caller,
    register_agent,
)
