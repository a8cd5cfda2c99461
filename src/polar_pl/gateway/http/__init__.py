"""The gateway's HTTP surface: the app (admin routes and health), the raw-ASGI handler for harness
traffic, provider detection from path / headers / body, and provider-shaped error responses."""
