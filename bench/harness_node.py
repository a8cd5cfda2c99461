"""What a Node CLI session costs on the harness prefix's Node against the machine's own `node`.

Each Node CLI (pi, Gemini CLI, Qwen Code, Codex's launcher) runs the two-turn tool task of
`polar_pl.testing.smoke` in a bwrap sandbox through the real gateway, against a scripted engine (the
model costs ~0): once started by `<prefix>/node/bin/node` (NODE_VERSION, as training runs it) and
once by its `#!/usr/bin/env node` line (the machine's Node), alternating, --reps times each. CPU is
the whole machine's busy time (/proc/stat) less this process's own (the gateway and the scripted
engine): the sandbox's processes, plus whatever else runs, so run it on an idle machine.

    python bench/harness_node.py [--reps 5] [--harnesses pi,gemini_cli,qwen_code,codex]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import time
from pathlib import Path

from polar_pl.harness import build_harness
from polar_pl.harness.base import NODE_VERSION, node_binary, node_installed
from polar_pl.harness.protocol import GatewaySession
from polar_pl.harness.run import run_harness
from polar_pl.sandbox.local import LocalSandbox
from polar_pl.testing.smoke import PROMPT, script_for, smoke_gateway

REPO = Path(__file__).resolve().parents[1]
PREFIX = Path(os.environ.get("POLAR_HARNESS_PREFIX", REPO / ".cache" / "harness")).resolve()


def others_cpu() -> float:
    """CPU seconds the machine spent outside this process since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait
    own = resource.getrusage(resource.RUSAGE_SELF)
    return busy - own.ru_utime - own.ru_stime


def one_session(name: str, on_node: bool, gateway, script) -> tuple[float, float]:
    """(CPU s, wall s) of one session; on_node=False starts the CLI by its shebang."""
    harness = build_harness(name)
    harness.on_node = on_node
    sb = LocalSandbox(isolation="bwrap", owner=f"bench-{os.getpid()}", harness_prefix=str(PREFIX))
    sb.start()
    try:
        script.reply = script_for(name, f"bench {name}")
        handle = gateway.create_session(task_id=f"bench-{name}", harness=name)
        cpu0, t0 = others_cpu(), time.perf_counter()
        run = run_harness(harness, sb, GatewaySession(handle.base_url, handle.token, "polar-tiny"), PROMPT,
                          timeout=300)  # fmt: skip
        cpu, wall = others_cpu() - cpu0, time.perf_counter() - t0
        if not (run.ok and sb.get_file("result.txt") == f"bench {name}".encode()):
            raise SystemExit(f"{name} (on_node={on_node}) failed: exit {run.exit_code}")
        return cpu, wall
    finally:
        sb.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--harnesses", default="pi,gemini_cli,qwen_code,codex")
    args = ap.parse_args()
    if not node_installed(PREFIX):
        raise SystemExit(
            f"no Node {NODE_VERSION} under {PREFIX}: polar-pl harness install all --prefix {PREFIX}"
        )
    machine = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True).stdout.strip()
    prefix = subprocess.run([node_binary(PREFIX), "--version"], capture_output=True, text=True, check=True)
    print(f"prefix Node {prefix.stdout.strip()} vs the machine's {machine}; bwrap; {args.reps} sessions each")

    model_dir = Path(os.environ.get("POLAR_TINY_MODEL", REPO / ".cache" / "tiny-model"))
    with smoke_gateway(model_dir) as (gateway, script):
        print(f"{'harness':12s} {'CPU s (machine)':>16s} {'CPU s (prefix)':>15s} {'ratio':>6s}"
              f" {'wall s (machine)':>17s} {'wall s (prefix)':>16s}")  # fmt: skip
        for name in args.harnesses.split(","):
            if not build_harness(name).is_installed(PREFIX):
                print(f"{name:12s} not installed")
                continue
            runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for i in range(args.reps):  # alternating, the order flipped each round
                for on_node in (i % 2 == 0, i % 2 == 1):
                    runs[on_node].append(one_session(name, on_node, gateway, script))
            cpu = {k: statistics.median(c for c, _ in v) for k, v in runs.items()}
            wall = {k: statistics.median(w for _, w in v) for k, v in runs.items()}
            print(f"{name:12s} {cpu[False]:16.2f} {cpu[True]:15.2f} {cpu[True] / cpu[False]:5.2f}x"
                  f" {wall[False]:17.2f} {wall[True]:16.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
