"""A chaos soak: a training run under faults injected at random for a long time. Is every fault found, named
and recovered, does every batch arrive, is every lost frame accounted for, does nothing grow, is nothing left?

    python benchmarks/chaos_soak.py                                      # toy 4 x 16 (64 workers), 30 min
    python benchmarks/chaos_soak.py --env libero --topology 2x4          # real LIBERO 2 x 4, 30 min
    python benchmarks/chaos_soak.py --topology 2x2 --minutes 1.5 --mean-gap 6 --out /tmp/soak.json  # short
    python benchmarks/chaos_soak.py --mode async --topology 8x1 --minutes 10 --mean-gap 10   # async mode

The training run (this file with ``--trainer``, in its own process, its stderr kept) is a GRPO-shaped loop on
real torchrl processes: TinyVLA in each subcollector, sync batches, one optimizer step and ``update_weights`` a
batch, ``launch.restarts``, ``launch.hang_timeout``, ``launch.recycle.max_rss_gb`` and
``launch.retain_episodes`` set as a run of days would set them. A seeded injector thread waits a random time
(exponential, ``--mean-gap`` seconds), picks a fault and a subcollector that is collecting and has no fault
pending (so several subcollectors can be recovering at once), and injects one of:

- ``kill-worker``: SIGKILL an env worker;
- ``hang-worker``: SIGSTOP an env worker (its step never returns: a hang, found by ``hang_timeout``);
- ``leak-worker``: SIGUSR2 to an env worker, which then holds 32 MB more every half second
  (``benchmarks/soak_hooks/sitecustomize.py``, on the run's PYTHONPATH: the env and the spec are not touched);
- ``kill-subcollector``: SIGKILL a subcollector process;
- ``stop-continue``: SIGSTOP an env worker, then SIGCONT it after a uniform ``--continue-after`` (1-20 s) if that
  process still lives. Named and recovered means: stopped longer than ``hang_timeout`` + ``LATE_S`` (5 s: the
  keeper reads the heartbeats every second, and a sync subcollector may idle between batches before the step
  that starts the hang clock), it is named ``worker-hung`` (its pid) by the next restart of its subcollector,
  which recovers; stopped shorter than ``hang_timeout`` - ``EARLY_S`` (2 s: the clock runs from its last step's
  end, a moment before the SIGSTOP), it is named by nothing and ends an env step after its SIGCONT (its
  heartbeat slot, within a minute); in between, either. One its subcollector's restart for another fault kills
  while stopped ends with it (a restart is of the whole subcollector). A restart is matched to the fault whose
  process its cause names (the latest, where one process was faulted twice), else to the first fault of its
  subcollector before it. Not in the default mix.

``--preset fault-fuzz`` is issue 46's fault fuzz: toy 2 x 4 in async mode for 10 minutes, a random env worker
every ~2 s (``--mean-gap 2``; a subcollector with a fault not yet recovered from gets none, so the rate is what
recovery allows) SIGKILLed, SIGSTOPped (left stopped) or stop-continued, ``launch.restarts``, ``hang_timeout: 15``,
``stall_timeout: 90``, ``on_stall: fail``; results ``benchmarks/results/fault_fuzz_toy_async.json``:

    python benchmarks/chaos_soak.py --preset fault-fuzz                     # 10 minutes
    python benchmarks/chaos_soak.py --preset fault-fuzz --mode multi --minutes 2 --out /tmp/multi.json

``--mode async`` runs the same loop on ``collector.mode: async`` (one AsyncBatchedCollector, the policy on its
inference server, weights pushed to it): every fault but ``kill-subcollector`` (async mode has no subcollector
process), its flatness is the trainer's and the server's, and a worker life may have lost what the result permits
let it hold (2 x N chunks: async workers step on between batches).

Injection stops ``--settle`` seconds before the end; the run outlasts the end (by up to twice the settle) while
a fault is still being recovered from, as it may be on a loaded machine. ``--min-faults N`` goes on injecting past
that point until N faults were injected, the last one settling as well: with ``--cycle``, every kind gets its turn
however slowly the machine recovers (the suite's short version). Every
``--sample-s`` seconds the trainer records the RSS and open fds of itself and of each subcollector, the env
workers' RSS, the run directory's size, and ``/dev/shm``. At the end the trainer reads each worker life's step
count from its heartbeat file and the frames each life delivered (from the batches' episode ids), and the
driver (this process) looks for what the run left: processes whose environment names its run directory,
``/dev/shm`` segments and semaphores its processes registered (topo's ledger, ``RUN_DIR/resources``) or torch
made in them (``torch_PID_…``): other programs on the host are told apart; and tracebacks or "leaked" warnings
on the trainer's stderr.

Checks (``checks`` in the JSON, exit 1 when one fails): each fault found by a restart or recycle of its
subcollector that names it (the worker and pid; the subcollector for a subcollector kill), each recovered
(collecting again); no restart or recycle without a fault; every batch full; the frames a worker life stepped
and no batch holds are at most the rollout it was collecting when its life ended (named by that restart or
recycle), and none for a life that runs at the end (sync: a subcollector idles between batches); RSS and fds of
the trainer and subcollectors flat within 10 % after warm-up (medians of the first and last fifth of the samples
after ``--warmup`` of the run); nothing alive after teardown, nothing of the run's left in ``/dev/shm``; no traceback or
"leaked" warning on stderr; the longest gap between two batches (and the one still open
when the loop ended; ready to the first batch is reported apart, ``gaps.first_batch_s``) at most ``hang_timeout`` + ``--gap-slack`` (where given; the fault fuzz 15 s); the stall watchdog silent (no
``events/stall`` record, no ``stalled`` failure); the run ended by itself. The soak itself always ends: no batch
for ``--jam-s`` (``stall_timeout`` + 30 s) and the trainer SIGTERMs itself (topo raises it in the training loop
and tears down), reporting the figures so far; a trainer still running past a deadline (its minutes, settle, jam
watch and 5 minutes) is ended from the driver, what its run left killed and counted, and the result fails. The
JSON's ``counts``: batches, restarts, recycles, the longest gap, faults per kind injected, named and recovered,
the stop-continues' outcomes. Results: ``benchmarks/results/chaos_soak_<env>.json`` and, with matplotlib,
``chaos_soak_<env>.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HOOKS = os.path.join(HERE, "soak_hooks")
KINDS = ("kill-worker", "hang-worker", "leak-worker", "kill-subcollector", "stop-continue")
SOAK_KINDS = KINDS[:4]  # the mix without --kinds
# a stop-continue stopped this much less than hang_timeout must not be named a hang (the hang clock runs from the
# worker's last step end, a moment before the SIGSTOP); this much more must be (the keeper reads the heartbeats
# every second, and a sync subcollector may idle between batches before its next step starts the clock)
EARLY_S, LATE_S = 2.0, 5.0
PRESETS = {  # issue 46's fault fuzz: toy 2 x 4 in async mode, a random env worker every ~2 s, for 10 minutes
    "fault-fuzz": {"env": "toy", "topology": "2x4", "mode": "async", "minutes": 10.0, "mean_gap": 2.0,
                   "kinds": "kill-worker,hang-worker,stop-continue", "hang_timeout": 15.0, "stall_timeout": 90.0,
                   "continue_after": "1,20", "settle": 45.0, "gap_slack": 15.0}}
POLICY = {"toy": {"action_dim": 4, "image_size": 16, "state_dim": 8},
          "libero": {"action_dim": 7, "image_size": 64, "state_dim": 9}}
# per env: rollout steps per worker a batch, hang timeout (s), a worker's RSS budget (GB), leak per half second (MB),
# no batch for this long while one is owed fails the run (a stall is a finding, never a soak that waits forever)
SHAPE = {"toy": {"steps": 8, "hang_timeout": 15, "max_rss_gb": 0.6, "leak_mb": 32, "stall_timeout": 180},
         "libero": {"steps": 8, "hang_timeout": 60, "max_rss_gb": 2.6, "leak_mb": 64, "stall_timeout": 900}}


def spec(env: str, subcollectors: int, workers: int, hang_timeout: float | None = None, mode: str = "multi",
         stall_timeout: float | None = None) -> dict:
    n, shape = subcollectors * workers, SHAPE[env]
    if env == "toy":
        env_section = {"backend": "toy", "kwargs": {"success_steps": 6, "state_dim": 8}}
        assignment = {"tasks": "0-3", "instructions": {0: "push left", 1: "push right", 2: "lift", 3: "place"},
                      "groups": {"size": 2}, "seeds": {"base": 0}}
    else:
        env_section = {"backend": "libero", "kwargs": {
            "task_suite": "libero_spatial", "camera_height": 64, "camera_width": 64, "max_episode_steps": 64,
            "env_kwargs": {"hard_reset": False, "camera_names": ["agentview"]}}}
        assignment = {"tasks": f"0-{min(n, 10) - 1}", "init_states": {"mode": "cycle"}, "seeds": {"base": 0}}
    out = {"version": 1, "name": f"chaos-soak-{env}-{subcollectors}x{workers}", "env": env_section,
           "topology": {"subcollectors": subcollectors, "workers_per_subcollector": workers},
           "assignment": assignment,
           "policy": {"factory": "topo.policies.tinyvla:make", "kwargs": POLICY[env], "placement": "subcollector"},
           "collector": {"frames_per_batch": n * shape["steps"]},
           "launch": {"startup_timeout": 900, "restarts": {"max": 10000}, "hang_timeout": hang_timeout or shape["hang_timeout"],
                      "recycle": {"max_rss_gb": shape["max_rss_gb"], "check_every": 1},
                      "retain_episodes": 50, "stall_timeout": stall_timeout or shape["stall_timeout"],
                      "on_stall": "fail"}}
    if mode == "async":  # one server, no copies
        out["policy"].pop("placement")
        out["collector"]["mode"] = "async"
    return out


# -- the trainer (its own process) --------------------------------------------------------------------------------
class Injector(threading.Thread):
    """Injects faults into a running ``run`` at random times until ``stop_at`` (monotonic) and ``min_faults`` faults,
    whichever comes later (a loaded machine recovers slower: fewer faults fit its minutes)."""

    def __init__(self, run, rng: random.Random, mean_gap: float, stop_at: float, kinds: tuple[str, ...], cycle: bool,
                 continue_after: tuple[float, float] = (1.0, 20.0), min_faults: int = 0):
        super().__init__(name="soak-injector", daemon=True)
        self.soaked, self.rng, self.mean_gap, self.stop_at, self.kinds = run, rng, mean_gap, stop_at, kinds
        self.min_faults = min_faults
        self.last_at = 0.0  # monotonic time of the last fault
        self.cycle = cycle  # the kinds in turn, not at random
        self.continue_after = continue_after  # a stop-continue's SIGCONT, uniform in this range (s)
        self.faults: list[dict] = []
        self.halt = threading.Event()

    def events(self, c: int) -> list[dict]:
        """Restarts and recycles of subcollector ``c`` so far, in order."""
        return sorted([e for e in self.soaked.restarts + self.soaked.recycles if e["subcollector"] == c],
                      key=lambda e: e["decided_s"])

    def _open(self, f: dict, seen: list[dict]) -> bool:
        """Whether fault ``f`` is not yet over: no restart or recycle after it (a stop-continue's worker that
        stepped again after its SIGCONT needs none), or the one after it is not collecting yet."""
        if len(seen) <= f["events_before"]:
            return not f.get("stepped_again_s")
        return seen[f["events_before"]]["outcome"] != "collecting"

    def free(self) -> list[int]:
        """Subcollectors collecting, with no fault pending: the faults before on them each found and recovered."""
        out = []
        for c in self.soaked.state.subcollectors:
            seen = self.events(c)
            pending = [f for f in self.faults if f["subcollector"] == c and self._open(f, seen)]
            pids = [w.pid for (s, _), w in self.soaked.state.workers.items() if s == c]
            if not pending and (not seen or seen[-1]["outcome"] == "collecting") and all(pids):
                out.append(c)  # every worker's pid known (async mode's may be delivering before one is recorded)
        return out

    def pending(self) -> bool:
        """Whether a fault has not yet been recovered from: the restart or recycle after it is not collecting."""
        return any(self._open(f, self.events(f["subcollector"])) for f in self.faults)

    def over(self) -> bool:
        """Whether injection has ended: past ``stop_at`` with at least ``min_faults`` injected."""
        return time.monotonic() >= self.stop_at and len(self.faults) >= self.min_faults

    def run(self) -> None:
        while not self.halt.wait(self.rng.expovariate(1 / self.mean_gap)):
            if self.over():
                return
            free = self.free()
            while not free and not self.halt.wait(0.5):
                free = self.free()
            if not free or self.over():
                return
            kind = self.kinds[len(self.faults) % len(self.kinds)] if self.cycle else self.rng.choice(self.kinds)
            self.inject(kind, self.rng.choice(free))

    def inject(self, kind: str, c: int) -> None:
        state = self.soaked.state
        w = self.rng.randrange(len([1 for (s, _) in state.workers if s == c]))
        worker = state.workers[(c, w)]
        pid = state.subcollectors[c].pid if kind == "kill-subcollector" else worker.pid
        fault = {"kind": kind, "subcollector": c, "worker": None if kind == "kill-subcollector" else w,
                 "global_index": None if kind == "kill-subcollector" else worker.row["global_index"], "pid": pid,
                 "life": state.subcollectors[c].restart, "events_before": len(self.events(c))}
        sig = {"kill-worker": signal.SIGKILL, "hang-worker": signal.SIGSTOP, "leak-worker": signal.SIGUSR2,
               "kill-subcollector": signal.SIGKILL, "stop-continue": signal.SIGSTOP}[kind]
        if kind == "stop-continue":
            fault["stop_s"] = round(self.rng.uniform(*self.continue_after), 3)
            fault["pid_created"] = _born(pid)
        fault["injected_s"] = round(state.elapsed(time.time()), 3)
        os.kill(pid, sig)
        self.last_at = time.monotonic()
        self.faults.append(fault)
        if kind == "stop-continue":
            threading.Thread(target=self.resume, args=(fault,), name="soak-continue", daemon=True).start()
        print(f"soak: {fault['injected_s']:.1f}s {kind} sub{c}" + (f"/w{w}" if fault["worker"] is not None else "")
              + f" pid {pid}" + (f" (SIGCONT after {fault['stop_s']:.1f}s)" if kind == "stop-continue" else ""),
              file=sys.stderr, flush=True)

    def resume(self, fault: dict) -> None:
        """A stop-continue's second half: SIGCONT its worker ``stop_s`` seconds after its SIGSTOP, if that process
        still lives (a restart that named it as hung may have ended it: ``gone``), then watch its heartbeat slot for
        the end of a step after the SIGCONT (``stepped_again_s``, seconds after the SIGCONT), for up to a minute."""
        state = self.soaked.state
        stopped_at = state.t0 + fault["injected_s"]
        time.sleep(max(0.0, stopped_at + fault["stop_s"] - time.time()))
        if _born(fault["pid"]) != fault["pid_created"]:
            fault["gone"] = True  # killed (and reaped) while stopped
            return
        os.kill(fault["pid"], signal.SIGCONT)
        continued = time.time()
        fault["continued_s"] = round(state.elapsed(continued), 3)
        c, w, life = fault["subcollector"], fault["worker"], fault["life"]
        from topo.runtime import heartbeat

        while time.time() < continued + 60 and not self.halt.is_set():
            if state.subcollectors[c].restart != life:  # a restart replaced it before it stepped
                fault["gone"] = True
                return
            slots = heartbeat.read(self.soaked.run_dir, c, life)
            if slots and slots[w + 1][1] > continued:
                fault["stepped_again_s"] = round(slots[w + 1][1] - continued, 3)
                return
            time.sleep(0.2)


def _born(pid: int) -> float | None:
    """When process ``pid`` started (None: there is none): tells a pid reused by another process apart."""
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - gone, or a zombie
        return None


def _proc(pid: int | None) -> dict:
    """RSS (MB) and open fds of a process, None each when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
        return {"rss_mb": round(rss, 1), "fds": len(os.listdir(f"/proc/{pid}/fd"))}
    except (OSError, StopIteration, TypeError):
        return {"rss_mb": None, "fds": None}


