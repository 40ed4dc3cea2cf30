"""The box gateway: one port, many models. An LLMhop-compatible router (the LLMhop specification).

Standard library plus httptools (llhttp's bindings, which stock vLLM images ship: uvicorn runs on them)
and uvloop when present, so it runs from the box zipapp (`python3 box.pyz gateway --config FILE`) with
the interpreter of a vLLM image.
"""

from fleetllm_contract.version import __version__

__all__ = ["__version__"]
