"""The docs are run (issue 26, item 4): every shell block of README.md, docs/quickstart.md and
docs/runbooks.md marked `<!-- doc-test: run -->` runs against one `fleetllm demo`, as a reader would type
it, and the output the docs show is compared where they show it (tests/docblocks/blocks.py says how).

The docs' example names become the demo's: the runbooks' table of names (the control plane's URL, its
config, `~/fleet`, the header and token files under `~/.fleetllm/`) and the quickstart's scratch directory
and control plane. `~` is a home of the test's own, holding those files and a clone of the demo's fleet
repository whose `origin` is the repository the demo's control plane serves."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetllm.demo.fleet import addresses
from tests.demo.test_demo_real import _clean_env, demo_command, free_block
from tests.docblocks.blocks import DOCUMENTS, ROOT, Block, blocks, mismatch, outputs

pytestmark = pytest.mark.slow

FLEETLLM = Path(sys.executable).parent / "fleetllm"
DOC_SCRATCH = "/tmp/fleetllm-demo-k2x9"  # the quickstart's example scratch directory
DOC_URL = "http://127.0.0.1:36383"  # and its control plane
DOC_BOXES = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]  # the demo's default addresses
RUNBOOK_NAMES = {  # the runbooks' table: "The examples use these names"
    "https://fleet.example.org", "/etc/fleetllm/control-plane.yaml", "~/fleet", "~/.fleetllm/admin.header"}
GIT_IDENTITY = "[user]\n\tname = Doc Reader\n\temail = reader@example.org\n"


@dataclass(frozen=True)
class Demo:
    workdir: Path
    url: str
    boxes: list[str]
    home: Path
    output: Path

    def printed(self) -> str:
        return self.output.read_text()

    def shown(self) -> dict[str, str]:
        """The run's values -> the docs' examples, for comparing output."""
        return {str(self.workdir): DOC_SCRATCH, self.url: DOC_URL, **dict(zip(self.boxes, DOC_BOXES, strict=True))}

    def named(self, text: str) -> str:
        """A doc's block with the docs' example names made this demo's."""
        for shown, real in ((DOC_SCRATCH, str(self.workdir)), (DOC_URL, self.url),
                            ("https://fleet.example.org", self.url),
                            ("/etc/fleetllm/control-plane.yaml", str(self.workdir / "control-plane" /
                                                                    "control-plane.yaml")),
                            (".venv/bin/fleetllm", str(FLEETLLM))):
            text = text.replace(shown, real)
        return text

    def run(self, script: str) -> subprocess.CompletedProcess[str]:
        env = {**_clean_env(), "HOME": str(self.home), "PATH": f"{FLEETLLM.parent}:{os.environ['PATH']}"}
        env.pop("FLEETLLM_URL", None)
        return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=240, check=False)


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    root = tmp_path_factory.mktemp("docs")
    workdir, first, output = root / "demo", free_block(), root / "demo.out"
    with open(output, "wb") as out:
        process = subprocess.Popen(demo_command(workdir, first), env=_clean_env(), stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while (output.read_text().count("-> Healthy") < 7 and process.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.5)
        text = output.read_text()
        assert process.poll() is None and text.count("-> Healthy") >= 7, text
        found = re.search(r"control plane \(fleetllm serve\) on (http://127\.0\.0\.1:\d+)", text)
        assert found, text
        home = root / "home"
        (home / ".fleetllm").mkdir(parents=True)
        secrets = workdir / "secrets"
        for name, source in (("admin.header", "admin-auth.header"), ("admin.token", "admin-token"),
                             ("viewer.token", "admin-token")):
            (home / ".fleetllm" / name).write_bytes((secrets / source).read_bytes())
            (home / ".fleetllm" / name).chmod(0o600)
        (home / ".gitconfig").write_text(GIT_IDENTITY)
        # A clone to push from, as the runbooks' ~/fleet; the demo's repository takes pushes to its branch.
        _git("config", "receive.denyCurrentBranch", "updateInstead", cwd=workdir / "fleet")
        subprocess.run(["git", "clone", "-q", str(workdir / "fleet"), str(home / "fleet")], check=True)
        yield Demo(workdir, found.group(1), addresses(first, 4), home, output)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=180)
        except subprocess.TimeoutExpired:
            process.kill()


def setup(block: Block, demo: Demo) -> dict[str, str]:
    """What a block needs first, as a reader would have it, and the values of its placeholders."""
    fleet = demo.home / "fleet"
    if "<bad commit>" in block.text:  # a bad commit reached the tracked branch: the runbook reverts it
        _git("pull", "-q", "--ff-only", cwd=fleet)
        placement = fleet / "placement.yaml"
        placement.write_text(placement.read_text().replace("[llama3.1-8b, 8002]", "[llama3.1-8b, 8001]", 1))
        _git("commit", "-qam", "a duplicate port", cwd=fleet)
        _git("push", "-q", "origin", "main", cwd=fleet)
        return {"<bad commit>": _git("rev-parse", "HEAD", cwd=fleet)}
    return {}


def run_blocks() -> list[Block]:
    return [b for doc in DOCUMENTS for b in blocks(doc) if b.kind == "run"]


def script(block: Block, demo: Demo, placeholders: dict[str, str]) -> str:
    text = demo.named(block.text)
    for placeholder, value in placeholders.items():
        text = text.replace(placeholder, value)
    return text


def test_the_runbooks_names_are_the_ones_mapped() -> None:
    text = (ROOT / "docs" / "runbooks.md").read_text()
    table = text[text.index("The examples use these names"):text.index("`curl -H @FILE`")]
    assert set(re.findall(r"\| `([^`]+)` \|", table)) == RUNBOOK_NAMES


def test_the_demo_prints_what_the_quickstart_shows(demo: Demo) -> None:
    shown = [b for b in blocks(ROOT / "docs" / "quickstart.md") if b.kind == "demo-output"]
    assert shown, "the quickstart shows the demo's set-up"
    for block in shown:
        assert mismatch(block.text, demo.printed(), demo.shown()) is None, \
            f"{block.where}: {mismatch(block.text, demo.printed(), demo.shown())}"


@pytest.mark.parametrize("block", run_blocks(), ids=lambda b: b.where)
def test_the_block_runs_against_the_demo(block: Block, demo: Demo) -> None:
    done = demo.run(script(block, demo, setup(block, demo)))
    assert done.returncode == 0, f"{block.where} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    for run, output in outputs(block.doc):
        if run == block:
            problem = mismatch(output.text, done.stdout, demo.shown())
            assert problem is None, f"{output.where}: {problem}\n{done.stdout}"


def test_a_changed_command_fails(demo: Demo) -> None:
    """The run is what fails a runbook whose command changed: an option the command lost, a flag renamed."""
    control = next(b for b in run_blocks() if "fleetllm control" in b.text)
    changed = script(control, demo, {}).replace("fleetllm control ", "fleetllm controls ")
    assert demo.run(changed).returncode != 0
    assert demo.run(script(control, demo, {})).returncode == 0
