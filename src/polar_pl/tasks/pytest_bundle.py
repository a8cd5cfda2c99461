"""pytest for evaluation sandboxes whose image has none (the offline base image has only python3).

A zip of the pure-Python sources of the pytest that is installed next to polar_pl (pinned by this
environment, recorded in BUNDLE.json) and of its dependencies, built once per process from the
installed distributions. The supervisor checks its hash and hands it to every test process, which
imports it from memory: nothing on the sandbox's disk can change the pytest that runs the tests.
An image that has its own pytest (SWE-bench images) uses that one instead.
"""

from __future__ import annotations

import io
import json
import zipfile
from functools import cache
from importlib import metadata
from pathlib import Path

DISTRIBUTIONS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")


@cache
def bundle() -> bytes:
    buf = io.BytesIO()
    versions = {}
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name in DISTRIBUTIONS:
            dist = metadata.distribution(name)
            versions[name] = dist.version
            for f in sorted(dist.files or (), key=str):
                if f.suffix == ".py" and "__pycache__" not in f.parts and ".." not in f.parts:
                    z.writestr(_entry(str(f)), Path(f.locate()).read_bytes())
        z.writestr(_entry("BUNDLE.json"), json.dumps(versions))
    return buf.getvalue()


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0))  # fixed: same versions, same bytes and hash
    info.compress_type = zipfile.ZIP_DEFLATED
    return info
