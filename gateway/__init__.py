"""The A2A gateway: /a2a/{agent_id}, virtual subscribers and their manager."""
