"""Services write: runs (start, enqueue, decide, cancel), the runtime loop, the reaper, MCP sync.

Interfaces (views, API, tasks, commands) call one service and render its answer.
"""
