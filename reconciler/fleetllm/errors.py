"""The one error tree of the control plane, the reconciler and the CLI.

    FleetllmError                      every error fleetllm raises on purpose
    ├── ConfigurationError             a config file, a flag or the environment is wrong (exit 2)
    ├── SourceError                    the fleet repository cannot be read (git, a directory)
    ├── StateError                     the state store (SQLite, PostgreSQL) failed
    │   └── LockHeld                   another pass holds the single-flight lock (not a failure)
    ├── UpstreamError                  an outside system answered badly or not at all (retryable)
    │   ├── HttpError                  fleetllm.adapters.http: connect, timeout, status, body
    │   ├── ListingError               fleetllm.adapters.providers: a provider's listing is unusable
    │   └── LitellmError               fleetllm.adapters.litellm: a LiteLLM answer we cannot use
    ├── OperationError                 a requested operation cannot be carried out as asked
    │   (approve, a saved plan that went stale, a render of an unknown box, the demo, ...)
    └── RequestError                   a request to the control plane is refused with a 4xx: a bad
        query parameter, filter or box report; missing or wrong credentials (server.access.Refused)

`retryable` says whether trying the same thing again later can succeed: the HTTP adapter retries
a request only while its error says so (a timeout, a refused connection, 429, 502-504; never another
4xx), after which the pass goes on and the next pass tries again. The CLI maps the tree to exit codes once
(fleetllm.cli.main). The box side (fleetllm_installer, fleetllm_gateway) has trees of its own: it
ships without the control plane.
"""

from __future__ import annotations

EXIT_INVALID = 1  # the fleet (or the final state) is not what it should be
EXIT_USAGE = 2  # usage, configuration or I/O: the command could not do its job


class FleetllmError(Exception):
    """The root: anything fleetllm raises on purpose. The message is for a person: it names the file,
    field, host or header and what to do, and never carries a secret."""

    exit_code: int = EXIT_USAGE  # a class default; CommandError sets its own per instance

    @property
    def retryable(self) -> bool:
        """Whether the same thing tried again later can succeed (a timeout can; a bad config cannot)."""
        return False


class ConfigurationError(FleetllmError):
    """A config file, a command-line flag or the environment is wrong."""


class SourceError(FleetllmError):
    """The repository could not be read at all (missing directory, not a git repo, unknown rev)."""

    @property
    def retryable(self) -> bool:
        return True  # a fetch or a clone can fail for a moment


class StateError(FleetllmError):
    """The state store failed (database unreachable, schema newer than this code, ...)."""

    @property
    def retryable(self) -> bool:
        return True


class LockHeld(StateError):  # noqa: N818 (a state, not an error)
    """Another pass holds the single-flight lock."""


class UpstreamError(FleetllmError):
    """An outside system (a vLLM server, a provider API, LiteLLM) failed or answered unusably."""

    @property
    def retryable(self) -> bool:
        return True


class OperationError(FleetllmError):
    """An operation that cannot be carried out as asked (the message says why and what to do)."""


class RequestError(FleetllmError):
    """A request to the control plane is refused with a 4xx (the message is what the caller is told)."""
