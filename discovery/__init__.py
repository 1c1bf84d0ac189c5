"""Discovery: sources, resolver, card cache, matcher, health, snapshots and session pins."""
