"""Remove what crashed runs left behind: local workspaces (and the processes still working in
them), cgroups (and what runs in them), labelled containers and relay folders. Called by
`polar-pl sandbox cleanup` (everything of an owner) and at the start of a training run
(`sweep(owner, dead_only=True)`: only what runs whose process is gone left), so a killed run
never leaks into the next one and a run still going is never touched."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SweepReport:
    workspaces: int
    cgroups: int
    containers: int
    processes: int = 0

    @property
    def empty(self) -> bool:
        return not (self.workspaces or self.cgroups or self.containers or self.processes)

    def __str__(self) -> str:
        return (
            f"{self.workspaces} sandbox workspaces, {self.cgroups} cgroups, {self.processes} processes, "
            f"{self.containers} containers"
        )


def sweep(
    owner: str | None = None, docker_host: str | None = None, docker_client=None, *, dead_only: bool = False
) -> SweepReport:
    """Remove leftovers of `owner` (every owner when None); dead_only: only those whose creating
    process is gone. Docker is swept only when an engine is given (`docker_host` URL or a
    `docker_client`)."""
    from polar_pl.sandbox import cgroups
    from polar_pl.sandbox.local import sweep_local

    workspaces, in_workspaces = sweep_local(owner, dead_only=dead_only)
    groups, in_groups = cgroups.sweep(owner, dead_only=dead_only) if cgroups.available() else (0, 0)
    containers = 0
    if docker_client is not None or docker_host:
        from polar_pl.sandbox.docker import client_for, sweep_docker

        client = docker_client or client_for(docker_host)
        try:
            containers = sweep_docker(client, owner, dead_only=dead_only)
        finally:
            if docker_client is None:
                client.close()
    return SweepReport(workspaces, groups, containers, in_workspaces + in_groups)
