"""The gate itself, run in an inner pytest (pytester): under FLEETLLM_REQUIRE_INTEGRATION=1 every way an
integration test can skip is a failure, nothing else changes, and a value other than 0/1 stops the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import conftest
from tests.support import integration
from tests.support.serve import require_serve

INNER = '''
import pytest
from tests.support.integration import missing

def test_plain_skip_stays_a_skip():
    pytest.skip("not an integration test")

@pytest.mark.integration
def test_marked_skip():
    pytest.skip("no proxy here")

@pytest.mark.integration
@pytest.mark.skipif(True, reason="no browser here")
def test_marked_skipif():
    pass

@pytest.fixture
def service():
    pytest.skip("no database here")

@pytest.mark.integration
def test_marked_fixture_skip(service):
    pass

def test_missing_helper():
    missing("no harness here")

@pytest.mark.integration
def test_marked_that_runs():
    assert True

@pytest.mark.integration
@pytest.mark.xfail(reason="known", strict=True)
def test_marked_xfail():
    assert False
'''


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, value: str | None) -> pytest.RunResult:
    if value is None:
        monkeypatch.delenv(integration.REQUIRE_ENV, raising=False)
    else:
        monkeypatch.setenv(integration.REQUIRE_ENV, value)
    pytester.makepyfile(test_inner=INNER)
    return pytester.runpytest("-p", "tests.support.integration", "-rA", "-p", "no:cacheprovider")


def test_the_project_conftest_loads_the_gate() -> None:
    assert "tests.support.integration" in conftest.pytest_plugins


@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_the_variable_integration_tests_skip(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                     value: str | None) -> None:
    result = run(pytester, monkeypatch, value)
    result.assert_outcomes(passed=1, skipped=5, xfailed=1)


def test_with_the_variable_every_integration_skip_fails(pytester: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(pytester, monkeypatch, "1")
    # A skip at setup (skipif, a fixture's skip) is reported as an error of the setup, one in the test as a
    # failure: either fails the run.
    result.assert_outcomes(passed=1, skipped=1, failed=2, errors=2, xfailed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    for test, reason in (("test_marked_skip", "no proxy here"), ("test_missing_helper", "no harness here")):
        assert f"FAILED test_inner.py::{test}" in out
        assert reason in out
    for test, reason in (("test_marked_skipif", "no browser here"), ("test_marked_fixture_skip", "no database here")):
        assert f"ERROR test_inner.py::{test}" in out
        assert f"this integration test skipped: {reason}" in out
    assert "FLEETLLM_REQUIRE_INTEGRATION=1 and this integration test" in out
    assert "SKIPPED [1] test_inner.py" in out and "not an integration test" in out


@pytest.mark.parametrize("value", ["true", "yes", "2"])
def test_a_value_other_than_0_or_1_stops_the_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                 value: str) -> None:
    result = run(pytester, monkeypatch, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"FLEETLLM_REQUIRE_INTEGRATION={value!r}" in result.stderr.str()


def test_a_broken_serve_fails_the_suites_that_need_it(tmp_path: Path) -> None:
    broken = tmp_path / "fleetllm"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named flask' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(pytest.fail.Exception) as info:
        require_serve(broken)
    assert "`fleetllm serve --help` exited 1: the control plane is broken" in str(info.value)
    assert "No module named flask" in str(info.value)
    with pytest.raises(pytest.fail.Exception, match="did not run"):
        require_serve(tmp_path / "absent")
    require_serve()  # this checkout's own passes
