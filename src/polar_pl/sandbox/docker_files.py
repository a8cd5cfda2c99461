"""Copying files in and out of a sandbox container (tar archives through the engine API), retried
as copies: the part of `DockerSandbox` that moves bytes. A missing path is the caller's business
(FileNotFoundError, or a parent folder to create), never a retry."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from polar_pl.sandbox.image import USER_UID
from polar_pl.sandbox.infra import transient
from polar_pl.sandbox.protocol import ExecResult


class ContainerFiles:
    """Mixed into DockerSandbox: needs `workdir`, `container_id`, `_api`, `_retry` and `exec`."""

    if TYPE_CHECKING:
        workdir: str
        container_id: str | None

        @property
        def _api(self) -> Any: ...

        def _retry(
            self, kind: str, what: str, fn: Callable[[], Any], retry_if: Callable[[BaseException], bool] = ...
        ) -> Any: ...

        exec: Callable[..., ExecResult]  # DockerSandbox.exec (the Sandbox protocol's)

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.workdir}/{path}"

    def _mkdir(self, path: str) -> None:
        res = self.exec(["mkdir", "-p", path])
        if res.exit_code != 0:
            raise PermissionError(f"cannot create {path} in the sandbox: {res.stderr.strip()}")

    def put_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        import docker

        target = PurePosixPath(self._abs(path))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(target.name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            info.uid = info.gid = USER_UID
            tar.addfile(info, io.BytesIO(data))
        try:
            self._put(str(target.parent), buf.getvalue())
        except docker.errors.NotFound:  # parent folder missing: create it (as the sandbox user)
            self._mkdir(str(target.parent))
            self._put(str(target.parent), buf.getvalue())

    def _put(self, dest: str, data: bytes) -> None:
        api = self._api
        self._retry(
            "copy",
            f"copying into {dest}",
            lambda: api.put_archive(self.container_id, dest, data),
            retry_if=_copy_transient,
        )

    def _get(self, src: str):
        api = self._api

        def get():
            stream, _ = api.get_archive(self.container_id, src)
            return b"".join(stream)

        return self._retry("copy", f"copying {src} out", get, retry_if=_copy_transient)

    def get_file(self, path: str) -> bytes:
        import docker

        try:
            data = self._get(self._abs(path))
        except docker.errors.NotFound as e:
            raise FileNotFoundError(path) from e
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise IsADirectoryError(path)
            f = tar.extractfile(member)
            assert f is not None  # a regular file
            return f.read()

    def put_archive(self, src: Path, dest: str) -> None:
        dest = self._abs(dest)
        self._mkdir(dest)

        def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid = info.gid = USER_UID
            info.uname = info.gname = "polar"
            return info

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(src), arcname=".", filter=owned)
        self._put(dest, buf.getvalue())

    def get_archive(self, src: str, dest: Path) -> None:
        import docker

        try:
            data = self._get(self._abs(src).rstrip("/") + "/.")
        except docker.errors.NotFound as e:
            raise FileNotFoundError(src) from e
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(dest, filter="tar")


def _copy_transient(exc: BaseException) -> bool:
    import docker

    return transient(exc) and not isinstance(exc, docker.errors.NotFound)  # NotFound: a missing path
