"""Sandbox and harness-launch latency, one table.

Per backend (local, local+bwrap, docker): start, exec (`true`), copy (put+get of a 1 MiB file and
a 200-file tree), diff, stop — medians over --reps. Per harness CLI and backend: the cost of one
launch, as `--version` (process start only) and as the full two-turn tool task through the real
gateway against a scripted engine (so the model's time is ~0 and what is left is the harness).

    python bench/sandbox.py [--reps 5] [--harness-reps 1] [--backends local,bwrap,docker] [--harnesses all]

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
from polar_pl.testing.smoke import PROMPT, script_for

REPO = Path(__file__).resolve().parents[1]
PREFIX = Path(os.environ.get("POLAR_HARNESS_PREFIX", REPO / ".cache" / "harness"))
OWNER = f"bench-{os.getpid()}"


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:8.1f}"


def make_factory(kind: str, stack: ExitStack):
    from polar_pl.sandbox.local import LocalSandbox

    if kind == "local":
        return lambda: LocalSandbox(owner=OWNER, harness_prefix=str(PREFIX))
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
    return lambda: DockerSandbox(image=image, docker_host=daemon.url, owner=OWNER, harness_prefix=str(PREFIX))


# 20 HTTP round trips to the gateway from inside the sandbox, timed inside (seconds per request):
# through the relay for bwrap and docker, direct for plain local.
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
            else [argv[0], "--version"]  # fmt: skip
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
    ap.add_argument("--backends", default="local,bwrap,docker")
    ap.add_argument("--harnesses", default="all")
    args = ap.parse_args()
    backends = args.backends.split(",")
    names = list(HARNESSES) if args.harnesses == "all" else args.harnesses.split(",")
    names = [n for n in names if build_harness(n).is_installed(PREFIX)]
    console = Console(width=150)

    from polar_pl.gateway.handle import Gateway
    from polar_pl.testing.scripted import serve_scripted

    class Script:
        reply = None

        def __call__(self, chat):
            return self.reply(chat)

    script = Script()
    model_dir = Path(os.environ.get("POLAR_TINY_MODEL", REPO / ".cache" / "tiny-model"))
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        engine = stack.enter_context(serve_scripted(script, model_dir=model_dir))
        gateway = stack.enter_context(
            Gateway([engine.url], Path(tmp) / "t.db", tokenizer_dir=model_dir, token_faithful=False)
        )
        factories = {b: make_factory(b, stack) for b in backends}

        ops = Table(title=f"sandbox operations, median ms over {args.reps} runs")
        ops.add_column("operation")
        results = {}
        for b in backends:
            ops.add_column(b, justify="right")
            results[b] = bench_backend(factories[b], args.reps, gateway.url)
        for op in results[backends[0]]:
            ops.add_row(op, *(_ms(results[b][op]) for b in backends))
        if "local" in results:
            for b in backends[1:]:
                ops.add_row(
                    f"start {b}/local",
                    "",
                    *(
                        f"{statistics.median(results[x]['start']) / statistics.median(results['local']['start']):7.1f}x"
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


if __name__ == "__main__":
    main()
