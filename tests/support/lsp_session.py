"""The language server in process, fed message by message: its replies, and the server object
(tests in editor/ and check/ use it, so it lives here, not in a test module)."""

from __future__ import annotations

import asyncio
import json

from memfit.editor import lsp

TIMEOUT = 30  # a safety net against a hung server, never the synchronisation itself


class Capture:
    def __init__(self) -> None:
        self.messages: list[dict] = []

    def write(self, data: bytes) -> None:
        self.messages.append(json.loads(data))

    def close(self) -> None:
        pass


def session(messages: list) -> tuple[lsp.MemfitServer, list[dict]]:
    server = lsp.make_server()
    out = Capture()
    server.protocol.set_writer(out, include_headers=False)

    async def run() -> None:
        for message in messages:
            server.protocol.receive(message if isinstance(message, bytes) else json.dumps(message).encode())
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        # analyses run in threads and requests wait for their document's: let every task the messages started finish
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while asyncio.get_running_loop().time() < deadline and [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            await asyncio.sleep(0.01)

    asyncio.run(run())
    return server, out.messages


INIT = {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {"processId": None, "rootUri": None, "capabilities": {}}}
