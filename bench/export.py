"""`polar-pl traces export` of a large store in bounded memory: peak RSS at 100 k and 1 M calls.

Builds trace stores of small calls (sessions of `--calls-per-session` calls, each prompt extending
the one before, so `prefix` merges each session into one row) in the store's own layout
(store/layout.py: `migrate`, `encode`, `INSERT`; one session encoded, then copied under each
session id and written with executemany: `append` would take one commit per call), then runs `polar-pl traces export` on
each in a child process and prints that child's peak RSS (`ru_maxrss` from wait4), next to the
store's size: the export streams (one cursor over the session index, rows written per session),
so the peak must not grow with the store.

    python bench/export.py                      # 100 k and 1 M calls
    python bench/export.py --calls 1e5,1e6,2e6 --out-format .parquet
    python bench/export.py --calls 1e5,3e5 --baseline-src /tmp/main   # + main's export, side by side
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from polar_pl.gateway.store import layout
from polar_pl.gateway.store.records import TraceRecord

SID = "@session@"  # 9 characters, like the session ids put in its place


def session_rows(per_session: int) -> list[tuple]:
    """The row values of one session's calls (`layout.encode`), its session id a placeholder:
    small calls, a 16-token system prompt, each call adding its response and 4 tokens."""
    prompt, out = list(range(10, 26)), []
    for i in range(per_session):
        resp = [1000 + i, 1001 + i, 2]
        rec = TraceRecord(
            session_id=SID, call_index=i, timestamp=float(i), provider="anthropic",
            raw_request={"model": "m", "max_tokens": 64}, raw_response="", normalized_request={"temperature": 1.0},
            prompt_ids=prompt, response_ids=resp, response_logprobs=[-0.5, -0.25, -0.125], finish_reason="stop",
            policy_version=0, latency_s=0.01, group_id="g", rollout_id=SID,
        )  # fmt: skip
        out.append((i, float(i), *layout.encode(rec)))
        prompt = [*prompt, *resp, 3, 4, 5, 6]
    return out


def build_store(path: Path, calls: int, per_session: int, chunk: int = 50_000) -> None:
    """`calls` calls in sessions of `per_session`, written with executemany in chunks."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    layout.migrate(conn)
    template, rows = session_rows(per_session), []
    placeholder = SID.encode()
    for n in range(0, calls, per_session):
        sid = f"s{n // per_session:08d}"
        for i, ts, status, data, *blobs in template[: calls - n]:
            rows.append((sid, i, ts, status, data.replace(placeholder, sid.encode()), *blobs))
        if len(rows) >= chunk:
            conn.executemany(layout.INSERT, rows)
            rows = []
    conn.executemany(layout.INSERT, rows)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def export(store: Path, out: Path, src: str | None = None) -> tuple[float, float, str]:
    """Seconds, the child's peak RSS in MiB, and its last output line (src: another checkout's
    export, e.g. main's, for comparison)."""
    cmd = [sys.executable, "-m", "polar_pl.cli", "traces", "export", "--store", str(store), "--out", str(out)]
    t = time.perf_counter()
    env = {**os.environ, **({"PYTHONPATH": str(Path(src) / "src")} if src else {})}
    proc = subprocess.Popen(
        [*cmd, "--max-session-rows", "3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
    )
    output = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"export of {store} exited {proc.returncode}:\n{output}")
    return time.perf_counter() - t, usage.ru_maxrss / 1024, output.strip().splitlines()[-1].split(" to ")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", default="1e5,1e6", help="comma-separated store sizes (calls)")
    ap.add_argument("--calls-per-session", type=int, default=10)
    ap.add_argument("--out-format", default=".jsonl", choices=(".jsonl", ".parquet"))
    ap.add_argument(
        "--baseline-src", default=None, metavar="DIR", help="also export with this checkout's code"
    )
    args = ap.parse_args()
    console = Console(width=160)
    table = Table(title=f"traces export (merge=prefix, {args.out_format}): peak RSS of the export process")
    for col in (
        "code",
        "calls",
        "sessions",
        "store MiB",
        "build s",
        "export s",
        "output MiB",
        "peak RSS MiB",
        "printed",
    ):
        table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory(prefix="polar-bench-export-") as tmp:
        for n in (int(float(x)) for x in args.calls.split(",")):
            store, out = Path(tmp) / f"traces-{n}.db", Path(tmp) / f"rows-{n}{args.out_format}"
            t = time.perf_counter()
            build_store(store, n, args.calls_per_session)
            built = time.perf_counter() - t
            for src in (None, args.baseline_src) if args.baseline_src else (None,):
                secs, rss, last = export(store, out, src)
                table.add_row(
                    Path(src).name if src else "this", f"{n:,}", f"{-(-n // args.calls_per_session):,}",
                    f"{store.stat().st_size / 2**20:.0f}", f"{built:.1f}", f"{secs:.1f}",
                    f"{out.stat().st_size / 2**20:.0f}", f"{rss:.0f}", last,
                )  # fmt: skip
            store.unlink()
            out.unlink()
    console.print(table)


if __name__ == "__main__":
    main()
