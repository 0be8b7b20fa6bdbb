"""How a run is started: :class:`Options`, one frozen object (``topo.collector``'s keywords and ``topo launch``'s flags)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

#: collector arguments that the plan or the policy placement decides
RESERVED_KWARGS = ("create_env_fn", "create_env_kwargs", "num_workers", "frames_per_batch", "total_frames", "sync",
                   "policy", "policy_factory", "weight_sync_schemes", "weight_updater")


@dataclass(frozen=True)
class Options:
    """A run's options, beside its plan.

    ``policy_factory``: the policy's factory (``"module:callable"`` or a callable), over the spec's ``policy.factory``;
    ``policy``: the trainer's policy, whose weights :meth:`~topo.launch.run.Run.update_weights` pushes;
    ``report_dir``: where the report and the run directory are kept (None: a temporary run directory, kept only
    when topo failed); ``progress``: startup progress on stderr (``progress_while_collecting``: also after);
    ``startup_timeout``, ``max_concurrent_starts``: over the plan's ``launch`` section; ``process_logs``: the
    processes' output in the run directory, not the terminal; ``command``: the report's command (default: argv
    and cwd); ``evaluation``: False starts no eval process though the plan has an eval section;
    ``logger``: a ``torchrl.record.loggers`` logger the run's figures go to (:mod:`topo.launch.figures`);
    ``resume``: the run this one continues (:mod:`topo.launch.resume`): its ``run.state_dict()``, that saved as JSON,
    or its run directory;
    ``collector_kwargs``: any other torchrl collector keyword (``replay_buffer``, ``env_device``, ...).
    """

    policy_factory: str | Callable | None = None
    policy: Any = None
    report_dir: str | None = None
    progress: bool = True
    progress_while_collecting: bool = False
    startup_timeout: float | None = None
    max_concurrent_starts: int | None = None
    process_logs: bool = False
    command: dict | None = None
    evaluation: bool = True
    logger: Any = None
    resume: Any = None
    collector_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, **given: Any) -> Options:
        """Options from keywords: those named above, and every other one a torchrl collector keyword."""
        names = {f.name for f in dataclasses.fields(cls)} - {"collector_kwargs"}
        return cls(**{k: v for k, v in given.items() if k in names},
                   collector_kwargs={k: v for k, v in given.items() if k not in names})
