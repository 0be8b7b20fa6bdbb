"""torchrl's ``RayCollector``, able to replace one subcollector's actor while the others keep theirs.

:class:`RespawningRayCollector` remembers how torchrl made each actor (:meth:`~RespawningRayCollector.add_collectors`)
and makes one again in its place (:meth:`~RespawningRayCollector.replace`) with its restart's env factory. The
trainer's weights then reach the new actor through a new generation of the Ray weight-sync scheme
(:meth:`~RespawningRayCollector.resync`): its gloo group spans a fixed set of actors, so every actor joins
the new one. Every private torchrl name used here goes through :mod:`.boundary`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

from torchrl.collectors.distributed import RayCollector

from topo.launch import boundary


class RespawningRayCollector(RayCollector):
    """``RayCollector`` whose actor ``index`` can be made again: same policy, options and resources."""

    def add_collectors(self, create_env_fn, num_envs, policy, collector_kwargs, remote_configs):
        """torchrl's, remembering each actor's policy, options and remote config."""
        self._topo_made = [(policy[i] if isinstance(policy, Sequence) else policy, dict(params), config)
                           for i, (params, config) in enumerate(zip(collector_kwargs, remote_configs))]
        return super().add_collectors(create_env_fn, num_envs, policy, collector_kwargs, remote_configs)

    def replace(self, index: int, env_factory: Callable, restart: int, policy_factory: Callable | None = None) -> Any:
        """A new actor for subcollector ``index`` in the old one's place (which the caller ends), building its
        env with ``env_factory`` and, when given, its policy with ``policy_factory`` (a new client of the inference
        server); its processes' records carry ``restart``."""
        policy, params, config = self._topo_made[index]
        params = {**params, "worker_idx": index, "topo_records": {**params["topo_records"], "restart": restart}}
        if policy_factory is not None:
            params["policy_factory"] = policy_factory
        actor = self._make_collector(self.collector_class.as_remote(config).remote, env_maker=env_factory,
                                     policy=policy, other_params=params)
        boundary.ray_remote_collectors(self)[index] = actor
        return actor

    def resync(self, source: Any, timeout: float) -> Any:
        """Every actor joins a new weight-sync group and starts from ``source``'s weights; the new scheme."""
        import ray

        old = boundary.weight_scheme(self)
        new = boundary.ray_new_weight_scheme(old)
        actors = list(self.remote_collectors)
        new.init_on_sender(model_id="policy", context=self, model=source)
        ray.get([a.register_scheme_receiver.remote({"policy": new}, synchronize_weights=False) for a in actors],
                timeout=timeout)
        joined = [a.cascade_execute.remote("_receiver_schemes['policy'].connect") for a in actors]
        new.connect()
        ray.get(joined, timeout=timeout)
        boundary.set_weight_scheme(self, new)
        old.shutdown()
        return new
