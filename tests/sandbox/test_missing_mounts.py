"""A sandbox mounts only what exists (issue 27): a harness prefix, Node or Python packages folder
that is not there is left out, and the sandbox works without it.

bwrap refuses a missing source ("Can't find source path"), Docker a missing bind source: with the
Makefile's POLAR_HARNESS_PREFIX pointing at a .cache/harness that `make train` never creates,
every exec of every sandbox failed, the mini agent's too, which needs no CLI."""

from __future__ import annotations


def test_an_absent_harness_prefix_is_left_out(make_isolated, tmp_path):
    missing = tmp_path / "no-harness-here"
    sb = make_isolated(harness_prefix=str(missing))
    sb.start()  # the baseline commit is the sandbox's first exec
    try:
        res = sb.exec("echo ok")
        assert (res.exit_code, res.stdout) == (0, "ok\n"), res.stderr
        assert sb.harness_prefix is None  # a harness asking for it is told there is none
    finally:
        sb.stop()


def test_docker_leaves_out_an_absent_node_and_python_packages(request, tmp_path):
    from polar_pl.sandbox.docker import DockerSandbox
    from polar_pl.testing.sandbox import OWNER

    engine, image = request.getfixturevalue("docker_engine"), request.getfixturevalue("docker_image")
    sb = DockerSandbox(image=image, docker_host=engine.url, owner=OWNER,
                       node=str(tmp_path / "no-node"), pydeps=str(tmp_path / "no-pydeps"))  # fmt: skip
    sb.start()
    try:
        assert sb.exec("echo ok").exit_code == 0
        assert (sb.node, sb.host_pydeps) == (None, None)
    finally:
        sb.stop()
