"""Gateway overhead: added latency and CPU per streamed request, versus the upstream called
directly and versus LiteLLM's proxy in front of the same upstream.

    python bench/gateway.py                        # gateway (aiohttp and httpx upstream clients), direct
    python bench/gateway.py --litellm .cache/litellm-venv/bin/litellm   # + LiteLLM's proxy
    python bench/gateway.py --clients aiohttp --store-sync NORMAL --baseline-src /tmp/main  # vs main's
    python bench/gateway.py --clients aiohttp --store-sync NORMAL --sessions 64 --no-passthrough \
        --profile /tmp/prof                        # cProfile of the gateway, top entries per request

Every target runs in its own process: a fast mock engine (32 SSE chunks per answer with token
ids, logprobs and a usage chunk, like vLLM with return_token_ids), the gateway (`polar-pl gateway`,
real trace store, translation and capture included) or LiteLLM, and this load generator. At each
concurrency level (1, 64, 256 sessions) every session sends streaming chat requests back to back
for --seconds, in --rounds rounds that interleave the targets (a change in the shared machine's
load then hits every target alike). Reported: requests/s, errors, latency p50/p99 (request sent -> last byte), the
latency added over the direct upstream, and the target process's CPU time per request (from
/proc, user+system, children included). A minimal ASGI pass-through (aiohttp, bytes forwarded,
nothing parsed or stored) is the floor any proxy in Python pays on the same machine.

Measured 2026-12-01 (load average 8-11, 3 rounds of 3 s, `--baseline-src` = main before issue 18's
item 3): CPU ms/req at 1 / 64 / 256 sessions: pass-through 0.56 / 0.39 / 0.47, gateway 1.64 / 1.36
/ 1.40 (2.9x / 3.5x / 3.0x), main's gateway 1.84 / 1.52 / 1.32. What the profile says the rest is:
parsing every engine chunk (token ids, logprobs), the capture, the re-encoding without engine-only
fields and the record's commit, ~0.43 ms together (the note closing issue 18). The older table:

LiteLLM lives in its own venv: `python3 -m venv .cache/litellm-venv &&
.cache/litellm-venv/bin/pip install 'litellm[proxy]'`.

Measured 2026-11-30 on the shared 2-CPU dev box (load average 10-16 from other jobs, so
latencies are inflated for every target; CPU per request is the stable number), 6 s per level:

    target                  sessions  req/s  p50 ms  added p50  CPU ms/req
    minimal pass-through        1      448     1.3      0.83       0.58
    gateway (aiohttp)           1      160     5.1      4.72       1.54
    gateway (aiohttp)          64      347   168.0    134.96       1.15
    gateway (aiohttp)         256      385   612.7    437.60       0.98   (0 errors)
    gateway (httpx)           256      172  1395.9   1220.85       3.03
    gateway (aiohttp, FULL)   256      170  1388.4   1213.36       1.63
    litellm proxy               1        7   131.8    131.40      53.04
    litellm proxy             256        9 29802.4  29627.29      49.84

aiohttp is the default upstream client (2-3x less CPU than httpx); LiteLLM spends 34-51x more CPU
per request than the gateway. A hand-written httptools client was also tried and measured no
better than aiohttp within this box's noise, so it was dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

CHUNKS = 32
PROMPT_IDS = list(range(1000, 1100))


# ---- the mock engine (runs in its own process) --------------------------------------------


def _mock_stream_bytes() -> list[bytes]:
    def raw(data: bytes) -> bytes:  # one HTTP/1.1 chunk
        return b"%x\r\n%s\r\n" % (len(data), data)

    def chunk(obj) -> bytes:
        return raw(b"data: " + orjson.dumps(obj) + b"\n\n")

    out = [
        chunk(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "tiny",
                "prompt_token_ids": PROMPT_IDS,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            }
        )
    ]
    for i in range(CHUNKS):
        out.append(
            chunk(
                {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": "tiny",
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": f" tok{i}"},
                            "token_ids": [2000 + i],
                            "logprobs": {
                                "content": [
                                    {"token": f" tok{i}", "logprob": -0.25, "bytes": None, "top_logprobs": []}
                                ]
                            },
                            "finish_reason": "stop" if i == CHUNKS - 1 else None,
                        }
                    ],
                }
            )
        )
    out.append(
        chunk(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "tiny",
                "choices": [],
                "usage": {
                    "prompt_tokens": len(PROMPT_IDS),
                    "completion_tokens": CHUNKS,
                    "total_tokens": len(PROMPT_IDS) + CHUNKS,
                },
            }
        )
    )
    out.append(raw(b"data: [DONE]\n\n"))
    out.append(b"0\r\n\r\n")
    return out


async def _mock_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, chunks: list[bytes]) -> None:
    head_sse = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
        b"x-policy-version: 3\r\n\r\n"
    )
    models = orjson.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]})
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *headers = head.decode("latin-1").split("\r\n")
            method, path, _ = line.split(" ", 2)
            length = next(
                (int(h.split(":", 1)[1]) for h in headers if h.lower().startswith("content-length:")), 0
            )
            if length:
                await reader.readexactly(length)
            if method == "GET":
                body = models if path.startswith("/v1/models") else b'{"status":"ok"}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(body), body)
                )
                continue
            writer.write(head_sse)
            for c in chunks:  # one write per SSE event, flushed: a real token-by-token stream
                writer.write(c)
                await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def serve_mock(port: int) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    chunks = _mock_stream_bytes()

    async def main():
        server = await asyncio.start_server(
            lambda r, w: _mock_conn(r, w, chunks), "127.0.0.1", port, backlog=2048
        )
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def serve_passthrough(port: int, upstream: str) -> None:
    """The floor to compare against: a minimal ASGI pass-through (aiohttp upstream, bytes forwarded
    as they arrive; no parsing, translation, capture or store)."""
    import aiohttp
    import uvicorn

    state: dict = {}

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (msg := await receive())["type"] != "lifespan.shutdown":
                if msg["type"] == "lifespan.startup":
                    state["http"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
                    await send({"type": "lifespan.startup.complete"})
            await state["http"].close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if scope["method"] == "GET":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        async with state["http"].post(f"{upstream}{scope['path']}", data=body) as resp:
            await send(
                {
                    "type": "http.response.start",
                    "status": resp.status,
                    "headers": [(b"content-type", b"text/event-stream")],
                }
            )
            async for data in resp.content.iter_any():
                await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")


# ---- processes ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not come up")


def tree_cpu_seconds(pid: int) -> float:
    """user+system CPU of pid and its descendants, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(parts[1]), []).append(int(d))
        stats[int(d)] = (int(parts[11]) + int(parts[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += stats.get(p, 0.0)
        todo.extend(children.get(p, []))
    return total


@dataclass
class Target:
    name: str
    url: str  # full chat completions URL pattern; {token} is replaced per session
    pid: int | None
    tokens: list[str]
    model: str = "tiny"
    api_key: str = "x"


def start(cmd: list[str], env: dict | None = None, log: Path | None = None) -> subprocess.Popen:
    out = open(log, "wb") if log else subprocess.DEVNULL
    return subprocess.Popen(
        cmd, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def gateway_target(
    mock_url: str,
    client: str,
    sessions: int,
    store: Path,
    sync: str,
    profile: Path | None = None,
    src: str | None = None,
) -> tuple[Target, subprocess.Popen]:
    """profile: run the gateway under cProfile, its stats written to this file when it stops.
    src: run the gateway of another checkout's source tree (its `src/`), named after it."""
    import httpx

    port = free_port()
    prof = ["-m", "cProfile", "-o", str(profile)] if profile else []
    proc = start(
        [
            sys.executable,
            *prof,
            "-m",
            "polar_pl.cli",
            "gateway",
            "--upstream",
            mock_url,
            "--port",
            str(port),
            "--store",
            str(store),
            "--model",
            "tiny",
            "--client",
            client,
            "--log-level",
            "error",
            "--store-sync",
            sync,
            "--no-token-faithful",  # the mock engine serves no tokenizer (bench/faithful.py measures that path)
        ],
        {"POLAR_ADMIN_TOKEN": "bench", **({"PYTHONPATH": str(Path(src) / "src")} if src else {})},
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health")
    tokens = []
    for _ in range(sessions):
        r = httpx.post(
            f"{url}/admin/sessions", json={"harness": "bench"}, headers={"authorization": "Bearer bench"}
        )
        tokens.append(r.json()["token"])
    name = f"gateway ({client})" if sync == "NORMAL" else f"gateway ({client},{sync})"
    name += f" {Path(src).name}" if src else ""
    return Target(name, f"{url}/s/{{token}}/v1/chat/completions", proc.pid, tokens), proc


def litellm_target(litellm: str, mock_url: str, tmp: Path) -> tuple[Target, subprocess.Popen]:
    port = free_port()
    cfg = tmp / "litellm.yaml"
    cfg.write_text(
        "model_list:\n  - model_name: tiny\n    litellm_params:\n      model: openai/tiny\n"
        f"      api_base: {mock_url}/v1\n      api_key: x\n"
        "litellm_settings:\n  drop_params: true\n  telemetry: false\n"
    )
    master = "sk-bench-0123456789abcdef"  # LiteLLM refuses to start without one
    proc = start(
        [litellm, "--config", str(cfg), "--port", str(port), "--num_workers", "1"],
        {"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "LITELLM_MASTER_KEY": master},
        log=tmp / "litellm.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health/liveliness", timeout=300)
    except TimeoutError:
        sys.stderr.write((tmp / "litellm.log").read_text()[-3000:])
        raise
    return Target("litellm proxy", f"{url}/v1/chat/completions", proc.pid, ["x"], api_key=master), proc


# ---- load -----------------------------------------------------------------------------------

BODY = orjson.dumps(
    {
        "model": "tiny",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "You are a benchmark."},
            {"role": "user", "content": "Count to thirty-two."},
        ],
    }
)


@dataclass
class Result:
    target: str
    sessions: int
    requests: int
    errors: int
    seconds: float
    lat_ms: list[float]
    cpu_s: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def pct(self, q: float) -> float:
        if not self.lat_ms:
            return float("nan")
        s = sorted(self.lat_ms)
        return s[min(len(s) - 1, int(q * len(s)))]

    @property
    def cpu_ms_per_req(self) -> float:
        return 1000 * self.cpu_s / max(1, self.requests)


async def run_level(target: Target, sessions: int, seconds: float) -> Result:
    import aiohttp

    lat: list[float] = []
    errors = 0
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:

        async def one(url: str) -> None:
            nonlocal errors
            t0 = time.perf_counter()
            try:
                async with http.post(
                    url,
                    data=BODY,
                    headers={"content-type": "application/json", "authorization": f"Bearer {target.api_key}"},
                ) as resp:
                    tail = b""
                    async for data in resp.content.iter_any():
                        tail = (tail + data)[-64:]
                    if resp.status != 200 or b"[DONE]" not in tail:
                        errors += 1
                        return
            except (aiohttp.ClientError, TimeoutError):
                errors += 1
                return
            lat.append(1000 * (time.perf_counter() - t0))

        async def worker(i: int, deadline: float) -> None:
            url = target.url.format(token=target.tokens[i % len(target.tokens)])
            while time.perf_counter() < deadline:
                await one(url)

        await asyncio.gather(
            *(
                one(target.url.format(token=target.tokens[i % len(target.tokens)]))
                for i in range(min(sessions, 32))
            )
        )  # warm connections
        lat.clear()
        errors = 0
        cpu0 = tree_cpu_seconds(target.pid) if target.pid else 0.0
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i, t0 + seconds) for i in range(sessions)))
        elapsed = time.perf_counter() - t0
        cpu = (tree_cpu_seconds(target.pid) - cpu0) if target.pid else 0.0
    return Result(target.name, sessions, len(lat), errors, elapsed, lat, cpu)


def table(results: list[Result]) -> str:
    direct = {r.sessions: r for r in results if r.target == "direct"}
    gw = {r.sessions: r for r in results if r.target == "gateway (aiohttp)"}
    head = (
        f"| {'target':<22} | sessions | req/s | errors | p50 ms | p99 ms | added p50 ms | added p99 ms "
        f"| CPU ms/req | CPU vs gateway | added p50 vs gateway |"
    )
    lines = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    for r in results:
        d = direct.get(r.sessions)
        add50 = r.pct(0.5) - d.pct(0.5) if d and r is not d else 0.0
        add99 = r.pct(0.99) - d.pct(0.99) if d and r is not d else 0.0
        g = gw.get(r.sessions)
        cpu_ratio = f"{r.cpu_ms_per_req / g.cpu_ms_per_req:.1f}x" if g and r.target != "direct" else "-"
        g_add = (g.pct(0.5) - d.pct(0.5)) if g and d else None
        lat_ratio = f"{add50 / g_add:.1f}x" if g_add and g_add > 0 and r.target != "direct" else "-"
        lines.append(
            f"| {r.target:<22} | {r.sessions:>8} | {r.rps:>5.0f} | {r.errors:>6} | {r.pct(0.5):>6.1f} "
            f"| {r.pct(0.99):>6.1f} | {add50:>12.2f} | {add99:>12.2f} | {r.cpu_ms_per_req:>10.2f} "
            f"| {cpu_ratio:>14} | {lat_ratio:>20} |"
        )
    return "\n".join(lines)


def start_targets(
    args: argparse.Namespace, mock_url: str, levels: list[int], tmp: Path, procs: list, profiles: list
) -> list[tuple[Target, list[int]]]:
    """Every target but `direct` started (all up at once, so the rounds can interleave them)."""
    plan = []
    if args.passthrough:
        port = free_port()
        procs.append(start([sys.executable, __file__, "--serve-passthrough", str(port), mock_url]))
        wait_http(f"http://127.0.0.1:{port}/health")
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        plan.append((Target("minimal pass-through", url, procs[-1].pid, ["x"]), levels))
    syncs, clients = args.store_sync.split(","), args.clients.split(",")
    for client, sync in [(c, syncs[0]) for c in clients] + [(clients[0], s) for s in syncs[1:]]:
        prof = Path(args.profile) / f"gateway-{client}-{sync}.prof" if args.profile else None
        target, proc = gateway_target(mock_url, client, max(levels), tmp / f"{client}{sync}.db", sync, prof)
        procs.append(proc)
        profiles += [(prof, target.name)] if prof else []
        plan.append((target, levels))
    if args.baseline_src:  # the same gateway of another checkout, side by side in the same rounds
        prof = Path(args.profile) / "gateway-baseline.prof" if args.profile else None
        target, proc = gateway_target(
            mock_url, clients[0], max(levels), tmp / "baseline.db", syncs[0], prof, args.baseline_src
        )
        procs.append(proc)
        profiles += [(prof, target.name)] if prof else []
        plan.append((target, levels))
    if args.litellm:
        target, proc = litellm_target(args.litellm, mock_url, tmp)
        procs.append(proc)
        plan.append((target, [int(x) for x in (args.litellm_sessions or args.sessions).split(",")]))
    return plan


def merge_rounds(results: list[Result]) -> list[Result]:
    """One result per (target, sessions): the rounds' requests, errors, time, latencies and CPU summed."""
    out: dict[tuple[str, int], Result] = {}
    for r in results:
        m = out.get((r.target, r.sessions))
        if m is None:
            out[(r.target, r.sessions)] = Result(
                r.target, r.sessions, r.requests, r.errors, r.seconds, list(r.lat_ms), r.cpu_s
            )
        else:
            m.requests, m.errors, m.seconds, m.cpu_s = (
                m.requests + r.requests,
                m.errors + r.errors,
                m.seconds + r.seconds,
                m.cpu_s + r.cpu_s,
            )
            m.lat_ms += r.lat_ms
    return list(out.values())


def print_profile(path: Path, requests: int, top: int = 15) -> None:
    """The profile's top entries by cumulative and by own time, per request, among the functions
    called at least once a request (start-up and imports left out); times are cProfile's (inflated
    by its own per-call cost, so the ranking is the point)."""
    import pstats

    stats = pstats.Stats(str(path)).stats
    hot = [(k, v) for k, v in stats.items() if v[1] >= requests]
    for key, col in (("cumulative", 3), ("tottime", 2)):
        print(f"\n{path.name}: top {top} by {key}, per request ({requests} requests)")
        print(f"{'calls/req':>9} {'own us/req':>10} {'cum us/req':>10}  function")
        for (file, line, fn), v in sorted(hot, key=lambda kv: kv[1][col], reverse=True)[:top]:
            where = file.split("site-packages/")[-1].split("src/")[-1]
            print(
                f"{v[1] / requests:>9.1f} {1e6 * v[2] / requests:>10.1f} {1e6 * v[3] / requests:>10.1f}  {where}:{line}({fn})"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", default="1,64,256")
    ap.add_argument("--seconds", type=float, default=3.0, help="per level, per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over every target and level, interleaved")
    ap.add_argument("--clients", default="aiohttp,httpx", help="gateway upstream clients to measure")
    ap.add_argument(
        "--store-sync",
        default="NORMAL,FULL",
        help="trace store synchronous levels to measure (the first one for every client)",
    )
    ap.add_argument(
        "--baseline-src",
        default=None,
        metavar="DIR",
        help="also run the gateway of another checkout (e.g. main's: `git worktree add DIR main`) in the "
        "same interleaved rounds: before/after in one run",
    )
    ap.add_argument("--litellm", default=None, help="path to LiteLLM's `litellm` executable (its own venv)")
    ap.add_argument("--litellm-sessions", default=None, help="levels for LiteLLM (default: --sessions)")
    ap.add_argument(
        "--no-passthrough",
        dest="passthrough",
        action="store_false",
        help="skip the minimal pass-through floor",
    )
    ap.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="run each gateway under cProfile: DIR/gateway-<client>-<sync>.prof, top entries printed "
        "(the CPU column of a profiled run is inflated by the profiler: take the table from a plain run)",
    )
    ap.add_argument("--serve-mock", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--serve-passthrough", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_mock:
        serve_mock(args.serve_mock)
        return 0
    if args.serve_passthrough:
        serve_passthrough(int(args.serve_passthrough[0]), args.serve_passthrough[1])
        return 0
    levels = [int(x) for x in args.sessions.split(",")]
    mock_port = free_port()
    mock = start([sys.executable, __file__, "--serve-mock", str(mock_port)])
    mock_url = f"http://127.0.0.1:{mock_port}"
    procs = [mock]
    results: list[Result] = []
    profiles: list[tuple[Path, str]] = []  # (cProfile file, target name)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wait_http(f"{mock_url}/health")
            plan = [(Target("direct", f"{mock_url}/v1/chat/completions", None, ["x"]), levels)]
            plan += start_targets(args, mock_url, levels, Path(tmp), procs, profiles)
            for _ in range(args.rounds):  # interleaved: a shift in the machine's load hits every target
                for target, target_levels in plan:
                    for n in target_levels:
                        results.append(asyncio.run(run_level(target, n, args.seconds)))
            results = merge_rounds(results)
    finally:
        for p in procs:
            if p.poll() is None:
                stop(p)
    print(
        f"\nstreamed chat requests, {CHUNKS} chunks each, {args.rounds} rounds of {args.seconds:.0f}s per level "
        f"(interleaved), {os.cpu_count()} CPUs\n"
    )
    print(table(results))
    for prof, name in profiles:
        print_profile(prof, sum(r.requests for r in results if r.target == name))
    g = {r.sessions: r for r in results if r.target == "gateway (aiohttp)"}
    if 256 in g:
        print(f"\ngateway at 256 sessions: {g[256].rps:.0f} req/s, {g[256].errors} errors")
    lite = [r for r in results if r.target == "litellm proxy"]
    if lite and g:
        ratios = [r.cpu_ms_per_req / g[r.sessions].cpu_ms_per_req for r in lite if r.sessions in g]
        print(
            f"LiteLLM CPU per request / gateway CPU per request: {statistics.mean(ratios):.0f}x (mean over levels)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
