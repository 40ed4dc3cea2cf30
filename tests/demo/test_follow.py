"""Which boxes a new revision touches, for the live demo to restart, boot or stop."""

from __future__ import annotations

from fleetllm.adapters.git import read_directory
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.files import Snapshot
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import Bearers
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.demo.fleet import simulate
from fleetllm.demo.follow import Changes, changes, loopback
from fleetllm.demo.move import choose_move, move_row
from tests.conftest import EXAMPLE, TEST_LEGACY_KEY, TEST_SALT

BEARERS = Bearers(Salt(TEST_SALT), TEST_LEGACY_KEY)


def fleet(files: dict[str, bytes], revision: str) -> Fleet:
    validation = validate_snapshot(Snapshot(revision, files, {k: k for k in files}))
    assert validation.fleet is not None, validation.diagnostics
    return validation.fleet


def demo_files() -> dict[str, bytes]:
    return dict(simulate(read_directory(EXAMPLE)).files)


def test_a_move_restarts_exactly_the_two_boxes() -> None:
    files = demo_files()
    before = fleet(files, "a" * 40)
    move = choose_move(before)
    after = fleet({**files, "placement.yaml": move_row(files["placement.yaml"].decode(), move).encode()}, "b" * 40)
    assert changes(before, after, BEARERS) == Changes(restart=("127.0.0.2", "127.0.0.3"))


def test_a_new_commit_that_changes_no_box_restarts_nothing() -> None:
    files = demo_files()
    routes = files["models.yaml"].replace(b"context_window: 40960", b"context_window: 40000")  # live lifetime
    assert routes != files["models.yaml"]
    assert changes(fleet(files, "a" * 40), fleet({**files, "models.yaml": routes}, "b" * 40), BEARERS).empty


def test_a_recipe_change_restarts_the_boxes_that_run_it() -> None:
    files = demo_files()
    dtype = files["models.yaml"].replace(b'"--dtype", "bfloat16"', b'"--dtype", "float16"')  # gemma3-27b's args
    assert dtype != files["models.yaml"]
    found = changes(fleet(files, "a" * 40), fleet({**files, "models.yaml": dtype}, "b" * 40), BEARERS)
    assert found == Changes(restart=("127.0.0.4",))


def test_boxes_that_come_and_go() -> None:
    files = demo_files()
    placement = files["placement.yaml"].decode()
    added = placement + "\n  127.0.0.9:\n    - [qwen3-8b, 8001]\n\n  203.0.113.99:\n    - [qwen3-8b, 8001]\n"
    removed = placement.replace("  127.0.0.4:\n", "  127.0.0.6:\n")
    before = fleet(files, "a" * 40)
    assert changes(before, fleet({**files, "placement.yaml": added.encode()}, "b" * 40), BEARERS) == Changes(
        new=("127.0.0.9",), cannot=("203.0.113.99",))
    assert changes(before, fleet({**files, "placement.yaml": removed.encode()}, "c" * 40), BEARERS) == Changes(
        new=("127.0.0.6",), gone=("127.0.0.4",))


def test_loopback() -> None:
    assert loopback("127.0.0.2") and loopback("127.9.9.9") and loopback("::1")
    assert not loopback("127.0.0.1") and not loopback("10.0.0.1") and not loopback("k7v2m9x4q1w8e3")


class _Store:
    def __init__(self, agents: dict[str, bool]) -> None:
        self.agents = agents

    def latest_reports(self) -> dict[str, object]:
        from types import SimpleNamespace

        return {box: SimpleNamespace(agent=agent) for box, agent in self.agents.items()}


class _Stage:
    """What follow() uses of the running demo; provision() records instead of restarting."""

    def __init__(self, fleet_: Fleet, agents: dict[str, bool]) -> None:
        from types import SimpleNamespace

        secrets = {"legacy-api-key": TEST_LEGACY_KEY, "vllm-api-salt": TEST_SALT}
        self.workspace = SimpleNamespace(secret=secrets.__getitem__)
        self.runner = SimpleNamespace(fleet=fleet_)
        self.store = _Store(agents)
        self.boxes = {name: name for name in fleet_.boxes}
        self.owned: set[str] = set()
        self.provisioned: list[object] = []
        self.said: list[str] = []
        self.control_plane = SimpleNamespace(wait_for=lambda revision: self.provisioned.append(f"serves {revision}"))

    def say(self, message: str, style: str = "") -> None:
        self.said.append(message)

    def provision(self, box: object, what: str) -> None:
        self.provisioned.append(box)


def test_the_live_demo_restarts_only_boxes_without_the_box_agent() -> None:
    from fleetllm.demo.follow import follow

    files = demo_files()
    before = fleet(files, "a" * 40)
    move = choose_move(before)
    after = fleet({**files, "placement.yaml": move_row(files["placement.yaml"].decode(), move).encode()}, "b" * 40)
    stage = _Stage(after, {"127.0.0.2": True, "127.0.0.3": True})
    assert follow(stage, before) is after  # type: ignore[arg-type]
    assert stage.provisioned == []  # the agents apply the release themselves
    stage = _Stage(after, {"127.0.0.2": True, "127.0.0.3": False})
    follow(stage, before)  # type: ignore[arg-type]
    # a box without the agent is restarted, as before, once the control plane serves the commit (booted before,
    # it would fetch the old config and stay failed)
    assert stage.provisioned == ["serves " + "b" * 40, "127.0.0.3"]
