"""The box gateway: one port, many models. An LLMhop-compatible router (the LLMhop specification).

Standard library plus httptools (llhttp's bindings, which stock vLLM images ship: uvicorn runs on them)
and uvloop when present, so it runs from the box zipapp (`python3 box.pyz gateway --config FILE`) with
the interpreter of a vLLM image. Its request path runs compiled where $FLEETLLM_GATEWAY_NATIVE names a
build that fits (fleetllm_gateway.native), before any of those modules is imported.
"""

from fleetllm_contract.version import __version__
from fleetllm_gateway import native

native.activate_from_environment(__path__)

__all__ = ["__version__"]
