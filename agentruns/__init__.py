"""The run domain: agent runs, their leases and fences, the runtime, tools, providers, the queue
tasks, the reaper and the API.

It owns every write to a run's status, lease and fence columns (through ``transitions``) and
must never import ``approvals`` or ``playground``: those apps call into this one.
"""
