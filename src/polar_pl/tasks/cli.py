"""`polar-pl tasks`: list a task source, run the suite's self-check, export SWE-bench JSONL.

polar-pl tasks list [--source builtin|learnable|swebench|harbor --data-files F] [DIR]
polar-pl tasks check [--ids calc-1 ...] [--difficulty hard] [--sandbox local|docker] [--runner pytest]
                     [--json OUT]
polar-pl tasks check --source harbor [DIR]   (solution/solve.sh passes, the empty attempt fails)
polar-pl tasks export --out suite.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from polar_pl.tasks.sources import BuiltinTaskSource, SWEBenchTaskSource, TaskSource
from polar_pl.tasks.task import Task


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tasks_command", required=True)
    for name, help_text in (
        ("list", "list the tasks of a source"),
        ("check", "self-check: reference patches resolve, unpatched repositories fail"),
        ("export", "write the tasks as SWE-bench-format JSONL"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--source", choices=("builtin", "learnable", "swebench", "harbor"), default="builtin")
        p.add_argument("path", nargs="?", help="--source harbor: a task folder or a folder of them")
        p.add_argument("--data-files", nargs="+", help="JSONL / parquet files for --source swebench")
        p.add_argument("--repos-dir", help="directory of owner__name checkouts for --source swebench")
        p.add_argument("--ids", nargs="+", help="only these instance ids")
        p.add_argument("--difficulty", nargs="+", choices=("easy", "medium", "hard"))
        p.add_argument(
            "--runner",
            choices=("unittest", "pytest"),
            default="unittest",
            help="test runner for the built-in suite (the same tests either way)",
        )
        if name == "check":
            p.add_argument("--sandbox", choices=("local", "docker"), default="local")
            p.add_argument("--docker-host", help="Docker engine URL (default: DOCKER_HOST)")
            p.add_argument("--image", default="polar-pl/sandbox:bookworm")
            p.add_argument("--workers", type=int, default=2)
            p.add_argument("--json", type=Path, help="also write the results here")
        if name == "export":
            p.add_argument("--out", type=Path, required=True)


def _source(args: argparse.Namespace) -> TaskSource:
    common = {"instance_ids": args.ids, "difficulty": args.difficulty}
    if args.source == "builtin":
        return BuiltinTaskSource(**common, runner=args.runner)
    if args.source == "harbor":
        from polar_pl.tasks.sources import HarborTaskSource

        return HarborTaskSource(args.path, **common)
    if args.source == "learnable":
        from polar_pl.tasks.learnable import LearnableTaskSource

        return LearnableTaskSource(**common)
    if not args.data_files:
        raise ValueError("--source swebench needs --data-files")
    return SWEBenchTaskSource(args.data_files, repos_dir=args.repos_dir, **common)


def _sandbox_factory(args: argparse.Namespace):
    if args.sandbox == "local":
        from polar_pl.sandbox.local import LocalSandbox

        return lambda: LocalSandbox(owner="tasks-check")
    from polar_pl.sandbox.docker_factory import DockerSandboxes

    return DockerSandboxes(image=args.image, docker_host=args.docker_host, owner="tasks-check")


def run(args: argparse.Namespace) -> int:
    console = Console(width=None if sys.stdout.isatty() else 140)
    try:
        source = _source(args)
        tasks = source.tasks()
    except (ValueError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    if args.tasks_command == "check" and args.source == "harbor":
        if args.sandbox != "docker":
            console.print("[red]error:[/red] Harbor tasks run in their own images: use --sandbox docker")
            return 2
        return _check_harbor(console, source, tasks, args)
    if args.tasks_command == "list":
        _list(console, tasks)
        return 0
    if args.tasks_command == "export":
        _export(tasks, args.out)
        console.print(f"wrote {len(tasks)} tasks to {args.out}")
        return 0
    return _check(console, source, tasks, args)


def _list(console: Console, tasks: list[Task]) -> None:
    table = Table(title=f"{len(tasks)} tasks")
    for col in ("instance_id", "difficulty", "repo", "F2P", "P2P", "problem"):
        table.add_column(col)
    for t in tasks:
        first_line = t.problem_statement.strip().splitlines()[0][:70]
        table.add_row(
            t.instance_id,
            t.difficulty or "-",
            t.repo or "-",
            str(len(t.fail_to_pass)),
            str(len(t.pass_to_pass)),
            first_line,
        )
    console.print(table)


def _export(tasks: list[Task], out: Path) -> None:
    with out.open("w") as f:
        for t in tasks:
            row = {
                "instance_id": t.instance_id,
                "repo": t.repo,
                "base_commit": t.base_commit,
                "problem_statement": t.problem_statement,
                "patch": t.patch,
                "test_patch": t.test_patch,
                "FAIL_TO_PASS": json.dumps(list(t.fail_to_pass)),
                "PASS_TO_PASS": json.dumps(list(t.pass_to_pass)),
                "setup_commands": list(t.setup_commands),
                "test_runner": t.test_runner,
                "repo_path": t.repo_path,
                "difficulty": t.difficulty,
                "image": t.image,
                "image_context": t.image_context,
            }
            f.write(json.dumps(row) + "\n")


def _check(console: Console, source: TaskSource, tasks: list[Task], args: argparse.Namespace) -> int:
    from polar_pl.tasks.evaluator import SandboxEvaluator
    from polar_pl.tasks.suite_check import check_suite

    if missing := [t.instance_id for t in tasks if not t.patch.strip()]:
        console.print(
            f"[red]error:[/red] no reference patch to check for {missing[:5]} ({len(missing)} tasks)"
        )
        return 2
    evaluator = source.make_evaluator(_sandbox_factory(args))
    assert isinstance(evaluator, SandboxEvaluator)  # tasks with a reference patch are scored in a sandbox
    t0 = time.monotonic()
    try:
        checks = check_suite(tasks, evaluator, workers=args.workers)
    finally:
        evaluator.close()
    wall = time.monotonic() - t0
    table = Table(title=f"suite self-check ({args.sandbox} sandbox, {args.workers} workers)")
    for col in ("instance_id", "difficulty", "reference patch", "unpatched F2P failing", "P2P", "check s"):
        table.add_column(col)
    for c in checks:
        counts = c.unpatched.counts()
        ref = f"{c.reference.status} ({c.reference.duration_s + c.reference.prewarm_s:.1f}s)"
        f2p_failing = f"{counts['f2p_total'] - counts['f2p_passed']}/{counts['f2p_total']}"
        p2p = f"{counts['p2p_passed']}/{counts['p2p_total']}"
        style = "" if c.ok else "red"
        table.add_row(
            c.task.instance_id,
            c.task.difficulty or "-",
            ref,
            f2p_failing,
            p2p,
            f"{c.seconds:.1f}",
            style=style,
        )
    console.print(table)
    bad = [c for c in checks if not c.ok]
    for c in bad:
        console.print(f"[red]{c.task.instance_id}[/red]: {c.problem()}")
    console.print(f"{len(checks) - len(bad)}/{len(checks)} tasks ok in {wall:.1f}s wall")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "instance_id": c.task.instance_id,
                        "difficulty": c.task.difficulty,
                        "ok": c.ok,
                        "seconds": round(c.seconds, 3),
                        "reference": c.reference.to_dict(),
                        "unpatched": c.unpatched.to_dict(),
                    }
                    for c in checks
                ],
                indent=2,
            )
        )
    return 0 if not bad else 1


def _check_harbor(console: Console, source: TaskSource, tasks: list[Task], args: argparse.Namespace) -> int:
    from polar_pl.tasks.harbor_verifier import HarborVerifier
    from polar_pl.tasks.suite_check import check_harbor

    factory = _sandbox_factory(args)
    verifier = source.make_evaluator(factory)
    assert isinstance(verifier, HarborVerifier)  # HarborTaskSource's evaluator
    t0 = time.monotonic()
    try:
        checks = check_harbor(tasks, verifier, workers=args.workers)
    finally:
        verifier.close()
        factory.close()
    table = Table(title=f"Harbor self-check ({len(tasks)} tasks, {args.workers} workers)")
    for col in ("task", "solution", "empty attempt", "check s"):
        table.add_column(col)
    for c in checks:
        ref, empty = c.reference, c.unpatched
        table.add_row(
            c.task.instance_id,
            f"{ref.status} ({ref.reward:g})",
            f"{empty.status} ({empty.reward:g})",
            f"{c.seconds:.1f}",
            style="" if c.ok else "red",
        )
    console.print(table)
    bad = [c for c in checks if not c.ok]
    for c in bad:
        console.print(f"[red]{c.task.instance_id}[/red]: {c.problem()}")
    console.print(f"{len(checks) - len(bad)}/{len(checks)} tasks ok in {time.monotonic() - t0:.1f}s wall")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "instance_id": c.task.instance_id,
                        "ok": c.ok,
                        "seconds": round(c.seconds, 3),
                        "solution": c.reference.to_dict(),
                        "empty": c.unpatched.to_dict(),
                    }
                    for c in checks
                ],
                indent=2,
            )
        )
    return 0 if not bad else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="polar-pl tasks")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
