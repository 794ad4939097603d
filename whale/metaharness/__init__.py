"""Meta-Harness search: the harness phase of WHALE (see ``docs/metaharness.md``).

Modules (import them directly):

* ``records``  — the candidate record, statuses, acceptance (best score, fewer turns, earlier; flagged
  candidates refused under the default integrity policy), summaries. Pure.
* ``archive``  — the phase's archive in the object store (layout in its docstring), and the proposer's local view.
* ``integrity`` — reward integrity: model usage of a candidate's episodes, the flags against the incoming
  harness (rewarded without a model call; a better score on a fraction of the tokens). Pure.
* ``validate`` — which of the harness runtime's rules a proposed candidate must pass (plus promptOnly).
* ``evaluate`` — smoke test and full score of a candidate through the harness runtime.
* ``proposer`` — the proposer interface and its backends (the built-in agent loop over the OpenAI-compatible
  and Anthropic Messages APIs, with the sandboxed ``run_candidate`` and ``run_shell`` tools; an external
  agent CLI run in the sandbox; replay), and the checks that refuse a proposer that cannot run.
* ``loop``     — :class:`~whale.metaharness.loop.HarnessSearch`, the iteration loop with resume.

The workload entry point is ``whale.workloads.search``.
"""
