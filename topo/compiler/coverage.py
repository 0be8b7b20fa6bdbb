"""Coverage of a plan: workers per task, instructions per subcollector, group completeness, workers per GPU."""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from topo.diagnostics import task_order


def coverage(plan: dict[str, Any]) -> dict[str, Any]:
    groups = plan.get("groups") or {}
    size = groups.get("size", 1) if groups.get("parallel_repeats") else 1
    per_task: Counter = Counter()
    groups_per_task: dict[Any, set] = defaultdict(set)
    members: dict[int, list[dict]] = defaultdict(list)
    per_gpu: Counter = Counter()
    instructions = []
    for sub in plan["subcollectors"]:
        distinct = set()
        for row in sub["workers"]:
            per_task[row["task_id"]] += 1
            groups_per_task[row["task_id"]].add(row["group"])
            members[row["group"]].append(row)
            per_gpu[row["render_gpu"]] += 1
            distinct.add(row["instruction"])
        instructions.append(len(distinct))
    incomplete = [gid for gid, rows in members.items() if not _complete(rows, size)]
    return {
        "workers": sum(per_task.values()),
        "subcollectors": len(plan["subcollectors"]),
        "tasks": [
            {"task_id": task, "workers": n, "groups": len(groups_per_task[task])}
            for task, n in sorted(per_task.items(), key=lambda kv: task_order(kv[0]))
        ],
        "instructions_per_subcollector": instructions,
        "groups": {"count": len(members), "workers_per_group": size, "complete": len(members) - len(incomplete),
                   "incomplete": sorted(incomplete)},
        "render_gpus": [{"render_gpu": gpu, "workers": n}
                        for gpu, n in sorted(per_gpu.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))],
    }


def _complete(rows: list[dict], size: int) -> bool:
    """A group is complete when it has ``size`` workers, in one subcollector, sharing task and init-state schedule."""
    first = rows[0]
    same = all(
        (r["subcollector"], r["task_id"], r["init_state_mode"], r["init_state_id"], r["group_id_offset"])
        == (first["subcollector"], first["task_id"], first["init_state_mode"], first["init_state_id"],
            first["group_id_offset"])
        for r in rows
    )
    return same and len(rows) == size
