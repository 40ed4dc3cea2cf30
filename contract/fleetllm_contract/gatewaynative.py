"""The box gateway's compiled modules as a box gets them: GET /vllm/gateway-native/<tag>.

A build (fleetllm_gateway.native) is made for one kind of Python: one extension-module suffix, such as
`.cpython-312-x86_64-linux-gnu.so`. A box asks for the build of the Python that runs its gateway by that
suffix's tag (`cpython-312-x86_64-linux-gnu`: the suffix without its dot and `.so`). The control plane
answers 200 with the build as a gzipped tar (the build directory's files at its root: MANIFEST.json, the
runtime, fleetllm_gateway/<module><suffix>), its sha256 as the ETag and in SHA256_HEADER; 304 when the box
sent that ETag in If-None-Match; 404 when it holds no build for the tag. Behind the fleet key, as every
box endpoint. Standard library only: both sides import it.
"""

from __future__ import annotations

import re

ENV = "FLEETLLM_GATEWAY_NATIVE"  # names the build a gateway runs (fleetllm_gateway.native); the installer sets it
PATH_PREFIX = "/vllm/gateway-native/"
SHA256_HEADER = "X-Gateway-Native-Sha256"
MEDIA_TYPE = "application/gzip"
MAX_ARCHIVE_BYTES = 8 * 1024 * 1024  # a build for CPython 3.11 on x86_64: 2.8 MB unpacked, 1.0 MB packed
TAG = re.compile(r"[a-z0-9_]+(?:-[a-z0-9_]+)*")
MAX_TAG = 64
_SUFFIX = re.compile(r"\.([a-z0-9_]+(?:-[a-z0-9_]+)*)\.so")


def tag_of(suffix: str) -> str | None:
    """`.cpython-312-x86_64-linux-gnu.so` -> `cpython-312-x86_64-linux-gnu`; None for a suffix of another
    shape (`.so` alone, Windows' `.pyd`)."""
    found = _SUFFIX.fullmatch(suffix)
    if found is None or len(found.group(1)) > MAX_TAG:
        return None
    return found.group(1)


def is_tag(text: str) -> bool:
    return len(text) <= MAX_TAG and TAG.fullmatch(text) is not None
