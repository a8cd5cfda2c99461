"""`GatewayRuntime`: the state every gateway route shares (store, sessions, replicas, upstream
client, engine gate, proxy), built once per app from the gateway's options."""

from __future__ import annotations

import asyncio
from pathlib import Path

from polar_pl.chat.reasoning import check_reasoning_parser
from polar_pl.gateway.call.gate import EngineGate
from polar_pl.gateway.call.proxy import Proxy
from polar_pl.gateway.call.sidecalls import DEFAULT_SIDE_RULES, SideCallRule
from polar_pl.gateway.faithful.history import TokenFaithful
from polar_pl.gateway.http.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_DEPTH, check_limits
from polar_pl.gateway.store.sessions import SessionRegistry
from polar_pl.gateway.store.traces import TraceStore
from polar_pl.gateway.upstream.client import make_client
from polar_pl.gateway.upstream.replicas import ReplicaPool
from polar_pl.gateway.upstream.tokencount import TokenCounter


class GatewayRuntime:
    """Everything the routes share: store, sessions, replicas, upstream client, proxy."""

    def __init__(
        self,
        upstreams: list[str],
        store_path: str | Path,
        *,
        admin_token: str,
        tokenizer_dir: str | Path | None = None,
        model: str | None = None,
        side_rules: tuple[SideCallRule, ...] | None = None,
        client: str = "aiohttp",
        store_synchronous: str = "NORMAL",
        public_url: str | None = None,
        health_interval: float = 2.0,
        connect_timeout: float = 5.0,
        read_timeout: float = 600.0,
        token_faithful: bool | None = None,
        token_faithful_check: bool = False,
        max_tokens_cap: int | None = None,
        cap_policy: str = "length",
        sampling: str = "recorded",
        pinned_temperature: float = 1.0,
        pause_timeout: float = 300.0,
        reasoning_parser: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_json_depth: int = DEFAULT_MAX_DEPTH,
    ):
        """token_faithful: splice sampled tokens into prompts and call the engine's token-in
        route (faithful/); None = on when the gateway has a tokenizer (tokenizer_dir), since
        both engines (vLLM, embedded) accept token prompts. max_tokens_cap: upper bound on each
        call's response length (None: the harness's request). cap_policy: what the harness is
        told when the cap cut a response, "length" or "end_turn" (call/proxy.py). sampling: "recorded" (the
        harness's temperature / top_p / top_k, stated explicitly) or "pinned" (pinned_temperature / 1 /
        off), see call/sampling.py. pause_timeout: how long a call
        waits at a paused gate before a 503 / 529 with Retry-After. reasoning_parser: the
        engine's (vLLM `--reasoning-parser`, "qwen3"), applied to token-in answers as the engine
        applies it to chat answers. token_faithful_check: also build every incremental
        token-faithful prompt the full way and compare (faithful/history.py): a full render per
        call, and the plain re-render kept in each record for drift diagnostics.
        max_body_bytes / max_json_depth: the bounds on a request (413 / 400 in the provider's
        shape, http/limits.py)."""
        check_limits(max_body_bytes, max_json_depth)
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        self.admin_token = admin_token
        self.public_url = public_url.rstrip("/") if public_url else None
        self.store = TraceStore(store_path, synchronous=store_synchronous)
        self.sessions = SessionRegistry(self.store)
        # read_timeout bounds the wait for each engine chunk (a stuck engine -> 504), not the call
        self.client = make_client(client, connect_timeout=connect_timeout, read_timeout=read_timeout)
        self.pool = ReplicaPool(upstreams, self.client, model=model, health_interval=health_interval)
        self.counter = TokenCounter(tokenizer_dir, self.client)
        if token_faithful is None:
            token_faithful = tokenizer_dir is not None
        if token_faithful and tokenizer_dir is None:
            raise ValueError("token_faithful: needs tokenizer_dir (the served model's directory)")
        self.gate = EngineGate(wait_timeout=pause_timeout)
        self.loop: asyncio.AbstractEventLoop | None = None  # the serving loop, set at startup
        self.proxy = Proxy(
            store=self.store,
            sessions=self.sessions,
            pool=self.pool,
            client=self.client,
            side_rules=tuple(DEFAULT_SIDE_RULES if side_rules is None else side_rules),
            faithful=TokenFaithful(
                self.counter.tokenizer,
                check_reasoning_parser(reasoning_parser),
                load=self.store.records,
                check=token_faithful_check,
            )
            if token_faithful
            else None,
            max_tokens_cap=max_tokens_cap,
            cap_policy=cap_policy,
            sampling=sampling,
            pinned_temperature=pinned_temperature,
            gate=self.gate,
        )

    def stats(self) -> dict[str, float]:
        snap = self.proxy.stats.snapshot() | self.gate.snapshot()
        snap["gateway/token_faithful"] = float(self.proxy.faithful is not None)
        if self.proxy.faithful is not None:
            snap |= self.proxy.faithful.snapshot()
        snap["gateway/healthy_replicas"] = float(sum(r.healthy for r in self.pool.replicas))
        snap["gateway/inflight"] = float(sum(r.inflight for r in self.pool.replicas))
        snap["gateway/store_errors"] = float(self.store.errors)
        snap["gateway/store_checkpoint_errors"] = float(self.store.checkpoint_errors)
        return snap

    async def aclose(self) -> None:
        await self.pool.stop()
        await self.client.close()
        self.store.close()
