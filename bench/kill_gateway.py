"""kill -9 of a loaded gateway: are the records it leaves true to what the harnesses received?

    python bench/kill_gateway.py                  # FULL and NORMAL sync, 128 sessions, kill after 4 s
    python bench/kill_gateway.py --sync FULL --sessions 256 --seconds 6

The gateway (`polar-pl gateway`, its own process) runs in front of bench/gateway.py's fast mock
engine; each session streams chat calls back to back, one at a time, so its k-th call is the
record with call_index k. After --seconds the gateway is killed with SIGKILL and the store is
read back. Counted:

- phantom: records read `ok` whose response the client did not get to the end (target 0; with
  FULL, 269 of them before delivery marks);
- lost: responses a client got to the end with no `ok` record (target 0: the end of a response
  goes out only after its record is committed);
- undelivered: records the store reports as such (committed, the end never confirmed sent).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

from polar_pl.gateway.store.traces import read_records
from polar_pl.utils.serving import free_port

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def _wait_healthy(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not healthy")


async def _session(http: aiohttp.ClientSession, base: str, done: list[int]) -> None:
    """Calls back to back; `done` gets the index of each call received to its end."""
    k = 0
    while True:
        try:
            async with http.post(f"{base}/v1/chat/completions", json=BODY) as r:
                text = await r.text()
        except (TimeoutError, aiohttp.ClientError):
            return  # the gateway is gone
        if r.status == 200 and text.rstrip().endswith("data: [DONE]"):
            done.append(k)
        k += 1


async def _load(url: str, admin_token: str, sessions: int, seconds: float, gateway: subprocess.Popen):
    auth = {"authorization": f"Bearer {admin_token}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        made = []
        for _ in range(sessions):
            async with http.post(f"{url}/admin/sessions", json={}, headers=auth) as r:
                made.append(await r.json())
        done = {s["session_id"]: [] for s in made}
        tasks = [asyncio.create_task(_session(http, s["base_url"], done[s["session_id"]])) for s in made]
        await asyncio.sleep(seconds)
        gateway.send_signal(signal.SIGKILL)
        await asyncio.gather(*tasks)
    return done


def run(sync: str, sessions: int, seconds: float, tmp: Path) -> dict:
    engine_port, port = free_port(), free_port()
    engine = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("gateway.py")), "--serve-mock", str(engine_port)]
    )
    store, token_file = tmp / f"{sync}.db", tmp / f"{sync}.token"
    token_file.write_text("bench-admin-token")
    gateway = subprocess.Popen([
        sys.executable, "-m", "polar_pl.cli", "gateway", "--upstream", f"http://127.0.0.1:{engine_port}",
        "--port", str(port), "--store", str(store), "--store-sync", sync, "--no-token-faithful",
        "--model", "mock", "--admin-token-file", str(token_file),
    ], stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url)
        done = asyncio.run(_load(url, "bench-admin-token", sessions, seconds, gateway))
    finally:
        for p in (gateway, engine):
            if p.poll() is None:
                p.kill()
            p.wait()
    records = read_records(store)
    ok = {(r.session_id, r.call_index) for r in records if r.status == "ok"}
    got = {(sid, k) for sid, ks in done.items() for k in ks}
    return {
        "sync": sync, "sessions": sessions, "killed_after_s": seconds, "records": len(records),
        "responses received whole": len(got), "ok records": len(ok),
        "phantom (ok, not received)": len(ok - got), "lost (received, no ok record)": len(got - ok),
        "undelivered": sum(r.status == "undelivered" for r in records),
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sync", default="FULL,NORMAL")
    p.add_argument("--sessions", type=int, default=128)
    p.add_argument("--seconds", type=float, default=4.0)
    args = p.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory(prefix="polar-kill-") as tmp:
        for sync in args.sync.split(","):
            result = run(sync, args.sessions, args.seconds, Path(tmp))
            print(json.dumps(result))
            bad += result["phantom (ok, not received)"] + result["lost (received, no ok record)"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
