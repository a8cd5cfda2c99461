"""`polar-pl traces export`: trace store -> trajectory rows (JSONL or parquet) and merge stats.

    polar-pl traces export --store runs/traces.db --merge prefix --out rows.jsonl
    polar-pl traces export --store runs/traces.db --merge per_request --out rows.parquet

The builder comes from the Hydra group file conf/merge/<name>.yaml (`_target_`; package data
of polar_pl.conf, so an installed wheel has it too), so the export merges exactly as training does. Rewards are not in the store; `--rewards FILE` (JSON object
session id -> reward) attaches them. Prints per-session and batch stats: calls, rows, compression
ratio (per-call tokens / row tokens), breaks by kind.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from dataclasses import asdict, replace
from importlib import resources
from pathlib import Path
from typing import Any, Self

import orjson
from rich.console import Console
from rich.table import Table

from polar_pl.gateway.store.records import TraceRecord
from polar_pl.trajectory import BreakKind, MergeStats, TrajectoryBuilder
from polar_pl.trajectory.rows import TrajectoryRow

CONF_MERGE = resources.files("polar_pl.conf") / "merge"
FORMATS = (".jsonl", ".parquet")


def merge_choices() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in CONF_MERGE.iterdir() if p.name.endswith(".yaml"))


def load_builder(name: str) -> TrajectoryBuilder:
    """Instantiate conf/merge/<name>.yaml; ValueError naming the allowed values otherwise."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    path = CONF_MERGE / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"merge={name!r}: allowed {merge_choices()}")
    return instantiate(OmegaConf.create(path.read_text()))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="traces_command", required=True)
    ex = sub.add_parser("export", help="merge the store's records into rows and write them")
    ex.add_argument("--store", required=True, help="trace store (SQLite file written by the gateway)")
    ex.add_argument(
        "--merge", default="prefix", choices=merge_choices() or None, help="conf/merge/<name>.yaml"
    )
    ex.add_argument("--out", required=True, help="output file: .jsonl or .parquet")
    ex.add_argument("--session", action="append", default=None, help="only this session (repeatable)")
    ex.add_argument("--rewards", default=None, help="JSON file: {session_id: reward}")
    ex.add_argument("--stats-json", default=None, help="also write the stats as JSON here")
    ex.add_argument("--max-session-rows", type=int, default=50, help="per-session lines printed (0: none)")
    ex.add_argument(
        "--compare-rendered",
        action="store_true",
        help="also print the stats had the plain re-renders been used (token-faithful off): drift made visible",
    )


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    try:
        return _export(args)
    except (ValueError, OSError, sqlite3.Error) as exc:
        err.print(f"[red]traces export:[/red] {exc}")
        return 2


def _export(args: argparse.Namespace) -> int:
    """Streams: one session's records and rows in memory at a time, written as they are built
    (a 1 M-call store exports in the memory of a 100 k-call one, bench/export.py)."""
    out = Path(args.out)
    if out.suffix not in FORMATS:
        raise ValueError(f"--out {out}: the extension must be one of {FORMATS}")
    store = Path(args.store)
    if not store.is_file():
        raise ValueError(f"--store {store}: no such file")
    rewards = _read_rewards(args.rewards) if args.rewards else {}
    builder = load_builder(args.merge)
    keep_all = bool(args.stats_json)  # per-session stats of every session only when asked for
    per_session: dict[str, MergeStats] = {}
    plain: dict[str, MergeStats] = {}
    total = plain_total = MergeStats()
    written = 0

    from polar_pl.gateway.store.traces import TraceReader

    out.parent.mkdir(parents=True, exist_ok=True)
    with TraceReader(store) as reader, RowWriter(out) as writer:
        for sid, recs in reader.iter_sessions(args.session, packed=True):
            res = builder.build(recs, reward=rewards.get(sid, 0.0))
            writer.write(res.rows)
            written += len(res.rows)
            total += res.stats
            if keep_all or len(per_session) < args.max_session_rows:
                per_session[sid] = res.stats
            if args.compare_rendered:
                st = builder.build(plain_renders(recs)).stats
                plain_total += st
                if len(plain) < args.max_session_rows:
                    plain[sid] = st
    if args.stats_json:
        stats = {"batch": stats_dict(total), "sessions": {s: stats_dict(v) for s, v in per_session.items()}}
        Path(args.stats_json).write_text(json.dumps(stats, indent=1))
    _print_stats(per_session, total, f"merge={args.merge}", args.max_session_rows)
    if args.compare_rendered:
        title = f"merge={args.merge}, plain re-renders (token-faithful off)"
        _print_stats(plain, plain_total, title, args.max_session_rows)
    Console(soft_wrap=True).print(f"wrote {written} rows to {out}")
    return 0


