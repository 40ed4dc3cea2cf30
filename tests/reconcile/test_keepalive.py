"""The reconciler's sessions do not send on a pooled connection that LiteLLM's or vLLM's server (uvicorn:
5 s) may be closing for idleness. With aiohttp's default (15 s) a LiteLLM write that followed more than
5 s of probes in the same pass went out on such a connection, was reset before any answer, and failed
the pass."""

from __future__ import annotations

import asyncio

import aiohttp

from fleetllm.adapters.http import KEEPALIVE_S, connector, request_json
from tests.support.idle_server import idle_closing_server

UVICORN_KEEPALIVE_S = 5.0


def test_a_connection_idle_past_the_pool_keepalive_is_not_sent_on() -> None:
    assert KEEPALIVE_S < UVICORN_KEEPALIVE_S
    # The server resets a connection idle for longer than the pool keeps one, and shorter than uvicorn.
    idle_close_s = (KEEPALIVE_S + UVICORN_KEEPALIVE_S) / 2

    async def two_writes(url: str) -> list[int]:
        statuses = []
        async with aiohttp.ClientSession(connector=connector()) as session:
            for attempt in range(2):
                if attempt:
                    await asyncio.sleep(idle_close_s + 0.2)  # the probes of a pass, between two writes
                status, body = await request_json(session, "POST", url + "/model/new", what="POST /model/new",
                                                  body={"model_name": "m"})
                assert body == {"choices": [{"message": {"content": "hi"}}]}
                statuses.append(status)
        return statuses

    with idle_closing_server(idle_close_s) as url:
        assert asyncio.run(two_writes(url)) == [200, 200]
