"""Agent-facing interfaces: one tool registry (tools.py) with thin adapters for OpenAI function calling,
an MCP server over stdio (mcp_server.py) and a tool-calling loop (loop.py). See docs/agents.md."""
