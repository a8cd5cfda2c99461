"""Token ids and logprobs as packed arrays: little-endian int32 / float32, 4 bytes a token.

The store keeps them as blobs in this layout (store/traces.py), the gateway keeps its sessions'
chains in it (faithful/), and the merge compares them as arrays (trajectory/): a long
prompt is one buffer, never a list of Python ints.
"""

from __future__ import annotations

from typing import Any

import numpy as np

I32 = np.dtype("<i4")
F32 = np.dtype("<f4")


def as_i32(ids: Any) -> np.ndarray:
    """Token ids (list, array or little-endian int32 bytes) as a 1-D int32 array (no copy when
    they are one already)."""
    if type(ids) is np.ndarray:  # the common case (records read packed), checked first: per call
        return ids if ids.dtype == I32 else ids.astype(I32)
    if isinstance(ids, bytes | bytearray | memoryview):
        return np.frombuffer(ids, dtype=I32)
    if isinstance(ids, np.ndarray):
        return ids.astype(I32, copy=False)
    return np.fromiter(ids, dtype=I32, count=len(ids))


def as_f32(values: Any) -> np.ndarray:
    """Logprobs (list, array or little-endian float32 bytes) as a 1-D float32 array."""
    if isinstance(values, bytes | bytearray | memoryview):
        return np.frombuffer(values, dtype=F32)
    if isinstance(values, np.ndarray):
        return values.astype(F32, copy=False)
    return np.fromiter(values, dtype=F32, count=len(values))


def pack_i32(ids: Any) -> bytes:
    return as_i32(ids).tobytes()


def pack_f32(values: Any) -> bytes:
    return as_f32(values).tobytes()
