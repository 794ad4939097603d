"""Run control shared by both controllers: what they observe of the store and what they do with a
``decide()`` answer.

The local runner (``whale.runner.local``) and the operator (``whale_operator.reconcile``) differ only
in how a phase's child starts and stops (a supervised subprocess vs a Kubernetes Job) and how a child
is seen (``Child``). Everything else is here, once:

* :class:`~whale.control.observer.StoreObserver` reads what the workloads wrote (results of phases
  not yet absorbed, the running phase's metrics, complete checkpoints) into ``Observations``;
* :func:`~whale.control.planner.plan` turns a ``Transition`` (what ``decide`` answered) into what to do now: the one child to
  start (owed evaluations first, one child at a time), the stop requests, what inference should
  serve, and whether the loop ends;
* :func:`~whale.control.planner.write_request` and :func:`~whale.control.serving.serve` are the
  only writers of ``request.json`` and ``control/serving.json`` on the controller side.

Layers (import-linter): ``whale.core`` <- ``whale.control`` <- ``whale.runner`` / the operator.
"""
