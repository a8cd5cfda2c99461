"""An evaluation's results as files: per-task rows, the summary (JSON and a Markdown table), a
plot; and the paired comparison of two evaluations of the same tasks.

    summary.json    pass@k estimates with intervals, attempt counts, the label
    summary.md      the same as a table
    tasks.jsonl     one line per task: id, valid attempts n, passed c, pass@k
    pass_at_k.png   pass@k with 95% intervals (compare: both models side by side)
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar_pl.eval.stats import Estimate, paired, per_task, summarize


@dataclass(frozen=True, slots=True)
class EvalReport:
    """label: what was evaluated (before / after / a model name); counts: task -> (n valid, c passed)."""

    label: str
    n: int
    estimates: dict[int, Estimate]
    counts: dict[str, tuple[int, int]]
    statuses: dict[str, int] = field(default_factory=dict)
    infra_failures: int = 0

    @property
    def pass1(self) -> dict[str, float]:
        return per_task(self.counts, 1)

    def metrics(self, prefix: str) -> dict[str, float]:
        """Flat metrics for a logger: <prefix>/pass@k, its interval, attempts and infra failures."""
        out: dict[str, float] = {}
        for k, est in self.estimates.items():
            out.update(
                {
                    f"{prefix}/pass@{k}": est.mean,
                    f"{prefix}/pass@{k}_low": est.low,
                    f"{prefix}/pass@{k}_high": est.high,
                }
            )
        out[f"{prefix}/tasks"] = float(len(self.counts))
        out[f"{prefix}/infra_failures"] = float(self.infra_failures)
        return out

    def table(self) -> str:
        return table([self])

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "n": self.n,
            "tasks": len(self.counts),
            "attempts": sum(n for n, _ in self.counts.values()),
            "passed": sum(c for _, c in self.counts.values()),
            "infra_failures": self.infra_failures,
            "statuses": self.statuses,
            "pass_at_k": {str(k): e.to_dict() for k, e in self.estimates.items()},
        }

    def write(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        (out / "summary.md").write_text(self.table() + "\n", encoding="utf-8")
        lines = []
        for task, (n, c) in sorted(self.counts.items()):
            row: dict[str, Any] = {"task_id": task, "n": n, "c": c}
            row.update(
                {f"pass@{k}": v[task] for k in self.estimates if task in (v := per_task({task: (n, c)}, k))}
            )
            lines.append(json.dumps(row))
        (out / "tasks.jsonl").write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
        plot([self], out / "pass_at_k.png")


def table(reports: list[EvalReport]) -> str:
    """A Markdown table, one row per report, a column per pass@k they all have."""
    ks = [k for k in reports[0].estimates if all(k in r.estimates for r in reports)]
    lines = [
        "| model | tasks | n | " + " | ".join(f"pass@{k} % [95% CI]" for k in ks) + " |",
        "|---|---|---|" + "---|" * len(ks),
    ]
    for r in reports:
        cells = " | ".join(str(r.estimates[k]) for k in ks)
        lines.append(f"| {r.label} | {len(r.counts)} | {r.n} | {cells} |")
    return "\n".join(lines)


def build_report(logbook: Any, spec: Any, label: str) -> EvalReport:
    """The report of an evaluation log (`RolloutLog` groups of `run.group_record`s)."""
    groups = list(logbook.groups.values())
    attempts = [a for g in groups for a in g["attempts"]]
    counts = counts_of(groups)
    infra = sum(not a["valid"] for a in attempts)
    statuses = Counter(a["status"] for a in attempts)
    return EvalReport(label, spec.n, summarize(counts, spec.ks), counts, dict(statuses), infra)


@dataclass(frozen=True, slots=True)
class Comparison:
    """B against A on the tasks both evaluated: the paired difference of pass@1."""

    a: EvalReport
    b: EvalReport
    diff: Estimate

    def table(self) -> str:
        return (
            f"{table([self.a, self.b])}\n\npaired difference of pass@1 ({self.b.label} - {self.a.label}) "
            f"over {self.diff.tasks} tasks: {self.diff} points (95% CI)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a.to_dict(), "b": self.b.to_dict(), "pass@1_diff": self.diff.to_dict()}

    def write(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "comparison.json").write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        (out / "comparison.md").write_text(self.table() + "\n", encoding="utf-8")
        plot([self.a, self.b], out / "comparison.png")


def compare(a: EvalReport, b: EvalReport) -> Comparison:
    return Comparison(a, b, paired(a.pass1, b.pass1))


def load_report(out: Path) -> EvalReport:
    """An evaluation's report back from its directory (summary.json + tasks.jsonl)."""
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    counts = {}
    for line in (out / "tasks.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        counts[row["task_id"]] = (int(row["n"]), int(row["c"]))
    ks = [int(k) for k in summary["pass_at_k"]]
    return EvalReport(
        summary["label"],
        int(summary["n"]),
        summarize(counts, ks),
        counts,
        summary.get("statuses", {}),
        int(summary.get("infra_failures", 0)),
    )


def plot(reports: Iterable[EvalReport], path: Path) -> None:
    """pass@k bars with their 95% intervals, one colour per report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = list(reports)
    ks = sorted({k for r in reports for k in r.estimates})
    fig, ax = plt.subplots(figsize=(2 + 1.6 * len(ks) * len(reports), 3.2))
    width = 0.8 / len(reports)
    for i, r in enumerate(reports):
        xs = [j + (i - (len(reports) - 1) / 2) * width for j in range(len(ks))]
        est = [r.estimates.get(k) for k in ks]
        means = [100 * e.mean if e else float("nan") for e in est]
        errs = _errors(est)
        ax.bar(xs, means, width, yerr=errs, capsize=3, label=f"{r.label} ({len(r.counts)} tasks, n={r.n})")
    ax.set_xticks(range(len(ks)), [f"pass@{k}" for k in ks])
    ax.set_ylabel("% of tasks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _errors(estimates: list[Estimate | None]) -> list[list[float]]:
    lows = [100 * (e.mean - e.low) if e else 0.0 for e in estimates]
    highs = [100 * (e.high - e.mean) if e else 0.0 for e in estimates]
    return [lows, highs]


def counts_of(records: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """task id -> (valid attempts, passed) of `run.group_record`s."""
    out = {}
    for g in records:
        valid = [a for a in g["attempts"] if a["valid"]]
        out[g["task_id"]] = (len(valid), sum(a["passed"] for a in valid))
    return out
