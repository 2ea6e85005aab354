"""The app as an MCP server (`python app.py --mcp`): the `mcp` package's own client, over streamable
HTTP, lists specviz's tools by their names and races a prompt on the tiny models; the answer names the
speedup, its 95% interval and the clock."""

import asyncio
import json

import pytest
from conftest import running_app

pytestmark = pytest.mark.slow       # an app server in a subprocess

TOOLS = {"race_speculative_decoding", "compare_configurations", "load_sweep", "read_recording"}


async def ask(url: str):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async with streamablehttp_client(url) as (read, write, _), ClientSession(read, write) as session:
        await session.initialize()
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        raced = await session.call_tool("race_speculative_decoding", {
            "prompt": "the cat sat on the mat and the cat sat on the", "draft": "ngram", "k": 4, "max_new_tokens": 16})
        recorded = await session.call_tool("read_recording", {"name": "prompt-lookup-rewrite.json"})
        refused = await session.call_tool("race_speculative_decoding", {"prompt": "the cat", "k": 1000})
        return tools, raced, recorded, refused


def answer(result) -> dict:
    assert not result.isError, result.content
    return json.loads(result.content[0].text)


def test_the_mcp_server_lists_the_tools_and_races_a_prompt():
    pytest.importorskip("mcp")
    with running_app(tiny=True, GRADIO_MCP_SERVER="True") as app:
        tools, raced, recorded, refused = asyncio.run(ask(app.url + "gradio_api/mcp/"))
    assert set(tools) == TOOLS                      # the tabs' events are no tools
    race = tools["race_speculative_decoding"]
    assert "Race speculative decoding" in race.description
    assert {"prompt", "draft", "k", "max_new_tokens"} <= set(race.inputSchema["properties"])
    assert race.inputSchema["properties"]["k"]["type"] == "integer"
    summary = answer(raced)["summary"]
    assert summary["speedup_low"] <= summary["speedup"] <= summary["speedup_high"]
    assert summary["clock"] == "thread CPU time" and summary["tokens"] == 16
    assert answer(recorded)["runs"][0]["summary"]["speedup"] > 0
    assert refused.isError and "k (tokens drafted per cycle) must be a whole number from 1 to 16" in \
        refused.content[0].text
