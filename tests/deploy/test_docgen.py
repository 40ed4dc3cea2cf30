"""Both generated references (docs/gen_config_reference.py, docs/gen_metrics_reference.py) write or check
through one helper (docs/docgen.py): the same command line, message and exit codes for each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.demo.test_docs import generator as config_generator
from tests.deploy.promql import generator as metrics_generator


@pytest.mark.parametrize("load", [config_generator, metrics_generator], ids=["config", "metrics"])
def test_each_generator_writes_or_checks_its_target(load: Callable[[], ModuleType], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    module = load()
    target = tmp_path / "reference.md"
    monkeypatch.setattr(module, "TARGET", target)
    monkeypatch.setattr(module, "render", lambda: "# the reference\n")
    assert module.main(["--check"]) == 1  # missing: stale
    assert f"{target} is stale: run `make docs`" in capsys.readouterr().err
    assert module.main([]) == 0
    assert target.read_text() == "# the reference\n" and f"wrote {target}" in capsys.readouterr().out
    assert module.main(["--check"]) == 0
    target.write_text("edited by hand\n")
    assert module.main(["--check"]) == 1
    with pytest.raises(SystemExit) as usage:
        module.main(["--nonsense"])
    assert usage.value.code == 2


def test_the_two_share_one_helper() -> None:
    assert config_generator().write_or_check is metrics_generator().write_or_check
