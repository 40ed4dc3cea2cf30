"""The fleet repository's files as data: their names and one revision's contents (a Snapshot).

Pure: reading them from a directory or from git objects is fleetllm.adapters.git's job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

FLEET_FILE = "fleet.yaml"
MODELS_FILE = "models.yaml"
PLACEMENT_FILE = "placement.yaml"
FLEET_FILES = (FLEET_FILE, MODELS_FILE, PLACEMENT_FILE)
WORKTREE_REVISION = "working-tree"


@dataclass(frozen=True)
class Oversized:
    size: int


@dataclass(frozen=True)
class NotRegularFile:
    """A fleet file that is not a regular file (a symbolic link, a directory, a device, a FIFO, a
    submodule): never followed nor read. `kind` says what it is; a link's target is never shown (a pull
    request could point one at a secret on the machine that validates it)."""

    kind: str


Content = bytes | Oversized | NotRegularFile | None  # None: the file does not exist


@dataclass(frozen=True)
class Snapshot:
    """The fleet files at one revision. `display` maps a file name to the path shown in messages."""

    revision: str
    files: Mapping[str, Content]
    display: Mapping[str, str]
    origin: str | None = None  # the repository's root commit (None: not read from git); derives a fleet id
