"""The demo's live display (issue 26, item 6): readable at 80 columns, titled for what runs (the stub, or
the real vLLM on the --real-vllm box), and no "LiteLLM create ..." line for a pass that only plans."""

from __future__ import annotations

import io

from rich.console import Console

from fleetllm.core.judge.plan import Action, ActionKind
from fleetllm.demo.view import STUB_TITLE, Fitted, Row, title, written
from fleetllm.job.apply import ActionOutcome, ActionResult

ROWS = [
    Row("127.0.0.2", 8001, "qwen3-8b", "qwen3-8b", "RUNNING", "Healthy", "serves qwen3-8b at 127.0.0.2:8001",
        "+ would create"),
    Row("127.0.0.2", 8003, "qwen2.5-coder-7b", "qwen2.5-coder-7b", "RUNNING", "Healthy",
        "serves qwen2.5-coder-7b at 127.0.0.2:8003", "+ would create"),
    Row("127.0.0.3", 8002, "qwen3-8b-b", "qwen3-8b", "RUNNING", "Loading",
        "fetched its config 4s ago, not serving yet: vLLM loads its weights (health_grace_s 1800 from its start)",
        "-"),
    Row("198.51.100.230", 8000, "llama3.1-8b", "llama3.1-8b", "no supervisord", "Down",
        "connection refused on 198.51.100.230:8000", "- would delete"),
]


def drawn(width: int, real: tuple[str, ...] = ()) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, legacy_windows=False).print(Fitted(ROWS, real))
    return out.getvalue().splitlines()


def test_the_table_is_readable_at_80_columns() -> None:
    lines = drawn(80)
    assert max(map(len, lines)) <= 80
    for row in ROWS:  # each server on one line, with its program state, verdict and LiteLLM column whole
        server = f"{row.box}:{row.port} {row.server}"
        line = next(line for line in lines if server in line and row.verdict in line)
        assert row.supervisor in line and row.litellm in line
    assert "[qwen3-8b]" in next(line for line in lines if "qwen3-8b-b" in line)  # the model, where it differs
    # The reasons of the servers that are not Healthy follow, one line each, cut to the width.
    reasons = [line for line in lines if line.startswith("  127.0.0.3:8002") or line.startswith("  198.51")]
    assert len(reasons) == 2 and reasons[0].endswith("...") and "connection refused" in reasons[1]
    assert not any("serves qwen3-8b at" in line for line in lines)


def test_a_wide_terminal_has_a_column_per_field() -> None:
    lines = drawn(200)
    header = next(line for line in lines if "supervisor" in line)
    assert all(column in header for column in ("box", "port", "server", "model", "verdict", "LiteLLM", "why"))
    assert any("serves qwen3-8b at 127.0.0.2:8001" in line for line in lines)


def test_the_title_says_which_box_runs_the_real_vllm() -> None:
    assert title() == STUB_TITLE
    real = title(("127.0.0.6",))
    assert "127.0.0.6" in real and "real vLLM" in real and "every vLLM is the stub)" not in real
    assert any("127.0.0.6, which runs the real vLLM" in line for line in drawn(200, ("127.0.0.6",)))


def action(kind: ActionKind) -> Action:
    return Action(kind, "fleetllm:127.0.0.2:8001", "qwen3-8b", "serves")


def test_a_plan_only_pass_says_no_litellm_write() -> None:
    planned = [ActionResult(action(ActionKind.CREATE), True, ActionOutcome.PLANNED)]
    assert written(planned) == []
    done = [ActionResult(action(ActionKind.CREATE), True, ActionOutcome.CREATED),
            ActionResult(action(ActionKind.DELETE), False, ActionOutcome.FAILED, "500")]
    assert written(done) == [("  LiteLLM create fleetllm:127.0.0.2:8001 (qwen3-8b)", "cyan"),
                             ("  LiteLLM delete fleetllm:127.0.0.2:8001 (qwen3-8b) FAILED: 500", "red")]
