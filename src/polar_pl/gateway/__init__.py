"""The gateway: provider-API proxy in front of the engine that records every model call."""

from polar_pl.gateway.store.records import SessionInfo, TraceRecord

__all__ = ["Gateway", "SessionInfo", "TraceRecord", "create_app"]


def __getattr__(name: str):
    # lazy: importing polar_pl.gateway.store.records must not pull in FastAPI and aiohttp
    if name == "Gateway":
        from polar_pl.gateway.handle import Gateway

        return Gateway
    if name == "create_app":
        from polar_pl.gateway.http.app import create_app

        return create_app
    raise AttributeError(name)
