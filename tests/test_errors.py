"""One error tree per package: every exception a module of fleetllm defines descends from FleetllmError,
every one of the installer from InstallerError, every one of the gateway from GatewayError; retries
follow `retryable`; the CLI maps the tree to exit codes once, with a message and no traceback."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import fleetllm
import fleetllm_gateway
import fleetllm_installer
from fleetllm.adapters.http import HttpError
from fleetllm.cli.main import main
from fleetllm.errors import (
    EXIT_INVALID,
    EXIT_USAGE,
    ConfigurationError,
    FleetllmError,
    OperationError,
    SourceError,
    StateError,
    UpstreamError,
)
from fleetllm_gateway.errors import GatewayError
from fleetllm_installer.errors import InstallerError


def modules(package: ModuleType) -> list[ModuleType]:
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name.endswith("__main__"):
            continue
        found.append(importlib.import_module(info.name))
    return found


def exceptions_defined_in(package: ModuleType) -> list[type[BaseException]]:
    return [obj for module in modules(package) for _, obj in inspect.getmembers(module, inspect.isclass)
            if issubclass(obj, BaseException) and obj.__module__ == module.__name__
            and not obj.__name__.startswith("_")]


@pytest.mark.parametrize(("package", "root"), [(fleetllm, FleetllmError), (fleetllm_installer, InstallerError),
                                               (fleetllm_gateway, GatewayError)])
def test_every_public_exception_has_its_package_root(package: ModuleType, root: type[Exception]) -> None:
    defined = exceptions_defined_in(package)
    assert len(defined) >= 7, [d.__name__ for d in defined]  # the walk found the package's errors
    strays = [f"{d.__module__}.{d.__name__}" for d in defined if not issubclass(d, root)]
    assert not strays, f"outside the {root.__name__} tree: {strays}"


def test_the_branches_and_what_can_be_retried() -> None:
    for branch in (ConfigurationError, SourceError, StateError, UpstreamError, OperationError):
        assert issubclass(branch, FleetllmError)
    assert not ConfigurationError("x").retryable and not OperationError("x").retryable
    assert SourceError("x").retryable and StateError("x").retryable and UpstreamError("x").retryable
    # The HTTP adapter retries exactly what its error calls retryable.
    assert HttpError("timeout").retryable  # no status: a transport failure
    assert all(HttpError("later", status).retryable for status in (429, 502, 503, 504))
    assert not any(HttpError("stands", status).retryable for status in (400, 401, 403, 404, 409, 422, 500))


def test_the_cli_maps_the_tree_once(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    # A configuration problem: exit 2, one line naming the command, no traceback.
    code = main(["render", "203.0.113.10", "--repo", "/nonexistent/fleet", "--salt-file", "/nonexistent/salt"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert err.startswith("fleetllm render: ") and "Traceback" not in err
    # An abbreviated option is refused, not guessed.
    with pytest.raises(SystemExit) as exited:
        main(["validate", "--form", "json", "."])
    assert exited.value.code == EXIT_USAGE
    assert "unrecognized arguments: --form" in capsys.readouterr().err
    assert EXIT_INVALID == 1
