"""Sandbox and harness-launch latency, one table.

Per backend (unsafe_local, bwrap, docker): start, exec (`true`), copy (put+get of a 1 MiB file and
a 200-file tree), diff, stop — medians over --reps. Per harness CLI and backend: the cost of one
launch, as `--version` (process start only) and as the full two-turn tool task through the real
gateway against a scripted engine (so the model's time is ~0 and what is left is the harness).

    python bench/sandbox.py [--reps 5] [--harness-reps 1] [--backends unsafe_local,bwrap,docker,docker-tls]
                            [--harnesses all] [--images-sessions 32]

`docker-tls` is a second private dockerd reached over TCP 127.0.0.1 with mutual TLS (a remote host:
tools from a volume, the gateway through the exec-stream relay). Per-task images: time-to-READY of
--images-sessions sessions over 4 images pulled from a local registry, with and without prefetch
(sandbox_images.py); --images-sessions 0 skips it.

Numbers are wall-clock on whatever else the machine runs: compare columns of one run, not runs.

Docker: a private dockerd is started (root) under .cache/dockerd and stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.table import Table

from polar_pl.harness import HARNESSES, build_harness
from polar_pl.harness.protocol import GatewaySession
from polar_pl.harness.run import run_harness, sandbox_paths
from polar_pl.testing.smoke import PROMPT, script_for, smoke_gateway

REPO = Path(__file__).resolve().parents[1]
PREFIX = Path(os.environ.get("POLAR_HARNESS_PREFIX", REPO / ".cache" / "harness"))
OWNER = f"bench-{os.getpid()}"


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:8.1f}"


def make_factory(kind: str, stack: ExitStack):
    from polar_pl.sandbox.local import LocalSandbox

    if kind == "unsafe_local":
        return lambda: LocalSandbox(isolation="none", owner=OWNER, harness_prefix=str(PREFIX))
    if kind == "bwrap":
        return lambda: LocalSandbox(isolation="bwrap", owner=OWNER, harness_prefix=str(PREFIX))
    import docker

    from polar_pl.sandbox.docker import DockerSandbox
    from polar_pl.sandbox.dockerd import DockerDaemon
    from polar_pl.sandbox.image import build_image

    daemon = stack.enter_context(DockerDaemon(root=REPO / ".cache" / "dockerd"))
    client = docker.DockerClient(base_url=daemon.url, timeout=600)
    image = build_image(client)
    client.close()
    if kind == "docker-tls":
        from polar_pl.sandbox.docker_factory import DockerSandboxes
        from polar_pl.testing.hosts import make_tls_certs, remote_dockerd

        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="polar-bench-tls-")))
        certs = make_tls_certs(tmp / "certs")
        remote = stack.enter_context(remote_dockerd(tmp / "root", certs))
        factory = DockerSandboxes(docker_hosts=[{"url": remote.tcp_url, "cert_path": certs.client_dir}],
                                  owner=OWNER, harness_prefix=str(PREFIX))  # fmt: skip
        stack.callback(factory.close)
        return factory
    return lambda: DockerSandbox(image=image, docker_host=daemon.url, owner=OWNER, harness_prefix=str(PREFIX))


# 20 HTTP round trips to the gateway from inside the sandbox, timed inside (seconds per request):
# through the relay for bwrap and docker, direct for unsafe_local.
ROUND_TRIPS = """
import sys, time, urllib.request
url = sys.argv[1]
urllib.request.urlopen(url).read()
t0 = time.perf_counter()
for _ in range(20):
    urllib.request.urlopen(url).read()
