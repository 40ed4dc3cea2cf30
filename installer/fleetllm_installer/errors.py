"""The installer's error tree (standard library only; the control plane's is fleetllm.errors).

    InstallerError            every error the installer raises on purpose; the message names the
    │                         field, file or setting and never holds a secret
    ├── SettingsError         an FLEETLLM_* setting of the box is wrong
    ├── FetchError            GET /vllm/config failed for good (retryable: the next boot may succeed)
    │   └── NotFoundError     404: an unknown box, or no compiled gateway for the box's Python
    ├── BoxJsonError          the box JSON is not a usable config (every problem listed)
    ├── ProbeError            nvidia-smi gave no usable GPU data
    ├── UnitError             a value cannot go into a Supervisor program file
    ├── BoxGatewayError       the box gateway cannot be set up
    └── HandoverError         supervisord did not take the programs

Each keeps the built-in base it had (ValueError or RuntimeError), so `except ValueError` still works.
"""

from __future__ import annotations

from typing import ClassVar


class InstallerError(Exception):
    retryable: ClassVar[bool] = False
