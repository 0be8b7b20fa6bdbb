"""A run's time breakdown (:mod:`topo.runtime.time_breakdown`) from what it measured: each subcollector's heartbeat files
(every start of it: restarts included), the trainer's pace and the inference server's figures. A subcollector's wait
for inference is its policy calls (multi mode), or its async workers' own waits between their steps."""
from __future__ import annotations

from typing import Any

from topo.runtime import heartbeat
from topo.runtime.time_breakdown import Pace, Timed, breakdown


def of_run(state, pace: Pace | None, server: dict[str, Any] | None) -> dict[str, Any]:
    """:func:`topo.runtime.time_breakdown.breakdown` of the run ``state`` describes."""
    subs = []
    for sub in state.plan["subcollectors"]:
        c, env, policy, waited = sub["index"], Timed(), Timed(), Timed()
        for restart in sorted({s.restart for s in state.all_subcollectors() if s.index == c}):
            slots = heartbeat.timed(state.run.path, c, restart) or []
            for i, slot in enumerate(slots):
                if i == 0:
                    policy += slot
                else:
                    env += slot
            for slot in (heartbeat.waits(state.run.path, c, restart) or [])[1:]:
                waited += slot
        if waited.count:
            subs.append({"subcollector": c, "workers": sub["num_workers"], "env": env, "policy": waited,
                         "per_worker": True})
        else:
            subs.append({"subcollector": c, "workers": sub["num_workers"], "env": env, "policy": policy})
    return breakdown(subs, pace.figures() if pace is not None else None, server)
