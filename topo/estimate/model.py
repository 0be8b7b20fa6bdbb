"""What a plan will take on its nodes, from one worker measured alone (:mod:`.probe`): pure arithmetic, no torch.

**Memory**, per node, resident sets summed (as ``topo bench`` sums a run's process tree):
workers x one worker's peak (its VmHWM after the probe's steps) + processes x one bare process (torch and
torchrl.envs imported, no env): each subcollector and, when workers start with forkserver, its forkserver
(multi mode; one forkserver for the run where subcollectors start from it too, topo's default), the inference
server (``policy.placement: server``, or async mode with a policy), the trainer (this host) + policy copies x the
policy's parameter bytes (each subcollector's, the server's, the trainer's).
A plan with an eval section adds its eval workers, eval subcollectors and eval process (they run beside training).
Over :data:`USABLE` of the node's available memory (this host's MemAvailable; under Ray, a declared node's
``memory_gb``), the plan is refused; what fits keeps the subcollectors and lowers the workers per subcollector.

**Ready time** (:func:`ready`), from the probe's start + imports, construction and first reset: the imports no
worker can start before, then the workers' own work over the cores; beside it :func:`topo.bench.bound.lower_bound`
of the plan's launch mode (topo's default: ``forkserver-preload``), max(chain, work / cores).

**Frames/s**; no step is faster than alone, and contention enters as the CPU cap only:

- sync (multi mode: each subcollector's ParallelEnv steps its M workers together): a round takes the slowest
  of M steps (p50 at M = 1, p95 from M = 19, linear in M / (M + 1) between) + a reset amortized over its
  episode (reset / episode steps) + one policy forward at the request size + M x the data plane's time per
  worker (the probe's echo ParallelEnv: serial in the subcollector); frames/s = N / the slowest round;
- async (no barrier): N / (mean step + amortized reset + one forward) (its data plane, shared-memory slots,
  not measured by the probe);
- both capped by the CPU: cores / CPU seconds per frame (a step's, an amortized reset's, a forward's share,
  and in sync mode the data plane's time per worker, both ends of the pipe counted as busy).

**Time per training iteration**: ``frames_per_batch`` / the frames/s of the plan's mode.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Mapping

from topo.bench.bound import Costs, Shape, lower_bound
from topo.compiler.eval_plan import env_key

#: a process that imports torch + torchrl holds ~0.37 GB (measured): a collector, or a worker whose
#: backend states no ``memory_per_worker_gb``
PROCESS_GB = 0.4
HOST = "this host"
UNPLACED = "no declared node"
OVERSUBSCRIBED = 2.0  # busy workers per core past which a warning is given
#: the share of a node's available memory a plan may take: the rest for the kernel, the page cache and a
#: worker's transient peaks (summed resident sets count shared library pages once per process: a sum's
#: error is on the side of caution, its peaks are not)
USABLE = 0.9
MOST_WORKERS = 1024  # per subcollector, the most --target-frames-per-s tries
#: documented figures for what is not measured without a GPU
CUDA_CONTEXT_GB = (0.3, 0.5)  # one CUDA context in a process, by driver and GPU (PyTorch/NVIDIA forums)
EGL_TEXTURES_GB = 0.19  # a LIBERO worker's render context uploads 189 MB of textures (docs/guides/libero.md)


@dataclass(frozen=True)
class Memory:
    """Resident memory of ``workers``, bare ``processes`` and ``policies`` copies (GB each)."""

    workers: int
    worker_gb: float
    processes: int
    process_gb: float
    policies: int = 0
    policy_gb: float = 0.0

    @property
    def gb(self) -> float:
        return self.workers * self.worker_gb + self.processes * self.process_gb + self.policies * self.policy_gb

    def terms(self) -> str:
        """``16 workers x 1.62 GB + 3 processes x 0.45 GB``."""
        terms = [f"{self.workers} workers x {self.worker_gb:.2f} GB", f"{self.processes} processes x {self.process_gb:.2f} GB"]
        if self.policies and self.policy_gb >= 0.005:
            terms.append(f"{self.policies} policy copies x {self.policy_gb:.2f} GB")
        return " + ".join(terms)

    def workers_fitting(self, available_gb: float) -> int:
        """How many workers fit in ``available_gb`` beside the processes and policies."""
        return max(0, math.floor((available_gb - self.gb + self.workers * self.worker_gb) / self.worker_gb))


@dataclass(frozen=True)
class Footprint:
    """GB of one worker (its peak), one bare torch + torchrl process, one policy copy; ``source``: where from."""

    worker_gb: float
    process_gb: float = PROCESS_GB
    policy_gb: float = 0.0
    source: str = "declared"


def declared(memory_per_worker_gb: float | None) -> Footprint:
    """The backend's declared memory per worker (else a bare process's), nothing measured."""
    return Footprint(memory_per_worker_gb or PROCESS_GB, source="declared")


@dataclass(frozen=True)
class Pace:
    """One worker alone on this host, seconds: its startup phases, steps (wall and CPU), later resets, and one
    policy forward at ``forward_batch`` observations."""

    costs: Costs
    step_p50: float
    step_p95: float
    step_mean: float
    step_cpu: float
    reset: float
    reset_cpu: float
    episode_steps: float | None = None
    forward: float = 0.0
    forward_cpu: float = 0.0
    forward_batch: int = 1
    plane: float = 0.0  # a subcollector's ParallelEnv, per worker and round, beside the step (sync mode)

    @property
    def reset_share(self) -> tuple[float, float]:
        """A reset's wall and CPU seconds per step, amortized over an episode (0 when no episode length is known)."""
        if not self.episode_steps:
            return 0.0, 0.0
        return self.reset / self.episode_steps, self.reset_cpu / self.episode_steps

    def slowest_step(self, m: int) -> float:
        """The slowest of ``m`` workers' steps (see the module)."""
        share = min(1.0, max(0.0, (m / (m + 1) - 0.5) / 0.45))
        return self.step_p50 + (self.step_p95 - self.step_p50) * share

    def cpu_per_frame(self, sync: bool = True) -> float:
        return self.step_cpu + self.reset_share[1] + self.forward_cpu / max(self.forward_batch, 1) + \
            (self.plane if sync else 0.0)


