"""The agent registry: agents, their cards and history, API clients and nodes."""
