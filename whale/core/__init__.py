"""The pure core of WhaleRun: the spec and status types, the schedule, the store layout, the wire
protocol, the adaptive patience rules and the alternation state machine.

Pure: pydantic and the standard library only — no I/O, no clock, no randomness, no engine (torch,
kopf, kubernetes, an S3 client). Controllers (``whale.control``, ``whale.runner``, the operator) and
workloads import it; it imports none of them (import-linter enforces it, see pyproject.toml).
"""
