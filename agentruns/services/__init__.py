"""Services write: runs (start, enqueue, decide, cancel), the runtime loop, the reaper.

Interfaces (views, API, tasks, commands) call one service and render its answer.
"""
