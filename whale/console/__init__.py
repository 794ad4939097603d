"""What the `whale` command line shows: the live progress of `whale run`, the end of a run, the runs of a
store, and a run's logs.

Kept out of the typer functions (``whale.cli`` only parses arguments and calls in here) and split so
that what is shown is computed by pure functions tested from recorded sequences:

* :mod:`whale.console.progress`: a run at one moment (:class:`~whale.console.progress.Frame`) to plain
  timestamped event lines or a rich renderable, with elapsed times and ETAs; pure;
* :mod:`whale.console.display`: the stateful driver `whale run` hands to the runner (rich Live on a
  terminal, plain lines otherwise);
* :mod:`whale.console.summary`: the end of a run: evaluation table, best point, accepted harness, next
  commands; pure;
* :mod:`whale.console.plan`: per-phase rollouts and the evaluation cost of `whale plan`; pure;
* :mod:`whale.console.runs`: `whale list`, the runs of a store;
* :mod:`whale.console.logs`: `whale logs`, a run's workload output, followed live with bounded reads.
"""
