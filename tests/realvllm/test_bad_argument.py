"""A recipe argument vLLM refuses: the real vLLM 0.32 and the stub both exit 2 before loading, with the
same argparse error line. The rollout scenarios' "bad boot change" (`--dtype` with an unknown value)
relies on the stub doing what the real server does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.realvllm.harness import harness_from_env

STUB = Path(__file__).resolve().parents[2] / "tests" / "support" / "stub_vllm.py"
ERROR = ("vllm serve: error: argument --dtype: invalid choice: 'bogus' (choose from 'auto', 'bfloat16', "
         "'float', 'float16', 'float32', 'half')")


def _run(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, check=False)
    return done.returncode, done.stderr


def test_an_unknown_dtype_ends_both_servers_with_exit_2_and_the_same_error() -> None:
    harness = harness_from_env()
    real = _run([str(harness.vllm), "serve", str(harness.model), "--port", "1", "--dtype", "bogus"],
                {**os.environ, **harness.box_env()})
    stub = _run([sys.executable, str(STUB), "serve", "m", "--port", "1", "--dtype", "bogus"], dict(os.environ))
    assert real[0] == 2, real[1][-2000:]
    assert stub[0] == 2, stub[1]
    assert ERROR in real[1].splitlines()
    assert ERROR in stub[1].splitlines()


def test_the_stub_accepts_every_dtype_the_real_one_lists() -> None:
    for dtype in ("auto", "bfloat16", "float", "float16", "float32", "half"):
        code, err = _run([sys.executable, str(STUB), "--version", "serve", "m", "--dtype", dtype], dict(os.environ))
        assert code == 0, (dtype, err)
