"""Harbor task folders (`task=harbor task.path=DIR`), read without the `harbor` package.

A task is a folder:

    task.toml         [task] name / description, [metadata] (free-form; `difficulty` is read),
                      [agent] timeout_sec, [verifier] timeout_sec / env, [solution] env,
                      [environment] docker_image / build_timeout_sec / cpus / memory ...
    instruction.md    the prompt, given to the harness as it is
    environment/      the agent's container: a Dockerfile and its build context (or, instead, the
                      prebuilt `[environment].docker_image`); a docker-compose file may define the
                      one service `main` (sidecar services are not supported)
    tests/test.sh     the verifier: run after the agent, in a fresh container from the same image,
                      with tests/ uploaded to /tests; it writes /logs/verifier/reward.txt (a float)
                      or reward.json ({"reward": x}); without either, its exit status decides
    solution/solve.sh optional reference solution (the oracle of `polar-pl tasks check`)

The agent works in the image's WORKDIR (usually /app). Its changes reach the verifier as the
workspace diff (as for every patch-scored task), so work outside the WORKDIR is not seen.
A task's image is named `polar-pl/harbor-<name>:<hash of environment/>`, so an edited environment
gets a new image and an unchanged one is built once.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar_pl.tasks.task import DIFFICULTIES, Task, TaskFormatError

BUILTIN_DIR = Path(__file__).with_name("harbor_builtin")
# Paths of Harbor's contract inside the container, handed to the sandbox user at start.
HARBOR_PATHS = ("/logs/agent", "/logs/verifier", "/tests", "/solution")
_SECTIONS = {"version", "schema_version", "task", "metadata", "verifier", "agent", "solution", "environment"}


@dataclass(frozen=True, slots=True)
class HarborTask(Task):
    """A Harbor task: the generic Task fields plus where its verifier and solution live."""

    task_dir: str = ""
    tests_dir: str = ""
    solution_dir: str | None = None
    verifier_timeout_s: float = 600.0
    agent_timeout_s: float | None = None
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    solution_env: Mapping[str, str] = field(default_factory=dict)
    owned_paths: tuple[str, ...] = HARBOR_PATHS

    @property
    def prompt(self) -> str:
        return self.problem_statement


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-.") or "task"


def _dir_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def _str_map(value: Any, iid: str, key: str, origin: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(v, str | int | float) for v in value.values()):
        raise TaskFormatError(iid, key, "must be a table of strings", origin)
    return {str(k): str(v) for k, v in value.items()}


def _timeout(section: Mapping[str, Any], iid: str, key: str, origin: str) -> float | None:
    value = section.get("timeout_sec")
    if value is None:
        return None
    if not isinstance(value, int | float) or value <= 0:
        raise TaskFormatError(iid, f"{key}.timeout_sec", "must be a positive number of seconds", origin)
    return float(value)


def _environment(env_dir: Path, env: Mapping[str, Any], name: str, iid: str, origin: str):
    """(image, build context) of the task's container."""
    compose = next(
        (p for p in (env_dir / "docker-compose.yaml", env_dir / "docker-compose.yml") if p.exists()), None
    )
    if compose is not None:
        import yaml

        services = (yaml.safe_load(compose.read_text()) or {}).get("services") or {}
        if set(services) - {"main"}:
            raise TaskFormatError(
                iid,
                compose.name,
                f"defines services {sorted(services)}; only a single "
                "`main` service is supported (no sidecars)",
                origin,
            )
    dockerfile = env_dir / "Dockerfile"
    image = env.get("docker_image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        raise TaskFormatError(iid, "environment.docker_image", "must be an image reference", origin)
    if dockerfile.is_file():
        return image or f"polar-pl/harbor-{_slug(name)}:{_dir_digest(env_dir)}", str(env_dir)
    if image:
        return image, None
    raise TaskFormatError(
        iid,
        "environment/Dockerfile",
        "is missing (and task.toml names no [environment].docker_image)",
        origin,
    )


def load_harbor_task(task_dir: str | Path) -> HarborTask:
    """Read one Harbor task folder; TaskFormatError names the file or key that is wrong."""
    root = Path(task_dir).resolve()
    origin = str(root)
    toml_path = root / "task.toml"
    if not toml_path.is_file():
        raise TaskFormatError(root.name, "task.toml", "is missing", origin)
    try:
        config = tomllib.loads(toml_path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TaskFormatError(root.name, "task.toml", f"is not valid TOML ({exc})", origin) from exc
    if unknown := set(config) - _SECTIONS:
        raise TaskFormatError(root.name, "task.toml", f"has unknown sections {sorted(unknown)}", origin)
    meta = config.get("task") or {}
    name = meta.get("name") or root.name
    iid = str(name)
    instruction = root / "instruction.md"
    if not instruction.is_file() or not instruction.read_text().strip():
        raise TaskFormatError(iid, "instruction.md", "is missing or empty", origin)
    tests = root / "tests"
    if not (tests / "test.sh").is_file():
        raise TaskFormatError(iid, "tests/test.sh", "is missing", origin)
    image, context = _environment(root / "environment", config.get("environment") or {}, iid, iid, origin)
    solution = root / "solution"
    difficulty = (config.get("metadata") or {}).get("difficulty")
    verifier, agent = config.get("verifier") or {}, config.get("agent") or {}
    return HarborTask(
        instance_id=iid,
        repo=iid,
        base_commit="",
        problem_statement=instruction.read_text(),
        difficulty=difficulty if difficulty in DIFFICULTIES else None,
        image=image,
        image_context=context,
        task_dir=origin,
        tests_dir=str(tests),
        solution_dir=str(solution) if (solution / "solve.sh").is_file() else None,
        verifier_timeout_s=_timeout(verifier, iid, "verifier", origin) or 600.0,
        agent_timeout_s=_timeout(agent, iid, "agent", origin),
        verifier_env=_str_map(verifier.get("env"), iid, "verifier.env", origin),
        solution_env=_str_map((config.get("solution") or {}).get("env"), iid, "solution.env", origin),
        extra={"harbor": {k: v for k, v in config.items() if k in ("task", "metadata", "environment")}},
    )


def find_task_dirs(path: str | Path) -> list[Path]:
    """`path` itself when it is a task folder, else its task folders (any depth), sorted."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"task.path: {root} is not a directory")
    if (root / "task.toml").is_file():
        return [root]
    found = sorted(p.parent for p in root.rglob("task.toml"))
    if not found:
        raise FileNotFoundError(f"task.path: no Harbor task (a folder with task.toml) under {root}")
    return found
