"""The engine client: HTTP clients for the engine's OpenAI-compatible stream (aiohttp, httpx),
the replica pool (health, session affinity, failover) and the engine-side token counter."""
