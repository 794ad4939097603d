"""The harness runtime: load a harness file, run episodes concurrently, score them, record traces.

Modules (import them directly; this package imports nothing heavy, because the sandboxed harness
process imports ``whale.harness.api`` and must stay light):

* ``api``      — the harness interface (:class:`~whale.harness.api.BaseHarness`, hooks, constants,
  action/decision shapes). What a harness file imports.
* ``validate`` — static + load-time checks of a harness file (imports, required names, signatures,
  promptOnly diff against h0). Errors name the line and the rule.
* ``launch``   — how the harness process is started: always through ``whale.sandbox`` (namespaces; in
  the run's harness pod, ``pod``; asked for by name, ``spec.execution.sandbox.isolation: none``), with a staged
  stdlib-only package as its only import path; no fallback.
* ``host``     — the run's harness host (``python -m whale.harness.host``, the harness pod on a
  cluster): one harness process per connection from the run's workloads, no credentials in reach.
* ``remote``   — the workloads' side of it: a harness process over one TCP connection, the same
  :class:`~whale.harness.launch.Spawned` a local one is.
* ``worker``   — the program inside the sandboxed process (standard library only): confines imports,
  puts up the audit hook, loads the harness, answers hook calls.
* ``process``  — :class:`~whale.harness.process.HarnessProcess`, the runtime's handle on that
  process (async, many concurrent episodes over one pipe), and
  :class:`~whale.harness.process.HarnessPool` (a few of them, calls to the least busy).
* ``runner``   — :class:`~whale.harness.runner.EpisodeRunner`: the episode loop, bounded
  concurrency, verifier, token accounting; :func:`~whale.harness.runner.run_episodes` for one call.
* ``trace``    — the :class:`~whale.harness.trace.Episode` record, JSON lines.

Domain side: ``whale.domain`` (:class:`~whale.domain.Domain`, :class:`~whale.domain.Environment`).
Inference side: ``whale.inference.base`` (:class:`~whale.inference.base.InferenceClient`).
"""
