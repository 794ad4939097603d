"""What the operator asks of a run's domain plugin: its tool services and its split sizes.

The plugins are loaded once per domain and operator process; a plugin that cannot load or refuses the run's
data settings is a spec problem (:class:`~whale_operator.config.SpecError`), split sizes it cannot compute here
are a temporary wait (:class:`WaitingForData`).
"""

from __future__ import annotations

import threading
from typing import Any

from whale.core import layout
from whale.domain import Domain, DomainOptionsError, ToolService, for_run
from whale.store import Store
from whale_operator.cluster_spec import ClusterRunSpec
from whale_operator.config import OperatorConfig, SpecError


class WaitingForData(RuntimeError):
    """The split sizes of the run's domain are unknown yet (temporary)."""


class DomainCatalog:
    """The domain plugins this operator process has loaded, by name."""

    def __init__(self, config: OperatorConfig):
        self.config = config
        self._plugins: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _plugin(self, name: str) -> Any:
        with self._lock:
            if name not in self._plugins:
                from whale import plugins

                try:
                    self._plugins[name] = plugins.load(name)
                except Exception as exc:  # noqa: BLE001 - an unknown/broken plugin is a spec problem
                    raise SpecError(
                        "spec.domain",
                        f"cannot load domain {name!r} in the operator ({exc}); "
                        "use an installed domain (`whale domains` lists them)",
                    ) from None
            return self._plugins[name]

    def _for_run(self, spec: ClusterRunSpec) -> Any:
        """The run's domain with its options (a copy of the shared plugin)."""
        try:
            return for_run(self._plugin(spec.domain), spec.experiment.domain_options)
        except DomainOptionsError as exc:
            raise SpecError(exc.problems[0].split(":", 1)[0], exc.problems[0].split(":", 1)[1].strip()) from None

    def effective(self, spec: ClusterRunSpec) -> tuple[ClusterRunSpec, bool]:
        """(the spec as this cluster runs it, whether it scores with the LLM judge): its domain options validated
        (:class:`SpecError` naming the field) and given their cluster defaults (``Domain.cluster_options``:
        search_qa's corpus auto is wiki18 here); the judge's Secret dropped where the options never use it, so no
        pod holds a key it does not need."""
        domain = self._for_run(spec)
        if not isinstance(domain, Domain):  # a plugin without options (whale.domain.for_run)
            return spec, False
        options = domain.cluster_options(domain.options)
        judge = spec.experiment.verifier.judge
        spec = spec.with_sections(domain_options=options.model_dump(mode="json", by_alias=True))
        if not domain.scores_with_judge and judge.api_key_secret is not None:
            verifier = spec.experiment.verifier.model_copy(
                update={"judge": judge.model_copy(update={"api_key_secret": None})}
            )
            spec = spec.with_sections(verifier=verifier)
        return spec, bool(domain.scores_with_judge)

    def tools_for(self, spec: ClusterRunSpec) -> tuple[ToolService, ...]:
        """The tool services the run's domain declares for its data settings (``Domain.tool_services_for``)."""
        domain = self._for_run(spec)
        try:
            return tuple(domain.tool_services_for(spec.experiment.data))
        except Exception as exc:  # noqa: BLE001 - the plugin refused the data settings
            raise SpecError("spec.experiment.data", f"domain {spec.domain!r}: {exc}") from None

    def split_sizes(self, store: Store, run: str, spec: ClusterRunSpec) -> dict[str, int] | None:
        """The run's split sizes from the store; None when a prepare Job must write them."""
        key = layout.split_sizes_key(run)
        sizes = store.read_json_or_none(key)
        if sizes:
            return {k: int(v) for k, v in sizes.items()}
        if not self.config.domain_split_sizes or spec.experiment.data.source == "full":
            return None  # the prepare Job writes them (full data: after fetching it into the store)
        domain = self._for_run(spec)  # loaded once a process (an entry-point scan costs tens of ms)
        try:
            sizes = dict(domain.split_sizes(spec.experiment.data))
        except Exception as exc:  # noqa: BLE001 - any plugin failure means "not known here"
            raise WaitingForData(
                f"split sizes of domain {spec.domain!r} are unknown here ({exc}); write {store.uri_for(key)} "
                f'with {{"weight": N, "harness": N, "test": N}} (`whale plan` prints them)'
            ) from None
        store.write_json(key, sizes)
        return sizes
