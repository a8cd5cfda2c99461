"""Provider adapters, one file per API."""
