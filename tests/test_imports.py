"""The arrows that must never exist (docs/architecture.md, "The parts"), checked on the source: every import
statement in src/polar_pl, at any depth (function-level imports count too), resolved to the
polar_pl package it names. The training path's packages import one way, datamodule -> rollout ->
trajectory -> gateway, and no module imports itself back through others."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import polar_pl

SRC = Path(polar_pl.__file__).parent

# package -> packages it must never import (the values are top-level packages of polar_pl).
PARTS = {
    "chat",
    "datamodule",
    "engine",
    "gateway",
    "harness",
    "module",
    "rollout",
    "sandbox",
    "sft",
    "tasks",
    "testing",
    "trajectory",
}
FORBIDDEN: dict[str, set[str]] = {
    "gateway": PARTS - {"gateway", "chat"},  # it serves any client, trainer or not
    # where sessions run knows nothing of the training math, nor of the DataModule that consumes it,
    # nor of the training entry point that builds both (issue 57: rollout serve built its runtime
    # through training.build_parts)
    "rollout": {"module", "datamodule", "training"},
    "trajectory": {"datamodule", "rollout", "module", "engine", "harness", "sandbox", "tasks"},
    "chat": PARTS - {"chat"},
}


def _module_name(path: Path) -> str:
    parts = ("polar_pl",) + path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> set[str]:
    """Every polar_pl module that `path` (the source of `module`) imports, relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return {m for m in found if m == "polar_pl" or m.startswith("polar_pl.")}


def _top(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _graph() -> dict[str, set[str]]:
    return {
        _module_name(p): _imports(p, _module_name(p))
        for p in sorted(SRC.rglob("*.py"))
        if "builtin/repos" not in str(p)
    }


def test_no_product_module_imports_the_testing_package():
    bad = [
        f"{m} imports {t}"
        for m, targets in _graph().items()
        if _top(m) != "testing"
        for t in targets
        if _top(t) == "testing"
    ]
    assert not bad, bad


def test_no_product_module_imports_the_warm_starts():
    """The learning checks' warm-started models are built before a run (`polar-pl warm-start`,
    registered by name in cli.py), never by it: training, rollouts, evaluation, SFT and the parts
    under them import nothing from warmstart/ (issue 29)."""
    bad = [
        f"{m} imports {t}"
        for m, targets in _graph().items()
        if _top(m) != "warmstart"
        for t in targets
        if _top(t) == "warmstart"
    ]
    assert not bad, bad


def test_forbidden_arrows_do_not_exist():
    bad = [
        f"{m} imports {t}"
        for m, targets in _graph().items()
        for t in targets
        if _top(t) in FORBIDDEN.get(_top(m) or "", set())
    ]
    assert not bad, bad


def _is_entry_point(module: str) -> bool:
    """A command line composes the packages under it (`eval.cli` runs an evaluation, `rollout.cli`
    builds a runtime from a training config); it is a root, never imported by a library module, so
    it is left out of the package order."""
    last = module.rsplit(".", 1)[-1]
    return last == "__main__" or last == "cli" or last.endswith("_cli")


def _assert_no_circle(graph: dict[str, set[str]], what: str) -> None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"{what} circle: {' -> '.join(e.args[1])}") from None


def test_no_module_imports_itself_back():
    graph = _graph()
    _assert_no_circle({m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}, "import")


def test_packages_import_one_way():
    """Package to package, library modules only: no circle (datamodule -> rollout -> trajectory -> gateway)."""
    order: dict[str, set[str]] = {}
    for m, targets in _graph().items():
        if _is_entry_point(m):
            continue
        for t in targets:
            if _top(m) and _top(t) and _top(t) != _top(m):
                order.setdefault(_top(m), set()).add(_top(t))
    _assert_no_circle(order, "package")


def test_the_walk_sees_function_level_and_relative_imports(tmp_path):
    """The checks above are only as good as the walk: a deferred import inside a function and a
    relative import must both be seen."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f():\n    from polar_pl.sandbox.local import LocalSandbox\n    from ..engine import x\n"
    )
    found = _imports(probe, "polar_pl.gateway.call.probe")
    assert "polar_pl.sandbox.local" in found
    assert "polar_pl.gateway.engine.x" in found
    assert _top("polar_pl.gateway.engine.x") == "gateway"


# Where a trainer's DataModule may be read: the one accessor (`rollout.runtime.feed_of`, typed as the
# `RolloutFeed` Protocol) and the DataModule's own callback.
READS_DATAMODULE = {"polar_pl.rollout.runtime", "polar_pl.datamodule.datamodule"}


def _names_a_trainer(node: ast.expr) -> bool:
    """`trainer`, `self.trainer`, `self._trainer`, ... (a config's `cfg.datamodule` is not one)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.endswith("trainer")


def test_the_datamodule_is_read_in_one_place_and_typed():
    """The module and the callbacks read the DataModule through `feed_of` (issue 57: eleven
    `getattr(trainer.datamodule, ...)` calls with defaults, unchecked by mypy); nothing reaches it
    by `getattr(x, "datamodule")` or `x.datamodule` anywhere else."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            by_attribute = (
                isinstance(node, ast.Attribute) and node.attr == "datamodule" and _names_a_trainer(node.value)
            )
            by_getattr = (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and any(isinstance(a, ast.Constant) and a.value == "datamodule" for a in node.args)
            )
            if by_getattr or (by_attribute and module not in READS_DATAMODULE):
                bad.append(f"{module}:{node.lineno}")
    assert not bad, bad