print((time.perf_counter() - t0) / 20)
"""


def bench_backend(make, reps: int, gateway_url: str) -> dict[str, list[float]]:
    ops = ("start", "exec", "put+get 1MiB", "put+get tree", "diff", "gateway GET", "stop")
    t: dict[str, list[float]] = {k: [] for k in ops}
    blob = os.urandom(1 << 20)
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        for i in range(200):
            (tree / f"d{i % 10}").mkdir(parents=True, exist_ok=True)
            (tree / f"d{i % 10}" / f"f{i}.py").write_text(f"x = {i}\n" * 20)
        for _ in range(reps):
            sb = make()
            t0 = time.perf_counter()
            sb.start()
            t["start"].append(time.perf_counter() - t0)
            for _ in range(3):
                t0 = time.perf_counter()
                sb.exec(["true"])
                t["exec"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sb.put_file("blob.bin", blob)
            assert sb.get_file("blob.bin") == blob
            t["put+get 1MiB"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sb.put_archive(tree, "tree")
            sb.get_archive("tree", Path(tmp) / f"out{len(t['stop'])}")
            t["put+get tree"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sb.diff()
            t["diff"].append(time.perf_counter() - t0)
            url = sb.expose_gateway(gateway_url)
            res = sb.exec(["python3", "-c", ROUND_TRIPS, f"{url}/health"], timeout=60)
            t["gateway GET"].append(float(res.stdout.strip() or "nan"))
            t0 = time.perf_counter()
            sb.stop()
            t["stop"].append(time.perf_counter() - t0)
    return t


def bench_harness(name: str, make, gateway, script) -> tuple[float, float, str]:
    """(seconds for --version, seconds for the two-turn task, status)."""
    harness = build_harness(name)
    sb = make()
    sb.start()
    try:
        paths = sandbox_paths(sb)
        session = GatewaySession(base_url="http://127.0.0.1:9/s/x", token="x", model="polar-tiny")
        argv = list(harness.plan(session, PROMPT, paths).argv)
        version_argv = [*argv[: argv.index(paths.home + "/.polar/mini_agent.py") + 1], "--help"] if name == "mini" \
            else [*harness.command(paths.harness_prefix), "--version"]  # fmt: skip
        if name == "mini":
            plan = harness.plan(session, PROMPT, paths)
            for path, data in plan.files.items():
                sb.put_file(path, data)
        t0 = time.perf_counter()
        sb.exec(version_argv, timeout=120)
        version_s = time.perf_counter() - t0
        script.reply = script_for(name, f"bench {name}")
        handle = gateway.create_session(task_id=f"bench-{name}", harness=name)
        run = run_harness(
            harness, sb, GatewaySession(handle.base_url, handle.token, "polar-tiny"), PROMPT, timeout=300
        )
        status = (
            "ok"
            if run.ok and sb.get_file("result.txt") == f"bench {name}".encode()
            else f"exit {run.exit_code}"
        )
        return version_s, run.duration_s, status
    finally:
        sb.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--harness-reps", type=int, default=1, help="launches per harness and backend (median)")
    ap.add_argument("--backends", default="unsafe_local,bwrap,docker")
    ap.add_argument("--harnesses", default="all")
    ap.add_argument("--images-sessions", type=int, default=32, help="per-task image sessions (0: skip)")
    args = ap.parse_args()
    backends = args.backends.split(",")
    names = list(HARNESSES) if args.harnesses == "all" else args.harnesses.split(",")
    names = [n for n in names if build_harness(n).is_installed(PREFIX)]
    console = Console(width=150)

    model_dir = Path(os.environ.get("POLAR_TINY_MODEL", REPO / ".cache" / "tiny-model"))
    with ExitStack() as stack:
        gateway, script = stack.enter_context(smoke_gateway(model_dir))
        factories = {b: make_factory(b, stack) for b in backends}

        ops = Table(title=f"sandbox operations, median ms over {args.reps} runs")
        ops.add_column("operation")
        results: dict[str, dict[str, list[float]]] = {b: {} for b in backends}
        for b in backends:
            ops.add_column(b, justify="right")
        for _ in range(args.reps):  # backends interleaved: a load change on the machine hits all alike
            for b in backends:
                for op, xs in bench_backend(factories[b], 1, gateway.url).items():
                    results[b].setdefault(op, []).extend(xs)
        for op in results[backends[0]]:
            ops.add_row(op, *(_ms(results[b][op]) for b in backends))
        if "unsafe_local" in results:
            for b in backends[1:]:
                ops.add_row(
                    f"start {b}/unsafe_local",
                    "",
                    *(
                        f"{statistics.median(results[x]['start']) / statistics.median(results['unsafe_local']['start']):7.1f}x"
                        if x == b
                        else ""
                        for x in backends[1:]
                    ),
                )
        console.print(ops)

        launches = Table(
            title=f"one harness launch, seconds, median of {args.harness_reps} (--version | two-turn task via gateway)"
        )
        launches.add_column("harness")
        for b in backends:
            launches.add_column(f"{b} --version", justify="right")
            launches.add_column(f"{b} task", justify="right")
        for name in names:
            row = [name]
            for b in backends:
                runs = [bench_harness(name, factories[b], gateway, script) for _ in range(args.harness_reps)]
                v, task = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
                status = next((r[2] for r in runs if r[2] != "ok"), "ok")
                row += [f"{v:6.2f}", f"{task:6.2f}" + ("" if status == "ok" else f" ({status})")]
            launches.add_row(*row)
            console.print(f"  {name} done", style="dim")
        console.print(launches)
    if args.images_sessions:
        bench_images(console, args.images_sessions)


def bench_images(console: Console, sessions: int) -> None:
    from sandbox_images import bench_ready, push_images

    from polar_pl.sandbox.docker_factory import DockerSandboxes
    from polar_pl.sandbox.dockerd import DockerDaemon
    from polar_pl.testing.hosts import LocalRegistry

    with ExitStack() as stack:
        daemon = stack.enter_context(DockerDaemon(root=REPO / ".cache" / "dockerd"))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="polar-bench-reg-")))
        registry = stack.enter_context(LocalRegistry(tmp))
        import docker

        from polar_pl.sandbox.image import build_image

        client = docker.DockerClient(base_url=daemon.url, timeout=600)
        base = build_image(client)
        client.close()
        names = push_images(daemon.url, base, registry, 4)

        def make():
            return DockerSandboxes(docker_host=daemon.url, registry=registry.address, owner=OWNER,
                                   docker_config=registry.docker_config, max_pulls=2, prefetch_tasks=4,
                                   harness_prefix="")  # fmt: skip

        table = Table(
            title=f"time to READY: {sessions} sessions over 4 per-task images (pulled, de-duplicated)"
        )
        for col in ("prefetch", "wall s", "READY p50 s", "READY max s", "image wait s (sum)",
                    "wait after 1st image s", "pulls"):  # fmt: skip
            table.add_column(col, justify="right")
        for prefetch in (False, True):
            r = bench_ready(make, daemon.url, names, registry, sessions=sessions, prefetch=prefetch)
            table.add_row("on" if prefetch else "off", *(f"{r[k]:.2f}" for k in ("wall_s", "ready_p50_s",
                          "ready_max_s", "image_wait_s", "wait_after_first_image_s")), str(r["pulls"]))  # fmt: skip
        console.print(table)


if __name__ == "__main__":
    main()