def probed(result: Mapping[str, Any], horizon: int | None = None) -> tuple[Footprint, Pace]:
    """The model's figures from a probe's result (:func:`topo.estimate.probe.measure`); ``horizon``: the episode
    length where the probe's steps saw no episode end (the backend's horizon kwarg)."""
    gb = 2 ** 30
    policy = result.get("policy") or {}
    footprint = Footprint(result["peak_rss_bytes"] / gb, result["torchrl_rss_bytes"] / gb,
                          policy.get("param_bytes", 0) / gb, "probe")
    shared = (result.get("start_s") or 0.0) + result["imports_s"]
    cpu = Costs(result["start_cpu_s"] + result["imports_cpu_s"], result["construct_cpu_s"], result["reset_cpu_s"])
    steps = result["steps"]
    pace = Pace(Costs(shared, result["construct_s"], result["reset_s"], cpu=cpu), steps["p50_s"], steps["p95_s"],
                steps["mean_s"], steps["cpu_mean_s"], steps["reset_s"], steps["reset_cpu_s"], steps["episode_steps"] or horizon,
                policy.get("forward_s", 0.0), policy.get("forward_cpu_s", 0.0), policy.get("batch", 1),
                (result.get("plane") or {}).get("wall_s", 0.0))
    return footprint, pace


@dataclass(frozen=True)
class Layout:
    """What of a plan the arithmetic reads: workers and node per subcollector, where the policy runs, the mode."""

    workers: tuple[int, ...]
    nodes: tuple[str, ...]
    policy: str | None = None  # "subcollector", "server" or None (random actions)
    server_node: str = HOST
    async_mode: bool = False
    forkserver: bool = True
    bench_mode: str = "forkserver-preload"
    frames_per_batch: int = 1
    cap: int | None = None  # launch.max_concurrent_starts
    policy_device: str | None = None
    render_gpus: tuple[tuple[int, int], ...] = ()  # (render GPU, workers rendering there)
    eval_workers: tuple[tuple[str, int], ...] = ()  # (node, workers) per eval subcollector: beside the training's
    shared_forkserver: bool = True  # the run's one forkserver forks every subcollector and worker (local, multi)

    @classmethod
    def of(cls, plan: Mapping[str, Any]) -> "Layout":
        placement = plan.get("placement") or {}
        ray = placement.get("engine") == "ray"
        subs = plan["subcollectors"]
        nodes = tuple((p.get("node") or UNPLACED) for p in placement["subcollectors"]) if ray else (HOST,) * len(subs)
        policy = plan.get("policy") or {}
        where = policy.get("placement", "subcollector") if policy.get("factory") else None
        async_mode = (plan.get("collector") or {}).get("mode") == "async"
        server = placement.get("server") or {}
        return cls(tuple(s["num_workers"] for s in subs), nodes, "server" if async_mode and where else where,
                   (server.get("node") or UNPLACED) if ray and server else HOST, async_mode,
                   plan["start_methods"]["workers"] != "spawn" if async_mode
                   else plan["start_methods"]["workers"] == "forkserver", launch_mode(plan),
                   plan["collector"]["frames_per_batch"], plan["launch"].get("max_concurrent_starts"),
                   policy.get("device") if where else None,
                   tuple(sorted(Counter(w["render_gpu"] for s in subs for w in s["workers"]
                                        if w["render_gpu"] is not None).items())),
                   eval_layout(plan), not ray and not async_mode and
                   plan["start_methods"]["subcollectors"] == plan["start_methods"]["workers"] == "forkserver")

    @property
    def shape(self) -> str:
        """``2 x 8`` (or ``3+2`` when subcollectors differ)."""
        return f"{len(self.workers)} x {self.workers[0]}" if len(set(self.workers)) == 1 else "+".join(map(str, self.workers))

    def reshaped(self, per_subcollector: int) -> "Layout":
        return replace(self, workers=(per_subcollector,) * len(self.workers))

    def node_names(self) -> list[str]:
        return list(dict.fromkeys([HOST, *self.nodes, *([self.server_node] if self.policy == "server" else [])]))

    def on(self, node: str) -> list[int]:
        return [c for c, n in enumerate(self.nodes) if n == node]