def _du(path: str) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


class Sampler(threading.Thread):
    """Every ``every`` seconds, :func:`sample` of the run (``progress()``: batches and frames delivered so far)."""

    def __init__(self, run, every: float, progress):
        super().__init__(name="soak-sampler", daemon=True)
        self.soaked, self.every, self.progress = run, every, progress
        self.samples: list[dict] = []
        self.registered: set[str] = set()  # /dev/shm names the run's processes registered, as topo's ledger has them
        self.halt = threading.Event()

    def run(self) -> None:
        while True:
            self.samples.append(sample(self.soaked, *self.progress()))
            self.registered |= registered(self.soaked.run_dir)
            if self.halt.wait(self.every):
                return


def sample(run, batches: int, frames: int) -> dict:
    state = run.state
    memory = run.worker_memory()
    server = state.server()
    return {"t_s": round(state.elapsed(time.time()), 1), "batches": batches, "frames": frames,
            "trainer": _proc(os.getpid()), "server": _proc(server.pid if server else None),
            "subcollectors": {str(c): {**_proc(s.pid), "life": s.restart} for c, s in sorted(state.subcollectors.items())},
            "workers_rss_mb": round(sum(m["rss_mb"] or 0 for m in memory), 1),
            "workers_max_rss_mb": max((m["rss_mb"] or 0 for m in memory), default=None),
            "run_dir_bytes": _du(run.run_dir), "dev_shm": len(os.listdir("/dev/shm"))}


