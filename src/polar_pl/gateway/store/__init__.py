"""What the gateway keeps: trace records and session records (frozen dataclasses), the durable
append-only SQLite trace store, and the session registry (unguessable tokens, auth lookup)."""
