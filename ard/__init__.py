"""Agentic Resource Discovery (ARD v0.9): ``/.well-known/ai-catalog.json`` and the ARD registry
API (``POST /search``, ``GET /agents``, ``POST /explore``) over a full-text index of the registry.

Imports ``registry``; ``registry`` never imports this app (it learns of changes through
``registry.events``).
"""
