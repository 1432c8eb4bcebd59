"""A small business system behind a real MCP server, for the gateway's tests: the SDK's own
``MCPServer``, run over stdio (``mcp_shop.py stdio``) or Streamable HTTP (``mcp_shop.py http
PORT``). Every effect is a row in the SQLite file ``SHOP_DB`` names, so a test counts what
really happened, whatever the gateway or the model said.

``send_refund`` has no idempotency of its own: only the gateway's ledger stands between a
repeated call and a second refund. While the file ``$SHOP_DB.crash`` exists it commits the
refund and then exits before answering (a server that dies mid-call: the client sees
JSON-RPC -32000 and the answer is lost; the refund is real).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

DB = Path(os.environ["SHOP_DB"])

shop = MCPServer("shop")


def _record(kind: str, order: int) -> None:
    with sqlite3.connect(DB) as db:
        db.execute("CREATE TABLE IF NOT EXISTS effects (kind TEXT, order_id INTEGER)")
        db.execute("INSERT INTO effects VALUES (?, ?)", (kind, order))


@shop.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_order(order: int) -> str:
    """Look an order up."""
    if order < 0:
        raise ToolError(f"there is no order {order}")  # the server answers isError
    _record("lookup", order)
    return f"order {order}: delivered"


@shop.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
def send_refund(order: int, amount: int = 10) -> str:
    """Refund an order."""
    if amount > 1000:
        raise ToolError(f"a refund of {amount} is over the limit")  # refused, nothing done
    _record("refund", order)
    if Path(f"{DB}.crash").exists():
        os._exit(1)  # committed, and the answer never leaves
    return f"refund of {amount} sent for order {order}"


@shop.tool()
def delete_order(order: int) -> str:
    """Delete an order (no annotations: a write, as far as anyone can tell)."""
    _record("delete", order)
    return f"order {order} deleted"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        shop.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        shop.run("stdio")