def registered(run_dir: str) -> set[str]:
    """The ``/dev/shm`` names (``sem.mp-…``, ``psm_…``) that the run's subcollectors and env workers registered with
    the resource tracker, from topo's ledger (:mod:`topo.runtime.tracked`): what the run may leave, told apart from
    what other programs on the host hold."""
    from topo.runtime import tracked

    folder = os.path.join(run_dir, tracked.FOLDER)
    return {("sem." if rtype == "semaphore" else "") + name.lstrip("/")
            for file in (os.listdir(folder) if os.path.isdir(folder) else [])
            for sign, rtype, _, name in tracked.entries(os.path.join(folder, file)) if sign == "+"}


class JamWatch(threading.Thread):
    """Ends a run that delivers no batch for ``jam_s`` seconds: SIGTERM to this process, as one would from outside
    (topo raises it in the training loop and tears the run down), so that a jammed run ends and says so instead of
    holding the soak forever. ``last()``: the monotonic time of the latest batch (or of ready)."""

    def __init__(self, jam_s: float, last):
        super().__init__(name="soak-jam-watch", daemon=True)
        self.jam_s, self.last = jam_s, last
        self.fired: dict | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(1.0):
            quiet = time.monotonic() - self.last()
            if quiet > self.jam_s:
                self.fired = {"no_batch_for_s": round(quiet, 1), "jam_s": self.jam_s}
                print(f"soak: no batch for {quiet:.0f}s (--jam-s {self.jam_s:g}): the run is jammed, SIGTERM",
                      file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
                return


def _bounded(call, timeout: float, default=None):
    """``call()``, or ``default`` when it has not returned in ``timeout`` seconds (a jammed run may hold a lock
    that reading its state needs)."""
    box = []
    thread = threading.Thread(target=lambda: box.append(call()), daemon=True)
    thread.start()
    thread.join(timeout)
    return box[0] if box else default


def trainer(args) -> None:
    import torch
    import yaml

    import topo
    from topo.runtime import events, heartbeat
    from topo.runtime.rundir import RunDir

    subs, workers = (int(x) for x in args.topology.split("x"))
    data = spec(args.env, subs, workers, args.hang_timeout, args.mode, args.stall_timeout)
    folder = args.folder
    path = os.path.join(folder, "soak.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    plan = topo.load(path)
    policy = plan.make_policy()
    optim = torch.optim.SGD(policy.parameters(), lr=1e-4)
    rng = random.Random(args.seed)
    kinds = tuple(args.kinds.split(","))
    low, high = (float(x) for x in args.continue_after.split(","))
    delivered: dict[tuple[int, int], int] = {}  # (global row, life) -> frames the batches held
    full, batches, frames = 0, 0, 0
    gaps = {"longest_s": 0.0, "longest_at_s": None, "last": None, "first_s": None}  # between batches; first_s: ready to the first
    ended, closed, stalls, injector, jam = None, None, [], None, None
    started = time.monotonic()
    try:
        with topo.collector(plan, policy=policy, report_dir=os.path.join(folder, "report"), progress=False) as run:
            ready_s = round(time.monotonic() - started, 1)
            ready = gaps["last"] = time.monotonic()
            with open(os.path.join(folder, "run_dir.txt"), "w") as f:
                f.write(run.run_dir)
            end = ready + args.minutes * 60
            injector = Injector(run, rng, args.mean_gap, end - args.settle, kinds, args.cycle, (low, high), args.min_faults)
            sampler = Sampler(run, args.sample_s, lambda: (batches, frames))
            jam = JamWatch(args.jam_s, lambda: gaps["last"])
            injector.start()
            sampler.start()
            jam.start()
            try:
                for batch in run.collector:
                    now = time.monotonic()
                    if gaps["first_s"] is None:
                        gaps["first_s"] = round(now - ready, 3)
                    elif now - gaps["last"] > gaps["longest_s"]:
                        gaps.update(longest_s=round(now - gaps["last"], 3), longest_at_s=round(gaps["last"] - ready, 1))
                    gaps["last"] = now
                    batches += 1
                    frames += batch.numel()
                    full += batch.numel() == plan.data["collector"]["frames_per_batch"]
                    lives, counts = torch.unique(batch["topo_episode"].reshape(-1) >> 28, return_counts=True)
                    for key, n in zip(lives.tolist(), counts.tolist()):
                        row_life = (key >> 14, key & ((1 << 14) - 1))
                        delivered[row_life] = delivered.get(row_life, 0) + n
                    loss = -policy.log_prob(batch.reshape(-1)).mean()
                    optim.zero_grad()
                    loss.backward()
                    optim.step()
                    run.update_weights()
                    now, finish = time.monotonic(), max(end, injector.last_at + args.settle)  # a late fault settles too
                    if injector.over() and now >= finish and (not injector.pending() or now >= finish + 2 * args.settle):
                        break  # a fault injected before the settle still recovers before the end, on a loaded machine too
            except BaseException as exc:  # noqa: BLE001 - the jam watch's SIGTERM, the stall watchdog's failure
                ended = exc
                now = time.monotonic()
                if now - gaps["last"] > gaps["longest_s"]:  # the gap still open when the loop ended counts
                    gaps.update(longest_s=round(now - gaps["last"], 3), longest_at_s=round(gaps["last"] - ready, 1))
            jam.halt.set()
            injector.halt.set()
            sampler.halt.set()
            injector.join(10)
            sampler.join(10)
            samples = sampler.samples + [_bounded(lambda: sample(run, batches, frames), 10)]
            samples = [x for x in samples if x is not None]
            stalls = [r for r in RunDir(run.run_dir).read_all(events.FOLDER) if r.get("name") == "stall"]
            shm_names = sorted(sampler.registered | registered(run.run_dir))
            pids = sorted(run.state.known_pids())  # every life's processes: torch names its files after them
            # in sync mode a subcollector idles between batches: what each life stepped is now final
            stepped, current = {}, {}
            for sub in plan.data["subcollectors"]:
                c = sub["index"]
                for life in range(run.state.subcollectors[c].restart + 1):
                    for w, h in enumerate(heartbeat.health(run.run_dir, c, life) or []):
                        stepped[(sub["workers"][w]["global_index"], life)] = h.steps if h else 0
                current.update({row["global_index"]: run.state.subcollectors[c].restart for row in sub["workers"]})
            if ended is not None:
                raise ended  # the run tears down knowing what ended it
    except BaseException as exc:  # noqa: BLE001 - reported, with the figures so far
        if injector is None:
            raise  # it never collected: the trainer fails, the driver says so
        closed = exc
    report = run.report.data
    lives = sorted(set(stepped) | set(delivered))
    out = {"env": args.env, "mode": args.mode, "topology": f"{subs} x {workers}", "spec": data, "seed": args.seed,
           "minutes": args.minutes, "mean_gap_s": args.mean_gap, "ready_s": ready_s,
           "kinds": list(kinds), "continue_after_s": [low, high],
           "batches": {"delivered": batches, "full": full, "frames_per_batch": plan.data["collector"]["frames_per_batch"]},
           "gaps": {"longest_s": gaps["longest_s"], "longest_began_s": gaps["longest_at_s"], "first_batch_s": gaps["first_s"]},
           "ended": None if ended is None else {"by": type(ended).__name__, "message": str(ended)[:2000],
                                                "jam_watch": jam.fired if jam is not None else None},
           "closed": None if closed is None else f"{type(closed).__name__}: {str(closed)[:2000]}",
           "stalls": stalls, "failure": report.get("failure"),
           "frames_delivered": frames, "faults": injector.faults, "shm_registered": shm_names, "pids": pids,
           "restarts": report["restarts"], "recycles": report["recycles"],
           "lives": [{"global_index": r, "life": life, "stepped": stepped.get((r, life)),
                      "delivered": delivered.get((r, life), 0), "ended": life < current[r]} for r, life in lives],
           "samples": samples, "run_dir": report["run_dir"], "exit_code": report["exit_code"],
           "processes": {k: report["processes"][k] for k in ("left_behind", "alive_after", "killed", "peak")},
           "constructions": report["constructions"]["by_role"], "episodes": report["episodes"],
           "seeds": {"checked": report["seeds"]["checked"], "mismatches": len(report["seeds"]["mismatches"])}}
    with open(os.path.join(folder, "trainer.json"), "w") as f:
        json.dump(out, f)


# -- the driver -----------------------------------------------------------------------------------------------------
def account(t: dict) -> dict:
    """Each fault against the restart or recycle that found it; the frames each worker life lost."""
    rows_per_sub = t["spec"]["topology"]["workers_per_subcollector"]
    steps = SHAPE[t["env"]]["steps"]
    used: set[tuple[str, int]] = set()
    events = [("restart", i, e) for i, e in enumerate(t["restarts"])] + [("recycle", i, e) for i, e in enumerate(t["recycles"])]
    events.sort(key=lambda x: x[2]["decided_s"])
    faults = []
    hang = t["spec"]["launch"]["hang_timeout"]
    # an event whose cause names a fault's process is that fault's, whatever came before it; the others go to the
    # first event of their subcollector after them
    by_pid = {}  # a process faulted twice (stopped, continued, stopped again): the event is the latest fault's
    for what, i, e in events:
        pid = (e.get("cause") or {}).get("pid")
        faulted = [f for f in t["faults"] if pid is not None and f.get("pid") == pid and id(f) not in by_pid
                   and f["injected_s"] - 0.05 <= e["decided_s"]]
        if faulted:
            by_pid[id(max(faulted, key=lambda f: f["injected_s"]))] = (what, i, e)
            used.add((what, i))
    for f in t["faults"]:
        found = by_pid.get(id(f))
        if found is None and f["kind"] != "stop-continue":  # a stop-continue is named by its pid, or by nothing
            found = next(((what, i, e) for what, i, e in events if (what, i) not in used
                          and e["subcollector"] == f["subcollector"] and e["decided_s"] >= f["injected_s"] - 0.05), None)
        entry = {**f, "found_by": None, "named": False, "recovered": False}
        if f["kind"] == "stop-continue":
            entry["expected"] = ("step" if f["stop_s"] < hang - EARLY_S else
                                 "worker-hung" if f["stop_s"] > hang + LATE_S else "either")
        if found is not None:
            what, i, e = found
            used.add((what, i))
            entry.update(found_by=f"{what} {e['restart']} of sub{e['subcollector']}", found_s=round(e["decided_s"] - f["injected_s"], 2),
                         # collecting: its first batch came (a later restart may mark one superseded that had
                         # delivered before its ready was recorded, as async mode's may on a loaded machine)
                         recovered=e["outcome"] == "collecting" or e.get("first_batch_s") is not None,
                         event_outcome=e["outcome"], recover_s=e.get("recover_s") or e.get("rebuild_s"))
            if what == "restart":
                cause = e["cause"]
                entry["cause"] = {k: cause.get(k) for k in ("kind", "subcollector", "worker", "pid", "how")}
                if f["kind"] == "kill-subcollector":
                    entry["named"] = cause["kind"] == "subcollector-died" and cause.get("pid") == f["pid"]
                elif f["kind"] in ("kill-worker", "hang-worker", "stop-continue"):
                    kind = "worker-died" if f["kind"] == "kill-worker" else "worker-hung"
                    entry["named"] = cause["kind"] == kind and (cause.get("worker"), cause.get("pid")) == (f["worker"], f["pid"])
            else:
                entry["reason"] = e["reason"]
                entry["named"] = f["kind"] == "leak-worker" and e["breach"].get("worker") == f["worker"]
        if f["kind"] == "stop-continue":
            entry["outcome"] = ("worker-hung" if entry["named"] else "stepped" if f.get("stepped_again_s") is not None
                                else "wrongly named" if found is not None
                                else "ended with its subcollector" if f.get("gone")
                                else "neither named nor stepped")
            # named and recovered: named worker-hung (and recovered) where it stayed stopped past hang_timeout
            # (+ LATE_S); stepped again after its SIGCONT, unnamed, where it was continued EARLY_S before; either
            # in between
            entry["named"] = entry["outcome"] in {"step": ("stepped", "ended with its subcollector"),
                                                  "worker-hung": ("worker-hung", "ended with its subcollector"),
                                                  "either": ("stepped", "worker-hung", "ended with its subcollector")
                                                  }[entry["expected"]]
            if entry["outcome"] == "stepped":
                entry.update(found_by="its own step after the SIGCONT", recovered=True)
            elif entry["outcome"] == "ended with its subcollector":  # another fault's restart killed it, stopped
                entry.update(found_by="its subcollector's restart for another fault", recovered=True)
        faults.append(entry)
    unmatched = [{"what": what, "subcollector": e["subcollector"], "decided_s": e["decided_s"],
                  "cause": e.get("cause", {}).get("kind") or e.get("reason")} for what, i, e in events if (what, i) not in used]
    lost = [dict(life, lost=(life["stepped"] or 0) - life["delivered"]) for life in t["lives"]]
    # sync: an ended life lost at most the rollout it was collecting (its end is a restart or recycle, named); a
    # current one nothing (a subcollector idles between batches). Async: what the result permits let a worker hold
    # (2 x N chunks and the one it builds), ended or not (its workers step on between batches)
    n = t["spec"]["topology"]["subcollectors"] * rows_per_sub
    chunk = max(1, min(64, t["spec"]["collector"]["frames_per_batch"] // n))
    bound = (lambda life: (2 * n + 1) * chunk) if t.get("mode") == "async" else \
        (lambda life: steps if life["ended"] else 0)
    over = [life for life in lost if not 0 <= life["lost"] <= bound(life)]
    return {"faults": faults, "unmatched_events": unmatched, "lives": lost, "lost_frames": sum(x["lost"] for x in lost),
            "lives_over_one_rollout": over, "rollout_steps": steps, "workers_per_subcollector": rows_per_sub}


def flat(samples: list[dict], warmup: float, key) -> dict:
    """Medians of the first and last fifth of the samples after ``warmup`` of the run, and their ratio."""
    after = [s for s in samples[int(len(samples) * warmup):] if key(s) is not None]
    if len(after) < 5:
        return {"first": None, "last": None, "ratio": None, "flat": None}
    k = max(1, len(after) // 5)
    first, last = statistics.median(key(s) for s in after[:k]), statistics.median(key(s) for s in after[-k:])
    ratio = round(last / first, 3) if first else None
    return {"first": first, "last": last, "ratio": ratio, "flat": ratio is not None and ratio <= 1.10}


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def leftovers(t: dict, before: set[str], patience: float = 15.0) -> dict:
    """What the run left once its trainer has exited: processes whose environment names the run, and ``/dev/shm``
    names its processes registered or torch made in them (others new since ``before`` belong to other programs,
    reported apart). Looks again until nothing is left or ``patience`` seconds pass: a process may still be exiting."""
    torch_files = tuple(f"torch_{pid}_" for pid in t["pids"])
    deadline = time.monotonic() + patience
    while True:
        new = _shm() - before
        ours = set(t["shm_registered"]) | {name for name in new if name.startswith(torch_files)}
        left = {"by_environment": _by_environment(t["run_dir"]), "dev_shm": sorted(new & ours),
                "dev_shm_of_other_programs": len(new - ours)}
        if not (left["by_environment"] or left["dev_shm"]) or time.monotonic() >= deadline:
            left["semaphores"] = [n for n in left["dev_shm"] if n.startswith("sem.")]
            return left
        time.sleep(0.5)


def _by_environment(run_dir: str) -> list[dict]:
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            if p.environ().get("TOPO_RUN_DIR") == run_dir:
                out.append({"pid": p.pid, "cmdline": " ".join(p.info["cmdline"] or [])[:200]})
        except (psutil.Error, OSError):
            continue
    return out


def plot(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    samples = result["samples"]
    t = [s["t_s"] / 60 for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    axes[0].plot(t, [s["trainer"]["rss_mb"] for s in samples], label="trainer")
    for c in samples[0]["subcollectors"]:
        axes[0].plot(t, [s["subcollectors"][c]["rss_mb"] for s in samples], label=f"subcollector {c}")
    axes[0].set_ylabel("RSS (MB)")
    axes[1].plot(t, [s["trainer"]["fds"] for s in samples], label="trainer")
    for c in samples[0]["subcollectors"]:
        axes[1].plot(t, [s["subcollectors"][c]["fds"] for s in samples], label=f"subcollector {c}")
    axes[1].set_ylabel("open fds")
    axes[2].plot(t, [s["workers_rss_mb"] / 1024 for s in samples], label="env workers, all (GB)")
    axes[2].plot(t, [s["run_dir_bytes"] / 2**20 / 1024 for s in samples], label="run directory (GB)")
    axes[2].set_ylabel("GB")
    axes[2].set_xlabel("minutes since ready")
    for f in result["faults"]:
        for ax in axes:
            ax.axvline(f["injected_s"] / 60, color="red" if "kill" in f["kind"] else "orange", alpha=0.25, lw=0.8)
    for ax in axes:
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_title(f"chaos soak, {result['env']} {result['topology']}: {len(result['faults'])} faults (red: kills, "
                      "orange: hangs and leaks)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=("toy", "libero"), default="toy")
    parser.add_argument("--topology", default=None, help="SUBSxWORKERS (toy 4x16, libero 2x4)")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--mean-gap", type=float, default=45.0, help="seconds between faults, on average")
    parser.add_argument("--settle", type=float, default=None, help="seconds before the end without new faults")
    parser.add_argument("--mode", choices=("multi", "async"), default="multi", help="collector.mode")
    parser.add_argument("--kinds", default=None, help=f"of {','.join(KINDS)} (async: not kill-subcollector)")
    parser.add_argument("--cycle", action="store_true", help="the kinds in turn, not at random")
    parser.add_argument("--min-faults", type=int, default=0,
                        help="inject past the minutes until this many faults (with --cycle: each kind's turn, however slow "
                             "the machine)")
    parser.add_argument("--hang-timeout", type=float, default=None, help="launch.hang_timeout (toy 15, libero 60)")
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=0.2, help="share of the samples before flatness is judged")
    parser.add_argument("--continue-after", default="1,20", help="LOW,HIGH: a stop-continue's SIGCONT, uniform (s)")
    parser.add_argument("--stall-timeout", type=float, default=None, help="launch.stall_timeout (toy 180, libero 900)")
    parser.add_argument("--gap-slack", type=float, default=None,
                        help="check that the longest gap between batches is at most hang_timeout + this (s; "
                             "fault-fuzz: 15)")
    parser.add_argument("--jam-s", type=float, default=None,
                        help="no batch for this long ends the run as jammed (default: stall_timeout + 30 s)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="fault-fuzz: issue 46's (toy 2x4 async, 10 min, a worker every ~2 s); flags override")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=None)
    parser.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    preset = parser.parse_known_args()[0].preset
    if preset:
        parser.set_defaults(**PRESETS[preset])
    args = parser.parse_args()
    args.topology = args.topology or {"toy": "4x16", "libero": "2x4"}[args.env]
    args.kinds = args.kinds or ",".join(k for k in SOAK_KINDS if args.mode == "multi" or k != "kill-subcollector")
    if args.mode == "async" and "kill-subcollector" in args.kinds:
        parser.error("--mode async has no subcollector process to kill")
    if set(args.kinds.split(",")) - set(KINDS):
        parser.error(f"--kinds: of {','.join(KINDS)}")
    if args.settle is None:
        args.settle = 3 * (args.hang_timeout or SHAPE[args.env]["hang_timeout"])
    args.stall_timeout = args.stall_timeout or SHAPE[args.env]["stall_timeout"]
    args.jam_s = args.jam_s or args.stall_timeout + 30
    if args.trainer:
        return trainer(args)
    name = f"fault_fuzz_{args.env}_{args.mode}" if preset else f"chaos_soak_{args.env}"
    out = args.out or os.path.join(HERE, "results", f"{name}.json")
    # the soak itself ends, whatever the run does: its trainer past this is ended from here (a failure)
    deadline_s = (STARTUP_AND_TEARDOWN_S + args.minutes * 60 + 2 * args.settle + args.jam_s
                  + args.min_faults * (args.mean_gap + args.settle))  # a fault owed past the minutes: its gap, its settle
    with tempfile.TemporaryDirectory(prefix="topo-soak-") as folder:
        before = _shm()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([HOOKS, ROOT, os.environ.get("PYTHONPATH", "")]),
               "TOPO_SOAK_LEAK_MB": str(SHAPE[args.env]["leak_mb"]), "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
        argv = [sys.executable, __file__, "--trainer", "--folder", folder] + sys.argv[1:]
        with open(os.path.join(folder, "stderr.txt"), "w") as err:
            child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
            code, killed = _wait(child, deadline_s)
        with open(os.path.join(folder, "stderr.txt")) as f:
            stderr = f.read()
        if killed or code != 0 or not os.path.exists(os.path.join(folder, "trainer.json")):
            sys.stderr.write(stderr[-6000:])
            return _failed(args, out, folder, before, code, killed, deadline_s, stderr)
        with open(os.path.join(folder, "trainer.json")) as f:
            t = json.load(f)
        left = leftovers(t, before)
    lines = stderr.splitlines()
    noise = {"tracebacks": sum("Traceback (most recent call last)" in line for line in lines),
             "leaked_warnings": [line for line in lines if "leaked" in line][:10],
             "lines": len(lines), "text": lines if len(lines) <= 400 else lines[:200] + ["..."] + lines[-200:]}
    acc = account(t)
    result = {k: t[k] for k in ("env", "mode", "topology", "seed", "minutes", "mean_gap_s", "ready_s", "batches",
                                "frames_delivered", "exit_code", "constructions", "episodes", "seeds", "processes")}
    result.update(machine={"cores": os.cpu_count(), "load_average_1m_at_end": round(os.getloadavg()[0], 2)},
                  faults=acc["faults"], unmatched_events=acc["unmatched_events"],
                  frames={"lost": acc["lost_frames"], "rollout_steps_per_worker": acc["rollout_steps"],
                          "lives_with_loss": [x for x in acc["lives"] if x["lost"]],
                          "lives_over_one_rollout": acc["lives_over_one_rollout"]},
                  flat={"trainer_rss_mb": flat(t["samples"], args.warmup, lambda s: s["trainer"]["rss_mb"]),
                        "trainer_fds": flat(t["samples"], args.warmup, lambda s: s["trainer"]["fds"]),
                        **({"server_rss_mb": flat(t["samples"], args.warmup, lambda s: s["server"]["rss_mb"]),
                            "server_fds": flat(t["samples"], args.warmup, lambda s: s["server"]["fds"])}
                           if args.mode == "async" else
                           {"subcollectors_rss_mb": flat(t["samples"], args.warmup, lambda s: _sum(s, "rss_mb")),
                            "subcollectors_fds": flat(t["samples"], args.warmup, lambda s: _sum(s, "fds"))})},
                  run_dir={"bytes_at_end": t["samples"][-1]["run_dir_bytes"],
                           "bytes_per_recorded_episode": round(t["samples"][-1]["run_dir_bytes"] / max(1, t["episodes"]["recorded"]))},
                  left=left, stderr=noise, samples=t["samples"], restarts=t["restarts"], recycles=t["recycles"])
    kinds = {k: sum(f["kind"] == k for f in acc["faults"]) for k in args.kinds.split(",")}
    hang = t["spec"]["launch"]["hang_timeout"]
    stops = [f for f in acc["faults"] if f["kind"] == "stop-continue"]
    result["counts"] = {
        "batches": t["batches"]["delivered"], "restarts": len(t["restarts"]), "recycles": len(t["recycles"]),
        "longest_gap_s": t["gaps"]["longest_s"], "longest_gap_began_s": t["gaps"]["longest_began_s"],
        "gap_limit_s": None if args.gap_slack is None else hang + args.gap_slack, "faults": len(acc["faults"]),
        "faults_per_minute": round(len(acc["faults"]) / max(1e-9, args.minutes - args.settle / 60), 2),
        "by_kind": {k: {"injected": n, "named": sum(f["named"] for f in acc["faults"] if f["kind"] == k),
                        "recovered": sum(f["recovered"] for f in acc["faults"] if f["kind"] == k)}
                    for k, n in kinds.items()},
        "stop_continue": {"named_worker_hung": sum(f["outcome"] == "worker-hung" for f in stops),
                          "stepped_again_unnamed": sum(f["outcome"] == "stepped" for f in stops),
                          "wrong": [{k: f.get(k) for k in ("injected_s", "stop_s", "continued_s", "expected", "outcome",
                                                          "stepped_again_s", "gone", "cause")}
                                    for f in stops if not (f["named"] and f["recovered"])]},
        "stalls_named": len(t["stalls"])}
    result.update(gaps=t["gaps"], ended=t["ended"], closed=t["closed"], stalls=t["stalls"], failure=t["failure"])
    checks = {
        "every_fault_found_and_named": all(f["found_by"] and f["named"] for f in acc["faults"]),
        "every_fault_recovered": all(f["recovered"] for f in acc["faults"]),
        "no_event_without_a_fault": not acc["unmatched_events"],
        "every_batch_full": t["batches"]["full"] == t["batches"]["delivered"] > 0,
        "lost_frames_only_the_rollout_of_an_ended_life": not acc["lives_over_one_rollout"],
        "trainer_and_subcollectors_flat": all(v["flat"] for v in result["flat"].values()),
        "nothing_left": not (left["by_environment"] or left["dev_shm"] or t["processes"]["alive_after"]),
        "no_traceback_or_leak_warning": not (noise["tracebacks"] or noise["leaked_warnings"]),
        "no_env_built_in_a_parent": all(t["constructions"].get(r, 0) == 0 for r in ("trainer", "server", "subcollector")),
        "run_exit_0": t["exit_code"] == 0,
        "stall_watchdog_silent": not t["stalls"] and (t["failure"] or {}).get("kind") != "stalled",
        "run_ended_by_itself": t["ended"] is None and t["closed"] is None,
    }
    if args.gap_slack is not None:
        checks["longest_gap_within_hang_timeout_plus_slack"] = t["gaps"]["longest_s"] <= hang + args.gap_slack
    result["faults_by_kind"] = kinds
    result["checks"] = checks
    result["ok"] = all(checks.values())
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    plot(result, os.path.splitext(out)[0] + ".png")
    found = [f["found_s"] for f in acc["faults"] if f.get("found_s") is not None]
    print(f"{result['env']} {result['mode']} {result['topology']}, {args.minutes} min: {len(acc['faults'])} faults {kinds}, "
          f"found {sum(bool(f['found_by']) for f in acc['faults'])}, recovered {sum(f['recovered'] for f in acc['faults'])}"
          f" (found in {statistics.median(found) if found else None} s median), batches {t['batches']['full']}/"
          f"{t['batches']['delivered']} full, longest gap {t['gaps']['longest_s']:.1f} s, restarts {len(t['restarts'])}, "
          f"stalls named {len(t['stalls'])}, frames lost {acc['lost_frames']}; failed checks: "
          f"{[k for k, v in checks.items() if not v] or 'none'} -> {out}")
    sys.exit(0 if result["ok"] else 1)


STARTUP_AND_TEARDOWN_S = 300.0  # the deadline's allowance past the run's minutes, settle and jam watch


def _wait(child: subprocess.Popen, deadline_s: float) -> tuple[int | None, bool]:
    """The trainer's exit status, and whether it had to be ended from here: SIGTERM past ``deadline_s``, SIGKILL a
    minute later."""
    try:
        return child.wait(deadline_s), False
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGTERM)
    try:
        return child.wait(60), True
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait(), True


def _failed(args, out: str, folder: str, before: set[str], code: int | None, killed: bool, deadline_s: float,
            stderr: str) -> None:
    """The trainer failed or was ended at the deadline, with no figures of its own: what it printed, what its run
    left (its watcher ends the rest once the trainer is gone; what is still there a minute on is killed here, and
    counted), a result that fails, exit 1."""
    run_dir = None
    if os.path.exists(os.path.join(folder, "run_dir.txt")):
        with open(os.path.join(folder, "run_dir.txt")) as f:
            run_dir = f.read().strip()
    left = {"by_environment": [], "dev_shm": []}
    if run_dir:
        end = time.monotonic() + 60
        while (left_now := _by_environment(run_dir)) and time.monotonic() < end:
            time.sleep(1)
        left["by_environment"] = left_now
        for p in left_now:
            try:
                os.kill(p["pid"], signal.SIGKILL)
            except OSError:
                pass
    lines = stderr.splitlines()
    checks = {"trainer_exit_0": code == 0, "run_ended_by_itself": not killed,
              "nothing_left": not left["by_environment"]}
    result = {"env": args.env, "mode": args.mode, "topology": args.topology, "minutes": args.minutes,
              "ended": {"by": "the driver's deadline" if killed else f"trainer exit {code}", "deadline_s": deadline_s},
              "faults": [line for line in lines if line.startswith("soak: ")], "left": left,
              "stderr": {"lines": len(lines), "text": lines[-200:]}, "checks": checks, "ok": False}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{args.env} {args.mode} {args.topology}: the soak's trainer "
          f"{'was ended at the deadline' if killed else f'failed (exit {code})'}; left {len(left['by_environment'])} "
          f"processes -> {out}")
    sys.exit(1)


def _sum(s: dict, key: str):
    values = [v[key] for v in s["subcollectors"].values()]
    return None if any(v is None for v in values) else sum(values)


if __name__ == "__main__":
    main()
