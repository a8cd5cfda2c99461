"""`rollout=remote`: sessions run in a `polar-pl rollout serve` service elsewhere (its own engine,
gateways, harnesses and sandboxes); this trainer drives it over HTTP.

    python train.py rollout=remote rollout.url=http://host:8100 rollout.token_file=~/.polar-token

`RemoteRollout.engine()` stands in for the `engine` group: the trainer's handle to the service's
engine. A weight push writes the state dict as safetensors under `weights_dir` and asks the
service to load it (POST /v1/weights), so `weights_dir` must be a directory the service can read
at the same path (a shared filesystem across machines). The service pauses its own gateways
around that load, which is why `pause`/`resume` have nothing to send.

The bearer token comes from `token_file` or the `token_env` variable, never from a command line
(where `ps` and shell history would show it). The service's error JSON becomes a
`RolloutServiceError` naming the URL, the route and the message.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import httpx

from polar_pl.engine.weights import save_state_dict
from polar_pl.gateway.call.gate import PauseMode
from polar_pl.rollout.http.schema import GroupsResponse, VersionResponse, group_from_json
from polar_pl.rollout.protocol import RolloutSetup
from polar_pl.rollout.service import Group, RolloutsStopped


class RolloutServiceError(RuntimeError):
    """The rollout service refused a request (`status`: its HTTP status) or could not be reached
    (`status` None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Api:
    """One httpx client to the service; every answer that is not 2xx raises `RolloutServiceError`."""

    def __init__(self, url: str, token: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s
        )

    def call(self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> httpx.Response:
        where = f"rollout service {self.url}: {method} {path}"
        try:
            resp = self.http.request(method, path, timeout=timeout or httpx.USE_CLIENT_DEFAULT, **kwargs)
        except httpx.TransportError as exc:
            raise RolloutServiceError(f"{where}: {type(exc).__name__}: {exc or 'no answer'}") from None
        if resp.is_success:
            return resp
        try:
            message = resp.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = resp.text[:500] or resp.reason_phrase
        raise RolloutServiceError(f"{where} -> {resp.status_code}: {message}", resp.status_code)

    def close(self) -> None:
        self.http.close()


def _token(token_file: str | None, token_env: str) -> str:
    if token_file:
        path = Path(token_file).expanduser()
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise ValueError(f"rollout.token_file={token_file!r}: {exc.strerror or exc}") from None
        if not token:
            raise ValueError(f"rollout.token_file={token_file!r}: the file is empty")
        return token
    token = os.environ.get(token_env, "").strip()
    if not token:
        raise ValueError(
            f"rollout=remote needs the service's bearer token: set rollout.token_file or ${token_env}"
        )
    return token


class RemoteRollout:
    """The `rollout=remote` backend (conf/rollout/remote.yaml)."""

    def __init__(
        self,
        url: str,
        token_file: str | None = None,
        token_env: str = "POLAR_ROLLOUT_TOKEN",
        weights_dir: str | None = None,
        timeout_s: float = 30.0,
        poll_s: float = 5.0,
        push_timeout_s: float = 600.0,
    ) -> None:
        if not str(url).startswith(("http://", "https://")):
            raise ValueError(f"rollout.url={url!r}: expected http://host:port of `polar-pl rollout serve`")
        self.url, self.token = str(url), _token(token_file, token_env)
        self.weights_dir, self.timeout_s, self.poll_s, self.push_timeout_s = (
            weights_dir,
            timeout_s,
            poll_s,
            push_timeout_s,
        )

    def _api(self) -> _Api:
        return _Api(self.url, self.token, self.timeout_s)

    def engine(self) -> RemoteEngine:
        """The trainer's handle to the service's engine (replaces the `engine` group)."""
        return RemoteEngine(self._api(), self.weights_dir, self.push_timeout_s)

    def connect(self, setup: RolloutSetup) -> RemoteClient:
        """The service already runs its own tasks, groups and harnesses: `setup` is not sent."""
        return RemoteClient(self._api(), self.poll_s)


class RemoteEngine:
    """The service's engine as the trainer sees it: its policy version, and weight pushes through
    a directory the service reads. Starting or stopping it is the service's business."""

    model = "remote"
    model_dir = None  # the service's gateways have their tokenizer

    def __init__(self, api: _Api, weights_dir: str | None, push_timeout_s: float) -> None:
        self.api, self.weights_dir, self.push_timeout_s = api, weights_dir, push_timeout_s

    @property
    def url(self) -> str:
        return self.api.url

    @property
    def base_url(self) -> str:
        return self.api.url + "/v1"

    @property
    def urls(self) -> list[str]:
        return [self.url]

    def start(self) -> RemoteEngine:
        """Fails at once, with the service's message, on a wrong token or an unreachable URL."""
        self.policy_version()
        return self

    def stop(self) -> None:
        self.api.close()

    def health(self) -> bool:
        try:
            return self.api.call("GET", "/health").status_code == 200
        except RolloutServiceError:
            return False

    def policy_version(self) -> int:
        resp = self.api.call("GET", "/v1/policy_version")
        return VersionResponse.model_validate_json(resp.content).policy_version

    def update_weights_from_state_dict(self, state_dict: Mapping[str, Any]) -> int:
        if self.weights_dir:
            Path(self.weights_dir).mkdir(parents=True, exist_ok=True)
        out = Path(tempfile.mkdtemp(prefix="push-", dir=self.weights_dir))
        try:  # the service has loaded the files when the POST returns
            save_state_dict(state_dict, out)
            return self.update_weights_from_disk(str(out))
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def update_weights_from_disk(self, path: str) -> int:
        body = {"path": str(Path(path).resolve())}
        resp = self.api.call("POST", "/v1/weights", json=body, timeout=self.push_timeout_s)
        return VersionResponse.model_validate_json(resp.content).policy_version


class RemoteClient:
    """`RolloutClient` over the service's HTTP API. The service keeps the group bookkeeping and
    the resume cursor; groups it released to a trainer that died unconsumed are not sent again."""

    gateway = None  # the service's
    health = None  # the service watches its own engine and gateways

    def __init__(self, api: _Api, poll_s: float) -> None:
        self.api, self.poll_s = api, poll_s
        self._stopping = False

    def start_groups(self, cursor: dict[str, Any]) -> None:
        """The service's groups started with the service (from its own cursor): checks it answers."""
        self.state_dict()

    def next_groups(self, n: int, timeout: float | None = None, *, consume: bool = True) -> list[Group]:
        """Long polls of `poll_s` each, so `stop_feeding` is noticed within one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._stopping:
                raise RolloutsStopped("the run is shutting down: no new rollouts")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no {n} groups from the rollout service {self.api.url} after {timeout}s")
            wait = self.poll_s if left is None else max(0.1, min(self.poll_s, left))
            params = {"n": n, "timeout": wait, "consume": consume}
            try:
                read_s = self.api.http.timeout.read or 0.0
                resp = self.api.call("GET", "/v1/groups", params=params, timeout=wait + read_s)
            except RolloutServiceError as exc:
                if exc.status == 408:  # not ready within this poll
                    continue
                raise
            return [group_from_json(g) for g in GroupsResponse.model_validate_json(resp.content).groups]

    def mark_consumed(self, seqs: Sequence[int]) -> None:
        if seqs:
            self.api.call("POST", "/v1/groups/consumed", json={"seqs": list(seqs)})

    def submit_tasks(self, tasks: Sequence[Any]) -> list[int]:
        """Task rows (dicts) or `Task`s; the service must run with `--feed queue`."""
        rows = [dict(t) if isinstance(t, Mapping) else _task_row(t) for t in tasks]
        return self.api.call("POST", "/v1/tasks", json={"tasks": rows}).json()["seqs"]

    def state_dict(self) -> dict[str, Any]:
        return self.api.call("GET", "/v1/state").json()

    def metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.api.call("GET", "/v1/stats").json().items()}

    def last_failure(self) -> str | None:
        """Not sent over the API: the service's own log has its failures."""
        return None

    def pause(self, mode: PauseMode) -> None:
        """Nothing to send: POST /v1/weights pauses the service's gateways around the load."""

    def resume(self) -> None:
        """See `pause`."""

    def set_policy_version(self, version: int) -> None:
        self.api.call("POST", "/v1/policy_version", json={"version": int(version)})

    def take_out_engine(self, url: str) -> None:
        raise RuntimeError(f"rollout=remote: the service at {self.api.url} takes out its own engine replicas")

    def stop_feeding(self) -> None:
        """This trainer takes no more groups; the service (which may serve others) feeds on."""
        self._stopping = True

    def close(self, timeout: float = 60.0) -> None:
        self._stopping = True
        self.api.close()


def _task_row(task: Any) -> dict[str, Any]:
    """A `Task` as the SWE-bench-style row POST /v1/tasks takes."""
    if not is_dataclass(task) or isinstance(task, type):
        raise TypeError(f"rollout=remote: cannot submit {type(task).__name__} (a task row dict or a Task)")
    row = asdict(task)
    row.update(row.pop("extra") or {})
    row["FAIL_TO_PASS"], row["PASS_TO_PASS"] = row.pop("fail_to_pass"), row.pop("pass_to_pass")
    return {k: v for k, v in row.items() if v not in (None, "", ())}
