"""pytest for evaluation sandboxes whose image has none (the offline base image has only python3).

A zip of the pure-Python sources of the pytest that is installed next to polar_pl (pinned by this
environment, recorded in BUNDLE.json) and of its dependencies, built once per process from the
installed distributions. The supervisor checks its hash and hands it to every test process, which
imports it from memory: nothing on the sandbox's disk can change the pytest that runs the tests.
An image that has its own pytest (SWE-bench images) uses that one instead.

Each module also comes compiled (`NAME.pyc`: this interpreter's magic number, then the marshalled
code, named as the test process names the module): compiling pytest's sources took ~0.4 CPU s in
every test process, one per test file, loading the code ~0.03 s. A sandbox whose Python has another
magic number compiles the sources as before.
"""

from __future__ import annotations

import importlib.util
import io
import json
import marshal
import zipfile
from functools import cache
from importlib import metadata
from pathlib import Path

DISTRIBUTIONS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")
PREFIX = "<polar-bundle>/"  # inside/runner.py's BUNDLE_PREFIX: the modules' file names in the sandbox


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
                    source = Path(f.locate()).read_bytes()
                    z.writestr(_entry(str(f)), source)
                    code = compile(source, PREFIX + str(f), "exec", dont_inherit=True)
                    z.writestr(_entry(f"{f}c"), importlib.util.MAGIC_NUMBER + marshal.dumps(code))
        z.writestr(_entry("BUNDLE.json"), json.dumps(versions))
    return buf.getvalue()


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0))  # fixed: same versions, same bytes and hash
    info.compress_type = zipfile.ZIP_DEFLATED
    return info
