"""The warm-started model folders the learning checks train from: a tiny model (polar_pl.tinymodel)
fine-tuned before a run, never by it. `polar-pl warm-start <overrides>` (cli.py) builds the one a
training config names (`ensure_warm_model`); `python train.py` refuses to start without it
(polar_pl/preflight.py).

- `build_warm_model`: the generic warm start (chat and tool-call formats, chat_warmstart.py), the
  base every harness model starts from;
- `build_harness_model` / `ensure_harness_model`: a CLI harness's, trained inside that CLI's
  captured request (harness_warmstart.py), or the CLI learning check's, on the case task
  (harness_case.py);
- `build_multiturn_model`: the multi-turn check's, on the mini agent's note-taking sessions of the
  case task (multiturn_warmstart.py).

Each folder is built beside its destination and swapped in under a lock (utils/locks.py).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from polar_pl.pretrained.smollm2 import BUILD_RECORD as PRETRAINED_RECORD
from polar_pl.sandbox.image import default_harness_prefix
from polar_pl.tinymodel.build import BUILD_RECORD, build_tiny_model, init_tiny_model, save_tiny_model
from polar_pl.utils.locks import build_dir

WARM_BASE = "tiny-model-warm"  # the generic warm start every harness model starts from


def ensure_warm_model(cfg: DictConfig) -> Path:
    """The warm-started `model_dir` that `cfg.warm_start` describes, built if it is missing: a CLI
    harness's (trained inside that CLI's request; with `case`, the CLI learning check's) or the
    multi-turn check's (trained on the case task's note-taking sessions)."""
    ws = cfg.warm_start
    check_warm_start(ws)
    if ws.get("tools"):
        return ensure_tools_model(cfg)
    if ws.get("harness"):
        prefix = default_harness_prefix(cfg.sandbox.get("harness_prefix") or None)  # "": sandbox=docker's
        return ensure_harness_model(
            cfg.model_dir,
            ws.harness,
            cfg.model_cache,
            prefix,
            ws.minutes,
            case=ws.get("case"),
            case_base=ws.get("base"),
            extra_args=cfg.harness.get("extra_args") or (),
            case_steps=ws.get("case_steps", 600),
        )
    out = Path(cfg.model_dir)
    if (out / "config.json").exists():
        return out
    base = build_tiny_model(ws.base, if_missing=True)
    print(f"polar-pl: warm-starting the multi-turn check's model at {out} (once, ~1 CPU min)", flush=True)
    return build_multiturn_model(out, base, share=ws.multiturn_case, if_missing=True)


def check_warm_start(ws: DictConfig) -> None:
    """Refuse a `warm_start` value out of range before anything is built, naming its key."""
    if ws.get("tools"):
        for key in ("steps", "tasks", "lr"):
            if float(ws.tools.get(key, 0)) <= 0:
                raise ValueError(f"warm_start.tools.{key} must be positive, got {ws.tools.get(key)}")
    elif ws.get("harness"):
        if float(ws.get("minutes", 3.0)) <= 0:
            raise ValueError(f"warm_start.minutes must be positive, got {ws.minutes}")
        if ws.get("case") is not None and not 0.0 <= float(ws.case) <= 1.0:
            raise ValueError(f"warm_start.case must be in [0, 1], got {ws.case}")
        if int(ws.get("case_steps", 600)) < 1:
            raise ValueError(f"warm_start.case_steps must be positive, got {ws.case_steps}")
    elif not 0.0 <= float(ws.multiturn_case) <= 1.0:
        raise ValueError(f"warm_start.multiturn_case must be in [0, 1], got {ws.multiturn_case}")


def build_warm_model(
    out_dir: str | os.PathLike[str], seed: int = 0, minutes: float = 3.0, if_missing: bool = False
) -> Path:
    """The tiny model of `seed` fine-tuned for `minutes` on generated chat and tool-use
    conversations (chat_warmstart.py), so that its tool calls are well formed: the base of every
    harness model. if_missing: leave an existing model at `out_dir` as it is."""
    if minutes <= 0:
        raise ValueError(f"minutes must be positive, got {minutes}")
    return build_dir(out_dir, if_missing, lambda tmp: _build_warm_into(tmp, seed, minutes))


def _build_warm_into(out: Path, seed: int, minutes: float) -> None:
    from polar_pl.warmstart.chat_warmstart import warm_start

    started = time.monotonic()
    model, record = init_tiny_model(out, seed)
    record["warm_start"] = warm_start(model, out, seed=seed, minutes=minutes)
    save_tiny_model(model, out, record, started)


def build_harness_model(
    out_dir: str | os.PathLike[str],
    harness: str,
    base_dir: str | os.PathLike[str],
    harness_prefix: str | os.PathLike[str],
    seed: int = 0,
    minutes: float = 3.0,
    if_missing: bool = False,
    case: float | None = None,
    extra_args: Sequence[str] = (),
    case_steps: int = 600,
) -> Path:
    """A copy of the model at `base_dir` (a warm-started tiny model) fine-tuned for `harness`:
    the pinned CLI's real request is captured once, then the model is trained inside it
    (harness_warmstart.py). The captured request is kept as `harness_prompt.json`.
    case: instead, fine-tune on the `case` task with answers in the asked case with this
    probability per word (harness_case.py: the CLI learning check's start; any base will do),
    for `case_steps` steps.
    extra_args: the CLI's extra command-line arguments (harness.extra_args), which can change
    its request (Claude Code's --system-prompt, --tools); the request is captured with them.
    if_missing: leave an existing model at `out_dir` as it is (checked under the lock)."""
    if case is not None and not 0.0 <= case <= 1.0:
        raise ValueError(f"case must be in [0, 1], got {case}")
    if case_steps < 1:
        raise ValueError(f"case_steps must be positive, got {case_steps}")
    return build_dir(
        out_dir,
        if_missing,
        lambda tmp: _build_harness_into(
            tmp,
            harness,
            Path(base_dir),
            Path(harness_prefix),
            seed,
            minutes,
            case,
            tuple(extra_args),
            case_steps,
        ),
    )


def _build_harness_into(
    out: Path,
    harness: str,
    base: Path,
    prefix: Path,
    seed: int,
    minutes: float,
    case: float | None,
    extra_args: tuple[str, ...],
    case_steps: int,
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from polar_pl.warmstart.harness_capture import capture_harness_prompt
    from polar_pl.warmstart.harness_case import warm_start_case
    from polar_pl.warmstart.harness_warmstart import Schedule, warm_start_harness

    started = time.monotonic()
    if not (base / "config.json").exists():
        raise FileNotFoundError(f"no base model at {base} (polar-pl tiny-model --out {base})")
    prompt = capture_harness_prompt(harness, base, prefix, extra_args=extra_args)
    capture_s = time.monotonic() - started
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(base / name, out / name)
    tok = AutoTokenizer.from_pretrained(str(base))
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    if os.getloadavg()[0] >= (os.cpu_count() or 1):
        torch.set_num_threads(1)  # oversubscribed OpenMP threads spin-wait on each other
    try:
        if case is None:
            report = warm_start_harness(model, tok, prompt, seed=seed, schedule=Schedule(minutes=minutes))
        else:
            torch.set_num_threads(1)  # a 2-layer model: fixed steps, more threads only spin-wait
            report = warm_start_case(model, tok, prompt, share=case, seed=seed, steps=case_steps)
    finally:
        torch.set_num_threads(threads)
    (out / "harness_prompt.json").write_text(json.dumps(prompt.to_dict(), indent=1) + "\n", encoding="utf-8")
    base_record = json.loads((base / BUILD_RECORD).read_text()) if (base / BUILD_RECORD).exists() else {}
    record = {
        **base_record,
        "base": str(base),
        "harness_extra_args": list(extra_args),
        ("harness_warm_start" if case is None else "harness_case_warm_start"): {
            **report,
            "capture_seconds": round(capture_s, 1),
        },
    }
    save_tiny_model(model, out, record, started)


def ensure_harness_model(
    model_dir: str | os.PathLike[str],
    harness: str,
    cache_dir: str | os.PathLike[str],
    harness_prefix: str | os.PathLike[str] | None,
    minutes: float = 3.0,
    case: float | None = None,
    case_base: str | os.PathLike[str] | None = None,
    extra_args: Sequence[str] = (),
    case_steps: int = 600,
) -> Path:
    """The harness's warm-started model at `model_dir`, built on first use (with the generic warm
    start under `cache_dir` it starts from): what `python train.py harness=X experiment=cli_tiny`
    runs on.
    case: the CLI learning check's model instead (`build_harness_model`'s `case`), started from
    the plain tiny model at `case_base`. extra_args: the CLI's (`build_harness_model`); a model
    built for other ones is refused, since it was trained inside another request."""
    out = Path(model_dir)
    if (out / "config.json").exists():
        record = json.loads((out / BUILD_RECORD).read_text()) if (out / BUILD_RECORD).exists() else {}
        built = record.get("harness_extra_args", [])
        if list(extra_args) != built:
            raise ValueError(
                f"model_dir {out} was warm-started for {harness} with extra_args {built}, not "
                f"{list(extra_args)}: point model_dir elsewhere (or delete it to rebuild)"
            )
        return out
    if harness_prefix is None:
        raise ValueError(
            f"model_dir {out} is missing and building it needs the {harness} CLI: set "
            f"POLAR_HARNESS_PREFIX (polar-pl harness install {harness} --prefix DIR)"
        )
    if case is not None:
        base = build_tiny_model(case_base or Path(cache_dir) / "tiny-model", if_missing=True)
        print(
            f"polar-pl: warm-starting the {harness} learning check's model at {out} (once, ~2 CPU min)",
            flush=True,
        )
        return build_harness_model(
            out,
            harness,
            base,
            harness_prefix,
            case=case,
            extra_args=extra_args,
            case_steps=case_steps,
            if_missing=True,
        )
    base = Path(cache_dir) / WARM_BASE
    if not (base / "config.json").exists():
        print(f"polar-pl: building the warm-started tiny model at {base} (once, ~3 CPU minutes)", flush=True)
        build_warm_model(base, if_missing=True)
    print(
        f"polar-pl: warm-starting the tiny model for {harness} at {out} (once, ~{minutes:g} CPU minutes)",
        flush=True,
    )
    return build_harness_model(
        out, harness, base, harness_prefix, minutes=minutes, extra_args=extra_args, if_missing=True
    )


def ensure_tools_model(cfg: DictConfig) -> Path:
    """`cfg.model_dir` after the tool cold start that `cfg.warm_start` describes (the pretrained
    base under `warm_start.base` built first when missing), built if it is missing."""
    from polar_pl.pretrained.smollm2 import build_smollm2

    ws = cfg.warm_start
    out = Path(cfg.model_dir)
    if (out / "config.json").exists():
        return out
    prefix = default_harness_prefix(cfg.sandbox.get("harness_prefix") or None)
    if prefix is None:
        raise ValueError(
            f"model_dir {out} is missing and building it needs the {ws.harness} CLI: set "
            f"POLAR_HARNESS_PREFIX (polar-pl harness install {ws.harness} --prefix DIR)"
        )
    base = Path(ws.base)
    if not (base / "config.json").exists():
        print(f"polar-pl: building the pretrained model at {base} (once, ~30 s)", flush=True)
        build_smollm2(base, if_missing=True)
    print(
        f"polar-pl: the tool-use cold start of {base.name} inside {ws.harness}'s request at {out} "
        f"(once: {ws.tools.steps} steps on {ws.tools.tasks} demonstrations)",
        flush=True,
    )
    return build_tools_model(
        out,
        ws.harness,
        base,
        prefix,
        steps=int(ws.tools.steps),
        lr=float(ws.tools.lr),
        n_tasks=int(ws.tools.tasks),
        seed=int(ws.tools.get("seed", 0)),
        extra_args=cfg.harness.get("extra_args") or (),
        bf16=bool(ws.tools.get("bf16", False)),
        workdir=cfg.sandbox.get("workspace_alias"),
        if_missing=True,
    )


def build_tools_model(
    out_dir: str | os.PathLike[str],
    harness: str,
    base_dir: str | os.PathLike[str],
    harness_prefix: str | os.PathLike[str],
    steps: int,
    lr: float,
    n_tasks: int,
    seed: int = 0,
    extra_args: Sequence[str] = (),
    bf16: bool = False,
    workdir: str | None = None,
    if_missing: bool = False,
) -> Path:
    """A copy of the real model at `base_dir` (an HF folder) after the tool-use cold start: `steps`
    steps on demonstrations of `n_tasks` train tasks of the `tools` family inside `harness`'s
    captured request (tools_coldstart.py), kept as `harness_prompt.json`; workdir: the working
    folder the CLI will see (sandbox.workspace_alias). The build record (the base's, plus
    `tools_cold_start`) says what was done."""
    if steps < 1 or n_tasks < 1 or lr <= 0:
        raise ValueError(f"steps, n_tasks and lr must be positive, got {steps}, {n_tasks}, {lr}")
    return build_dir(
        out_dir,
        if_missing,
        lambda tmp: _build_tools_into(
            tmp,
            harness,
            Path(base_dir),
            Path(harness_prefix),
            steps,
            lr,
            n_tasks,
            seed,
            tuple(extra_args),
            bf16,
            workdir,
        ),
    )


def _build_tools_into(
    out: Path,
    harness: str,
    base: Path,
    prefix: Path,
    steps: int,
    lr: float,
    n_tasks: int,
    seed: int,
    extra_args: tuple[str, ...],
    bf16: bool,
    workdir: str | None,
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from polar_pl.warmstart.harness_capture import capture_harness_prompt
    from polar_pl.warmstart.tools_coldstart import cold_start_tools

    started = time.monotonic()
    if not (base / "config.json").exists():
        raise FileNotFoundError(f"no base model at {base}")
    prompt = capture_harness_prompt(harness, base, prefix, extra_args=extra_args)
    capture_s = time.monotonic() - started
    for f in base.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    tok = AutoTokenizer.from_pretrained(str(base))
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    torch.manual_seed(seed)
    report = cold_start_tools(
        model, tok, prompt, steps=steps, lr=lr, n_tasks=n_tasks, seed=seed, bf16=bf16, workdir=workdir
    )
    model.save_pretrained(out)
    (out / "harness_prompt.json").write_text(json.dumps(prompt.to_dict(), indent=1) + "\n", encoding="utf-8")
    record = json.loads((base / PRETRAINED_RECORD).read_text()) if (base / PRETRAINED_RECORD).exists() else {}
    record.update(
        base=str(base),
        harness_extra_args=list(extra_args),
        tools_cold_start={**report, "capture_seconds": round(capture_s, 1)},
        build_seconds=round(time.monotonic() - started, 1),
    )
    (out / PRETRAINED_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def build_multiturn_model(
    out_dir: str | os.PathLike[str],
    base_dir: str | os.PathLike[str],
    share: float = 0.85,
    steps: int = 400,
    seed: int = 0,
    if_missing: bool = False,
) -> Path:
    """A copy of the tiny model at `base_dir` fine-tuned on the mini agent's note-taking sessions
    of the `case` task, answers in the asked case with probability `share` per word
    (multiturn_warmstart.py): the start of the multi-turn learning check. ~1 CPU minute."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share}")
    return build_dir(
        out_dir, if_missing, lambda tmp: _build_multiturn_into(tmp, Path(base_dir), share, steps, seed)
    )


def _build_multiturn_into(out: Path, base: Path, share: float, steps: int, seed: int) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from polar_pl.warmstart.multiturn_warmstart import warm_start_multiturn

    started = time.monotonic()
    if not (base / "config.json").exists():
        raise FileNotFoundError(f"no base model at {base} (polar-pl tiny-model --out {base})")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(base / name, out / name)
    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 2-layer model: more threads only spin-wait on each other
    try:
        report = warm_start_multiturn(model, tok, share=share, steps=steps, seed=seed)
    finally:
        torch.set_num_threads(threads)
    base_record = json.loads((base / BUILD_RECORD).read_text()) if (base / BUILD_RECORD).exists() else {}
    record = {**base_record, "base": str(base.resolve()), "multiturn_warm_start": report}
    save_tiny_model(model, out, record, started)
