"""The registry's client-facing errors (each message fit for an API client)."""

from __future__ import annotations


class RegistryError(Exception):
    """Base of the registry's client-facing errors."""


class InvalidInput(RegistryError):
    pass


class AgentNotFound(RegistryError):
    def __init__(self, agent_id: str) -> None:
        super().__init__(f"agent not found: {agent_id}")
        self.agent_id = agent_id


class RegistrationConflict(RegistryError):
    """A registration that met concurrent changes of its agent it could not settle: retry."""