def _read_rewards(path: str) -> dict[str, float]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not all(isinstance(v, int | float) for v in data.values()):
        raise ValueError(f"--rewards {path}: expected a JSON object {{session_id: number}}")
    return {str(k): float(v) for k, v in data.items()}


def stats_dict(s: MergeStats) -> dict[str, Any]:
    d = asdict(s)
    d["breaks"] = {k.value: s.breaks.get(k.value, 0) for k in BreakKind}
    d["compression_ratio"] = s.compression_ratio
    d["calls_per_row"] = s.calls_per_row
    return d


_ROW_FIELDS = tuple(TrajectoryRow.__dataclass_fields__)
_SCHEMA_FIELDS = (
    ("input_ids", "int32"),
    ("loss_mask", "int8"),
    ("behavior_logprobs", "float64"),
    ("policy_version", "int32"),
    ("session_id", "string"),
    ("rollout_id", "string"),
    ("group_id", "string"),
    ("reward", "float64"),
    ("call_indices", "int32"),
    ("harness", "string"),
    ("status", "string"),
    ("meta", "string"),
)
_LISTS = {"input_ids", "loss_mask", "behavior_logprobs", "policy_version", "call_indices"}


def _row_dict(row: TrajectoryRow) -> dict[str, Any]:
    """The row's fields, token fields as they are (lists or arrays: no deep copy of each row)."""
    d = {f: getattr(row, f) for f in _ROW_FIELDS}
    d["call_indices"] = list(row.call_indices)
    return d


class RowWriter:
    """Rows appended to a JSONL or parquet file as they come (parquet: one row group a batch)."""

    def __init__(self, out: Path, batch: int = 1024) -> None:
        self.out, self.batch = out, batch
        self._pending: list[TrajectoryRow] = []
        self._file = open(out, "wb") if out.suffix == ".jsonl" else None
        self._parquet: Any = None  # a pyarrow ParquetWriter once the first batch is written

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(self, rows: list[TrajectoryRow]) -> None:
        if self._file is not None:
            self._file.writelines(
                orjson.dumps(_row_dict(r), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for r in rows
            )
            return
        self._pending.extend(rows)
        if len(self._pending) >= self.batch:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema(
            [
                (n, pa.list_(pa.type_for_alias(t)) if n in _LISTS else pa.type_for_alias(t))
                for n, t in _SCHEMA_FIELDS
            ]
        )
        # meta is free-form: stored as a JSON string so the schema does not depend on its keys
        recs = [_row_dict(r) | {"meta": orjson.dumps(r.meta).decode()} for r in self._pending]
        self._pending = []
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(self.out, schema)
        self._parquet.write_table(pa.Table.from_pylist(recs, schema=schema))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            return
        if self._pending or self._parquet is None:  # an empty export is still a readable file
            self._flush()
        self._parquet.close()


def read_rows(path: str | Path) -> list[TrajectoryRow]:
    """Rows back from an export (JSONL or parquet)."""
    path = Path(path)
    if path.suffix == ".jsonl":
        dicts = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    else:
        import pyarrow.parquet as pq

        dicts = [d | {"meta": orjson.loads(d["meta"])} for d in pq.read_table(path).to_pylist()]
    return [TrajectoryRow(**(d | {"call_indices": tuple(d["call_indices"])})) for d in dicts]


def plain_renders(records: list[TraceRecord]) -> list[TraceRecord]:
    """The records as they would read with token-faithful prompts off: where the gateway spliced
    sampled ids in, the prompt is the plain re-render it kept in `rendered_prompt_ids`."""
    return [
        replace(r, prompt_ids=r.rendered_prompt_ids, rendered_prompt_ids=None)
        if r.rendered_prompt_ids is not None
        else r
        for r in records
    ]


def _print_stats(per_session: dict[str, MergeStats], total: MergeStats, title: str, limit: int) -> None:
    table = Table(title=title)
    cols = ["session", "calls", "rows", "call tokens", "row tokens", "ratio", *(k.value for k in BreakKind)]
    for c in cols:
        table.add_column(c, justify="left" if c == "session" else "right")

    def line(name: str, s: MergeStats) -> list[str]:
        return [
            name,
            str(s.calls),
            str(s.rows),
            str(s.call_tokens),
            str(s.row_tokens),
            f"{s.compression_ratio:.2f}",
            *(str(s.breaks.get(k.value, 0)) for k in BreakKind),
        ]

    for sid, s in list(per_session.items())[:limit]:
        table.add_row(*line(sid, s))
    if len(per_session) > limit:
        table.add_row(f"... {len(per_session) - limit} more", *[""] * (len(cols) - 1))
    table.add_section()
    table.add_row(*line(f"all ({total.sessions} sessions)", total))
    Console(width=max(160, Console().width)).print(table)


if __name__ == "__main__":
    from polar_pl.cli import main

    sys.exit(main(["traces", *sys.argv[1:]]))
