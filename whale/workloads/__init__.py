"""The workloads the Jobs (and the local runner's child processes) run: train, search, eval
(and prepare: the operator's data preparation, see ``whale.workloads.prepare``).

Each module ``whale.workloads.<name>`` exposes ``main(store, run, phase) -> None`` and follows the
contract in ``whale.core.protocol``: read the PhaseRequest, append metrics, check STOP between steps,
write the result last. ``python -m whale.workloads <name> --store URI --run RUN --phase PHASE``
dispatches to it (``__main__``).
"""

WORKLOADS = ("train", "search", "eval", "prepare")
