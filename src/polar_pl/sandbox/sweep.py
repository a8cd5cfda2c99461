"""Remove what crashed runs left behind: local workspaces, cgroups, labelled containers and relay
folders. Called by `polar-pl sandbox cleanup` and meant for the start of a sweep / training run
(`sweep(owner=run_owner, docker_host=...)`), so a killed run never leaks into the next one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SweepReport:
    workspaces: int
    cgroups: int
    containers: int


def sweep(owner: str | None = None, docker_host: str | None = None, docker_client=None) -> SweepReport:
    """Remove leftovers of `owner` (every owner when None). Docker is swept only when an engine is
    given (`docker_host` URL or a `docker_client`)."""
    from polar_pl.sandbox import cgroups
    from polar_pl.sandbox.local import sweep_local

    workspaces = sweep_local(owner)
    groups = cgroups.sweep(owner) if cgroups.available() else 0
    containers = 0
    if docker_client is not None or docker_host:
        from polar_pl.sandbox.docker import client_for, sweep_docker

        client = docker_client or client_for(docker_host)
        try:
            containers = sweep_docker(client, owner)
        finally:
            if docker_client is None:
                client.close()
    return SweepReport(workspaces, groups, containers)
