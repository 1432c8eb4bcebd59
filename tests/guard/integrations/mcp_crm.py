"""A second business system behind a real MCP server over Streamable HTTP (``mcp_crm.py
PORT``), for the gateway's guide: the ``crm`` of docs/agent-guide.md's configuration. Its
effects are rows in the SQLite file ``CRM_DB`` names."""

from __future__ import annotations

import os
import sqlite3
import sys

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

crm = MCPServer("crm")


def _record(kind: str, account: str) -> None:
    with sqlite3.connect(os.environ["CRM_DB"]) as db:
        db.execute("CREATE TABLE IF NOT EXISTS effects (kind TEXT, account TEXT)")
        db.execute("INSERT INTO effects VALUES (?, ?)", (kind, account))


@crm.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_customer(account: str) -> str:
    """Look a customer up."""
    _record("lookup", account)
    return f"customer {account}: active"


@crm.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
def close_account(account: str) -> str:
    """Close a customer's account."""
    _record("close", account)
    return f"account {account} closed"


if __name__ == "__main__":
    crm.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