def eval_layout(plan: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """(node, workers) of each eval subcollector of a training plan: its eval process runs them beside training (on
    this host; under Ray, each where ``placement.default`` puts it)."""
    subs = (plan.get("eval") or {}).get("subcollectors") or []
    placement = plan.get("placement") or {}
    node = ((placement.get("default") or {}).get("node") or UNPLACED) if placement.get("engine") == "ray" else HOST
    return tuple((node, s["num_workers"]) for s in subs)


def launch_mode(plan: Mapping[str, Any]) -> str:
    """The ``topo bench`` mode a plan launches as (its lower bound is the plan's)."""
    launch = plan["launch"]
    if launch.get("construction") in ("legacy", "homogeneous"):
        return launch["construction"]
    if launch.get("max_concurrent_starts"):
        return "capped"
    start = plan["start_methods"]["workers"]
    if start == "forkserver":
        return "forkserver-preload" if launch.get("preload") else "forkserver"
    return {"fork": "fork"}.get(start, "workers")


def memory(layout: Layout, fp: Footprint, node: str) -> Memory:
    """What ``node`` holds of ``layout`` (see the module)."""
    subs = layout.on(node)
    processes = policies = 0
    shared = layout.shared_forkserver
    if not layout.async_mode:
        processes += len(subs) * (2 if layout.forkserver and not shared else 1) + (1 if shared and subs else 0)
        policies += len(subs) if layout.policy == "subcollector" else 0
    elif node == HOST and layout.forkserver:  # async mode: one forkserver, the trainer's
        processes += 1
    if layout.policy == "server" and layout.server_node == node:
        processes, policies = processes + 1, policies + 1
    if node == HOST:  # the trainer, and its copy of the policy
        processes, policies = processes + 1, policies + (1 if layout.policy else 0)
    evals = [n for where, n in layout.eval_workers if where == node]
    if layout.eval_workers and node == HOST:  # the eval process, and its copy
        processes, policies = processes + 1, policies + (1 if layout.policy else 0)
    processes += len(evals) * (2 if layout.forkserver and not shared else 1) + (1 if shared and evals else 0)
    policies += len(evals) if layout.policy == "subcollector" else 0
    return Memory(sum(layout.workers[c] for c in subs) + sum(evals), fp.worker_gb, processes, fp.process_gb, policies,
                  fp.policy_gb)


@dataclass(frozen=True)
class Budget:
    """A node's available memory (None: not known, nothing refused) and cores, and where they come from."""

    available_gb: float | None
    cores: int
    source: str


def check(layout: Layout, fp: Footprint, budgets: Mapping[str, Budget]) -> dict[str, Any]:
    """Per node its memory against its budget; ``refusals``: a sentence per node that does not fit, with the
    arithmetic and what fits; ``warnings``: CPU oversubscription."""
    nodes, refusals, warnings = {}, [], []
    for name in layout.node_names():
        need, budget = memory(layout, fp, name), budgets.get(name)
        subs = layout.on(name)
        entry = {"memory": need, "gb": round(need.gb, 2), "available_gb": budget and budget.available_gb,
                 "cores": budget and budget.cores, "fits": None}
        if budget is not None and budget.available_gb is not None:
            usable = USABLE * budget.available_gb
            evals = sum(n for where, n in layout.eval_workers if where == name)
            per = max(0, need.workers_fitting(usable) - evals) // len(subs) if subs else None
            entry["fits"], entry["usable_gb"] = need.gb <= usable, round(usable, 2)
            entry["fits_per_subcollector"] = per
            if not entry["fits"]:
                what = (f"{name} fits {len(subs)} x {per}" if per else
                        f"not even {len(subs)} x 1 fits on {name}: fewer subcollectors, or a bigger node") if subs else \
                    f"{name} runs no worker"
                refusals.append(f"{_shape(layout, subs, name)} needs {need.terms()} = {need.gb:.1f} GB; "
                                f"{budget.available_gb:.1f} GB available on {name} ({budget.source}), "
                                f"{usable:.1f} GB usable ({USABLE:.0%}); {what}")
        if budget is not None and need.workers > OVERSUBSCRIBED * budget.cores:
            ratio = need.workers / budget.cores
            warnings.append(f"{need.workers} busy workers on {budget.cores} cores of {name} ({ratio:.1f} per core): "
                            f"steps slow down about {ratio:.1f}x against one worker alone; the CPU caps frames/s")
        nodes[name] = entry
    return {"nodes": nodes, "refusals": refusals, "warnings": warnings}


def _shape(layout: Layout, subs: list[int], node: str) -> str:
    counts = [layout.workers[c] for c in subs]
    evals = sum(n for where, n in layout.eval_workers if where == node)
    shape = ("the trainer" if not counts else f"{len(counts)} x {counts[0]}" if len(set(counts)) == 1
             else "+".join(map(str, counts)))
    return shape + (f" with {evals} eval worker(s)" if evals else "")


def ready(layout: Layout, pace: Pace, budgets: Mapping[str, Budget]) -> dict[str, Any]:
    """Expected time to ready on the node where it is longest (``s``), with the bench's lower bound beside it
    (``bound_s``, its ``chain_s`` and ``work_s``). Where the workers import nothing themselves (a preloading
    forkserver's forks, or ``fork``): first the imports no worker can start before (the run's one forkserver's;
    with spawned subcollectors each one's, then its forkserver's; in async mode the trainer's one forkserver's), then
    every worker's construction and first reset spread over the cores; never under the bound. Other modes: the
    bound."""
    out: dict[str, Any] = {}
    parents = {"forkserver-preload": 2, "fork": 1}.get(layout.bench_mode)
    costs, cpu = pace.costs, pace.costs.cpu or pace.costs
    for name in layout.node_names():
        counts = [layout.workers[c] for c in layout.on(name)]
        if not counts:
            continue
        cores = budgets[name].cores
        bound = lower_bound(layout.bench_mode, Shape(sum(counts), len(counts), max(counts)), costs, cores, cap=layout.cap)
        expected = bound["s"]
        if parents:  # async mode, or the run's forkserver: one import before any worker
            one = layout.async_mode or (layout.shared_forkserver and parents == 2)
            chain, groups = (1, 1) if one else (parents, len(counts))
            prefix = max(chain * costs.shared, groups * chain * cpu.shared / cores)
            expected = max(expected, prefix + max(costs.construct + costs.reset,
                                                  sum(counts) * (cpu.construct + cpu.reset) / cores))
        if not out or expected > out["s"]:
            out = {"s": round(expected, 3), "bound_s": bound["s"], "chain_s": bound["chain_s"],
                   "work_s": bound["work_s"], "node": name, "mode": layout.bench_mode}
    return out


def frames(layout: Layout, pace: Pace, budgets: Mapping[str, Budget]) -> dict[str, Any]:
    """Frames/s in sync and async mode, each the sum over nodes of the smaller of its steps' pace and its CPU cap."""
    reset = pace.reset_share[0]
    sync = asyn = cap = 0.0
    bound_by = set()
    for name in layout.node_names():
        counts = [layout.workers[c] for c in layout.on(name)]
        if not counts:
            continue
        n, cores = sum(counts), budgets[name].cores
        sync_cap, async_cap = cores / pace.cpu_per_frame(True), cores / pace.cpu_per_frame(False)
        rounds = n / max(pace.slowest_step(m) + reset + pace.forward + m * pace.plane for m in counts)
        free = n / (pace.step_mean + reset + pace.forward)
        node_cap = async_cap if layout.async_mode else sync_cap
        bound_by.update({"cpu" if node_cap < (free if layout.async_mode else rounds) else "steps"})
        sync, asyn, cap = sync + min(rounds, sync_cap), asyn + min(free, async_cap), cap + node_cap
    mode = "async" if layout.async_mode else "sync"
    chosen = asyn if layout.async_mode else sync
    return {"sync": sync, "async": asyn, "cpu_cap": cap, "cpu_s_per_frame": pace.cpu_per_frame(not layout.async_mode),
            "bound_by": "cpu" if bound_by == {"cpu"} else "steps", "mode": mode,
            "iteration_s": layout.frames_per_batch / chosen if chosen else None}


def target(wanted: float, layout: Layout, fp: Footprint, pace: Pace, budgets: Mapping[str, Budget]) -> dict[str, Any]:
    """The fewest workers per subcollector (the same subcollectors) whose frames/s, in the plan's mode, reach
    ``wanted`` and whose memory fits every node; or why none does."""
    best, best_fps = None, 0.0
    for m in range(1, MOST_WORKERS + 1):
        shaped = layout.reshaped(m)
        if check(shaped, fp, budgets)["refusals"]:
            break
        got = frames(shaped, pace, budgets)
        fps = got[got["mode"]]
        if fps >= wanted:
            return {"frames_per_s": wanted, "shape": shaped.shape, "predicted": fps}
        best, best_fps = shaped, fps
        if got["bound_by"] == "cpu" and fps >= got["cpu_cap"] * 0.999:
            break  # more workers add nothing past the CPU cap
    if best is None:
        why = f"not even {layout.reshaped(1).shape} fits in memory"
    elif best_fps >= frames(best, pace, budgets)["cpu_cap"] * 0.999:
        cores = sum(budgets[n].cores for n in set(best.nodes))
        per_frame = pace.cpu_per_frame(not layout.async_mode)
        why = (f"CPU-bound: at most {best_fps:.0f} frames/s on {cores} cores ({per_frame * 1e3:.1f} CPU-ms "
               f"per frame), reached at {best.shape}")
    elif best.workers[0] == MOST_WORKERS:
        why = f"{best.shape} gives {best_fps:.0f} frames/s"
    else:
        why = f"memory: the largest that fits, {best.shape}, gives {best_fps:.0f} frames/s"
    return {"frames_per_s": wanted, "shape": None, "why": why}


def gpu_notes(layout: Layout, fp: Footprint, renders: bool) -> list[str]:
    """Documented figures where the plan names a GPU; none of them measured here."""
    notes = []
    if (layout.policy_device or "").startswith("cuda"):
        low, high = CUDA_CONTEXT_GB
        notes.append(f"policy on {layout.policy_device}: {fp.policy_gb:.2f} GB of parameters per copy + one CUDA "
                     f"context per process that holds it (~{low}-{high} GB, a documented figure; not measured here)")
    for gpu, count in layout.render_gpus if renders else ():
        notes.append(f"render GPU {gpu}: {count} EGL contexts (one per worker rendering there), ~{EGL_TEXTURES_GB} GB "
                     "of textures each for a LIBERO worker (docs/guides/libero.md); not measured here")
    return notes


def eval_duration(section: Mapping[str, Any], pace: Pace, cores: int, horizon_key: str | None) -> dict[str, Any]:
    """An evaluation's wall time at most, here: every planned episode run to its horizon (one that succeeds ends
    sooner). Each eval worker runs its episodes in turn (steps, a forward each, a reset each); all of them share
    ``cores``: the longest worker's time, or all their CPU time over the cores, whichever is longer."""
    rows = [row for sub in section["subcollectors"] for row in sub["workers"]]
    walls, cpu, steps = [], 0.0, 0
    for row in rows:
        schedule = row["kwargs"]["schedule"]
        wall = 0.0
        for episode in row["episodes"]:
            env = schedule["envs"].get(env_key(episode["task_id"]), {})
            n = (env.get(horizon_key) if horizon_key else None) or schedule.get("max_episode_steps") or 0
            steps += n
            wall += n * (pace.step_mean + pace.forward) + pace.reset
            cpu += n * (pace.step_cpu + pace.forward_cpu) + pace.reset_cpu
        walls.append(wall)
    longest = max(walls, default=0.0)
    return {"seconds": max(longest, cpu / max(cores, 1)), "episodes": sum(len(r["episodes"]) for r in rows),
            "steps": steps, "workers": len(rows), "cores": cores,
            "bound_by": "cpu" if cpu / max(cores, 1) > longest else "the longest worker"}
