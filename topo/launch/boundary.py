"""torchrl's and tensordict's names that topo uses but torchrl does not promise to keep: one place.

Private names, instance attributes and wire formats that topo's runtime relies on are listed in
:data:`NAMES`, each with the feature that needs it and why. :func:`check` reads the installed torchrl
(its version, then each name) and says per feature what works: a run refuses to start when a feature
it needs is missing (:func:`require`), and turns a feature off with a warning where that is safe
(restarts: a failure then ends the run, as without ``launch.restarts``). ``topo doctor`` prints the same
verdict. The access helpers below are the only code in topo that touches those names.

Versions: :data:`TESTED` were run through the test suite (``scripts/torchrl-nightly`` for the nightly);
any other torchrl from :data:`MINIMUM` on runs when its names check out, with a warning that it is untested.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from topo.runtime import quiet

#: torchrl versions the test suite ran against: version -> what was run (README: "torchrl versions")
TESTED = {"0.14.1": "the full suite", "2026.10.27": "torchrl-nightly: scripts/torchrl-nightly"}
MINIMUM = (0, 14)  # the multi collectors, worker metadata and the weight-sync schemes topo drives
#: what a feature does when its names are missing: refuse the run, or run without it and warn
DROPPABLE = {"restarts": "restarts and subcollector hang detection are off (a failure ends the run)",
             "ray-restarts": "restarts of Ray actors are off (a failure ends the run)",
             "replay-buffer-check": "a replay buffer whose storage would make torchrl build an env in the trainer "
                                    "is no longer refused",
             "background-pause": "a pause in the background drops the rollout each subcollector has in flight, as "
                                 "torchrl's own pause does",
             "quiet-ends": "an env worker ended by its subcollector's death prints its traceback on stderr"}
FEATURES = ("collector", "restarts", "ray-restarts", "policy-server", "replay-buffer-check", "libero", "async",
            "background-pause", "quiet-ends")


@dataclass(frozen=True)
class Name:
    """A name topo uses: ``attr`` of module ``module`` (dotted for a class member), for ``feature``."""

    feature: str
    module: str
    attr: str
    why: str
    kind: str = "name"  # "name": importable attribute; "instance": set on an instance of the class ``attr`` names
    #                     (checked on one built here); "source": text in the module's source (a wire format)
    members: tuple[str, ...] = ()  # instance attributes, or the texts a source must contain

    @property
    def label(self) -> str:
        return ".".join(filter(None, (self.module, self.attr))) + (f" [{', '.join(self.members)}]" if self.members else "")


NAMES: tuple[Name, ...] = (
    Name("collector", "torchrl.collectors", "MultiSyncCollector", "the sync collector over the subcollectors"),
    Name("collector", "torchrl.collectors", "MultiAsyncCollector", "the async collector over the subcollectors"),
    Name("collector", "torchrl.envs", "ParallelEnv", "each subcollector's env workers, built from worker metadata"),
    Name("collector", "torchrl.weight_update", "SharedMemWeightSyncScheme", "policy.weight_sync: shared_mem"),
    Name("collector", "torchrl.weight_update", "MultiProcessWeightSyncScheme", "policy.weight_sync: multiprocess"),
    Name("restarts", "torchrl.collectors._multi_base", "_make_process_no_warn_cls",
         "how torchrl makes each subcollector process: recorded, to start one subcollector again"),
    Name("restarts", "torchrl.collectors._multi_base", "MultiCollector._run_processes",
         "overridden: records each subcollector process's arguments"),
    Name("restarts", "torchrl.collectors._multi_base", "MultiCollector._run_processes", "the collector's process "
         "table, replaced by views that answer is_alive() and restart", kind="source",
         members=("self.procs", "self.pipes", "self.queue_out", "_make_process_no_warn_cls(ctx)")),
    Name("restarts", "torchrl.collectors._multi_base", "MultiCollector._queue_len", "a restarted subcollector's queue size"),
    Name("restarts", "torchrl.collectors._runner", "_main_async_collector_impl", "the subcollector's messages: "
         "'instantiated', its error dict, output items ((data, idx), j) or (idx, j)", kind="source",
         members=('"instantiated"', '"exception_type"', '"exception_msg"', "queue_out.put((idx, j)")),
    Name("restarts", "torchrl.collectors.utils", "_stage_unshareable_weights_on_cpu",
         "a restarted subcollector's first weights (multiprocess scheme)"),
    Name("restarts", "torchrl.data.utils", "CloudpickleWrapper", "a restarted subcollector's env and policy factories"),
    Name("restarts", "torchrl.weight_update", "MPTransport", "a restarted subcollector's weight transport"),
    Name("restarts", "torchrl.weight_update", "SharedMemWeightSyncScheme", "a restarted subcollector's queues",
         kind="instance", members=("_weight_init_queues", "_instruction_queues", "_ack_queues", "shared_transport")),
    Name("restarts", "torchrl.weight_update", "MultiProcessWeightSyncScheme", "a restarted subcollector's queues",
         kind="instance", members=("_weight_init_queues", "_instruction_queues", "_ack_queues", "_sender_transports",
                                   "_strategy", "model_id")),
    Name("restarts", "torchrl.weight_update", "MultiProcessWeightSyncScheme.prepare_weights",
         "a restarted subcollector's first weights"),
    Name("ray-restarts", "torchrl.collectors.distributed.ray", "RayCollector", "a subcollector's actor made again "
         "as torchrl made it, in its place; the weight-sync scheme replaced", kind="source",
         members=("self._remote_collectors", "self._weight_sync_schemes", "def _make_collector")),
    Name("ray-restarts", "torchrl.weight_update", "RayWeightSyncScheme._copy_uninitialized",
         "a new weight-sync group once an actor is replaced"),
    Name("ray-restarts", "torchrl.envs", "ParallelEnv", "an actor names its env workers that died", kind="source",
         members=("self._workers",)),
    Name("policy-server", "torchrl.modules.inference_server", "ProcessInferenceServer", "policy.placement: server"),
    Name("policy-server", "torchrl.modules.inference_server", "PolicyClientModule", "each subcollector's client"),
    Name("policy-server", "torchrl.modules.inference_server", "MPTransport",
         "the server's transport where no slot layout is known before the start (manager-backed)"),
    Name("policy-server", "torchrl.modules.inference_server", "ProcessSlotTransport",
         "the local server's transport: one shared-memory slot per subcollector (topo.launch.server_slots)"),
    Name("policy-server", "torchrl.modules.inference_server", "InferenceServer",
         "under placement.engine ray: the server as a Ray actor (service_backend='ray')"),
    Name("replay-buffer-check", "torchrl.data", "ReplayBuffer", "an uninitialised storage is refused (torchrl "
         "would build subcollector 0's envs in the trainer)", kind="instance", members=("_storage",)),
    Name("background-pause", "torchrl.collectors._runner", "_main_async_collector",
         "the subcollector's loop, run over a pipe that keeps the rollout in flight at a pause (KeepingPipe)"),
    Name("background-pause", "torchrl.collectors._runner", "_main_async_collector_impl", "after each rollout the loop "
         "polls its pipe for _MIN_TIMEOUT and drops the rollout if a message waits; running free, it reads a pause "
         "at its top", kind="source", members=("pipe_child.poll(_MIN_TIMEOUT)", "pipe_child.poll(1e-4)",
                                                'msg == "pause"', "replay_buffer.extend(next_data)")),
    Name("background-pause", "torchrl.collectors._constants", "_MIN_TIMEOUT", "the timeout of that one poll"),
    Name("quiet-ends", "torchrl.envs.batched_envs", "_run_worker_pipe_direct", "an env worker's loop, run so that "
         "its subcollector's death ends it quietly (topo.runtime.quiet)"),
    Name("quiet-ends", "torchrl.envs.batched_envs", "_run_worker_pipe_shared_mem", "the same, with shared buffers"),
    Name("quiet-ends", "torchrl._utils", "_check_for_faulty_process", "what a subcollector's loop raises through it "
         "follows an env worker's death (boundary.FOUND_DEAD)"),
    Name("quiet-ends", "torchrl.envs.batched_envs", "ParallelEnv._start_workers", "reads the worker loop from its "
         "module when it starts the workers", kind="source",
         members=("func = _run_worker_pipe_direct", "func = _run_worker_pipe_shared_mem")),
    Name("async", "torchrl.collectors", "AsyncBatchedCollector", "collector.mode: async"),
    Name("async", "torchrl.collectors._async_batched", "AsyncBatchedCollector._ensure_started",
         "the env workers and the server started inside topo's launch window (torchrl starts them at the first batch)"),
    Name("async", "torchrl.collectors._async_batched", "_ENV_IDX_KEY", "the batch key naming each step's env worker"),
    Name("async", "torchrl.modules.inference_server", "ProcessSlotTransport", "async: the slots, from declared layouts"),
    Name("async", "torchrl.modules.inference_server", "InferenceServerConfig", "async: the server's batching"),
    Name("async", "torchrl.collectors._async_batched", "AsyncBatchedCollector._ensure_started", "makes "
         "its env workers, result queues and permits with the transport's context, one process per env named after it",
         kind="source", members=("ctx = self._transport._ctx", "ctx.Queue(maxsize=capacity)",
                                 "ctx.BoundedSemaphore(capacity)", "ctx.Process(", 'name=f"AsyncBatchedCollector-env-{env_id}"',
                                 "self._workers.append(process)")),
    Name("async", "torchrl.collectors._async_batched", "_process_env_loop", "a permit per chunk, sent "
         "with it; the shared events each worker checks", kind="source",
         members=("result_capacity.acquire(timeout=0.01)", "result_queue.put(transition", "shutdown_event.is_set()",
                  "pause_event.is_set()", "paused_event.set()")),
    Name("async", "torchrl.collectors._async_batched", "AsyncBatchedCollector._ensure_started", "the events its "
         "env workers share, made by the transport's context (topo's: flags)", kind="source", members=("self._shutdown_event = ctx.Event()",
                                                      "self._process_pause_event = ctx.Event()",
                                                      "self._process_paused_events = [")),
    Name("async", "torchrl.modules.inference_server._process_slot", "ProcessSlotTransport.__init__",
         "the slots topo's SlotTransport keeps, and the signals it replaces (topo.launch.async_mode.transport)",
         kind="source", members=("self._request_slots = ", "self._response_slots = ", "self._submitted_at = ",
                                 "self._response_status = ", "self._exception_queues = ", "self._work_semaphore = ",
                                 "self._request_ready = ", "self._request_lock = ", "self._response_events = ",
                                 "self._peer_alive = ")),
    Name("async", "torchrl.modules.inference_server._process_slot", "_ProcessSlotFuture",
         "what a request's future asks of topo's slot client", kind="source",
         members=("self._client._response_event.is_set()", "self._client._peer_alive", "self._client._receive(")),
    Name("async", "torchrl.modules.inference_server", "ProcessInferenceServer.__init__",
         "the server's liveness is the transport's flag where it has one", kind="source",
         members=('getattr(transport, "_peer_alive", None)',)),
    Name("libero", "torchrl.envs.libs.libero", "LiberoEnv._reset", "builder options around each reset"),
    Name("libero", "torchrl.envs.libs.libero", "LiberoEnv._select_init_state", "fixtures_by_init_state"),
    Name("libero", "torchrl.envs.libs.libero", "LiberoEnv._set_seed", "env.set_seed(seed) in each worker"),
    Name("libero", "torchrl.envs.libs.libero", "_ensure_libero_config", "LIBERO's config, written before torchrl's"),
    Name("libero", "torchrl.envs.libs.libero", "", "what the builder options read of a LiberoEnv (its module's source)",
         kind="source", members=("self._env", "self.settle_steps", "self.init_states", "self.task_suite",
                                 "self.task_id", "self._current_init_state_index")),
)


@dataclass
class Support:
    """What the installed torchrl supports: its version, and per feature the names it lacks."""

    version: str | None
    tested: str | None
    missing: dict[str, list[str]] = field(default_factory=dict)  # feature -> labels
    error: str | None = None  # torchrl absent, or older than MINIMUM

    def ok(self, feature: str) -> bool:
        return self.error is None and not self.missing.get(feature)

    def warnings(self, features: tuple[str, ...] = FEATURES) -> list[str]:
        """What a run needing ``features`` is told before it starts (nothing on a tested torchrl with every name)."""
        out = []
        if self.error is None and self.tested is None:
            out.append(f"torchrl {self.version} is not among the versions topo was tested with "
                       f"({', '.join(TESTED)}); every name it needs was found")
        for feature in features:
            if feature in DROPPABLE and not self.ok(feature):
                out.append(f"torchrl {self.version}: {DROPPABLE[feature]}: missing {'; '.join(self.missing[feature])}")
        return out

    def refusal(self, features: tuple[str, ...]) -> str | None:
        """Why a run needing ``features`` cannot start on this torchrl; None when it can."""
        if self.error is not None:
            return self.error
        missing = [f"{feature}: {'; '.join(self.missing[feature])}" for feature in features
                   if feature not in DROPPABLE and not self.ok(feature)]
        if not missing:
            return None
        return (f"torchrl {self.version} lacks names topo needs ({' | '.join(missing)}); topo was tested with "
                f"torchrl {', '.join(TESTED)}: pip install 'torchrl==0.14.1'")

    def to_dict(self, features: tuple[str, ...] = FEATURES) -> dict[str, Any]:
        return {"version": self.version, "tested": self.tested, "error": self.error,
                "features": {f: self.ok(f) for f in features}, "missing": self.missing,
                "warnings": self.warnings(features)}


def installed_version() -> str | None:
    """torchrl's version from its distribution's metadata (no import); None when it is not installed."""
    for dist in ("torchrl", "torchrl-nightly"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def check(features: tuple[str, ...] = FEATURES, names: tuple[Name, ...] = NAMES) -> Support:
    """Import what the ``names`` of ``features`` need and report, per feature, what is missing (imports torchrl)."""
    version = installed_version()
    if version is None:
        return Support(None, None, error="torchrl is not installed: pip install 'topo[launch]'")
    torchrl = importlib.import_module("torchrl")
    version = getattr(torchrl, "__version__", version)
    tested = next((what for v, what in TESTED.items() if version.split("+")[0].startswith(v)), None)
    if _release(version) < MINIMUM:
        return Support(version, tested, error=f"torchrl {version} is older than topo supports "
                       f"({'.'.join(map(str, MINIMUM))} or newer; tested: {', '.join(TESTED)})")
    support = Support(version, tested)
    for name in names:
        if name.feature in features and not _present(name):
            support.missing.setdefault(name.feature, []).append(name.label)
    return support


def _present(name: Name) -> bool:
    try:
        obj: Any = importlib.import_module(name.module)
        for part in filter(None, name.attr.split(".")):  # "" names the module itself
            obj = getattr(obj, part)
        if name.kind == "instance":
            instance = obj()
            return all(hasattr(instance, member) for member in name.members)
        if name.kind == "source":
            text = inspect.getsource(obj)
            return all(member in text for member in name.members)
        return True
    except Exception:  # noqa: BLE001 - an import that fails, a name gone, a constructor that changed: missing
        return False


def features_of(plan: dict[str, Any], policy_placement: str | None) -> tuple[str, ...]:
    """The features a run of ``plan`` uses, with the policy placed at ``policy_placement`` (None: no policy)."""
    needed = ["collector"]
    launch = plan["launch"]
    if (launch.get("restarts") or {}).get("max") or launch.get("hang_timeout") is not None or launch.get("recycle"):
        needed.append("ray-restarts" if (plan.get("placement") or {}).get("engine") == "ray" else "restarts")
    if policy_placement == "server":
        needed.append("policy-server")
    if any(row["kwargs"].get("backend") == "libero" for sub in plan["subcollectors"] for row in sub["workers"]):
        needed.append("libero")
    if (plan.get("collector") or {}).get("mode") == "async":
        needed.append("async")
    needed.append("replay-buffer-check")
    return tuple(needed)


_checked: dict[tuple[str, ...], Support] = {}


def support(features: tuple[str, ...] = FEATURES) -> Support:
    """:func:`check` of the installed torchrl for ``features``, once per process."""
    if features not in _checked:
        _checked[features] = check(features)
    return _checked[features]


# -- the access helpers: the only code in topo that touches the names above ---------------------

@contextlib.contextmanager
def recording_processes(made: list[tuple[Any, dict]]) -> Iterator[None]:
    """While the ``with`` block runs, torchrl's subcollector processes are made as usual and each one's class
    and keyword arguments appended to ``made`` (Python forgets a started process's arguments); one that fills a
    replay buffer runs torchrl's loop through :func:`run_keeping_rollouts` (so does its restart, made from
    ``made``); every one runs it through :func:`run_subcollector`."""
    from torchrl.collectors import _multi_base

    original = _multi_base._make_process_no_warn_cls

    def recording(ctx=None):
        cls = original(ctx)

        def make(**kwargs):
            if (kwargs.get("kwargs") or {}).get("replay_buffer") is not None and \
                    support(("background-pause",)).ok("background-pause"):
                kwargs["target"] = run_keeping_rollouts  # it can run free, filling the buffer: start(), pause()
            kwargs["target"] = functools.partial(run_subcollector, kwargs["target"])
            made.append((cls, kwargs))
            return cls(**kwargs)

        return make

    _multi_base._make_process_no_warn_cls = recording
    try:
        yield
    finally:
        _multi_base._make_process_no_warn_cls = original


def run_subcollector(target, *args, **kwargs) -> None:
    """A subcollector process: torchrl's loop ``target``, quiet when an env worker's death ends it (the trainer
    names that death: :func:`topo.runtime.quiet.run_quietly`)."""
    quiet.quiet_fd_sharing()
    quiet.run_quietly("subcollector", functools.partial(target, *args, **kwargs), FOUND_DEAD)


def quiet_env_workers(requester: Any = None) -> bool:
    """In a subcollector process: the env workers its ``ParallelEnv`` starts run torchrl's loop through
    :func:`run_env_worker`, quiet when the subcollector's death ends them and, given a ``requester``
    (:class:`topo.launch.forkserver.Requester`: forked from the run's forkserver), in its environment and process
    group first. Whether they do (this torchrl's worker loops are where topo knows them)."""
    if not support(("quiet-ends",)).ok("quiet-ends"):
        return False
    from torchrl.envs import batched_envs

    for name in _WORKER_LOOPS:
        _WORKER_ORIGINALS.setdefault(name, getattr(batched_envs, name))  # a forked worker finds it here
        setattr(batched_envs, name, functools.partial(run_env_worker, name, requester))
    return True


_WORKER_LOOPS = ("_run_worker_pipe_direct", "_run_worker_pipe_shared_mem")
#: torchrl's check of a ParallelEnv's workers: what a subcollector's loop raises through it, it raises because a
#: worker is dead (its own RuntimeError, or a ValueError closing the others while they run)
FOUND_DEAD = ("_check_for_faulty_process",)
_WORKER_ORIGINALS: dict[str, Any] = {}


def run_env_worker(name: str, requester: Any, *args, **kwargs) -> None:
    """An env worker process: torchrl's loop ``name`` (the module's own in a fresh process, the saved one in a forked
    one), quiet when its subcollector's death ends it; first its ``requester``'s environment and group, if any."""
    from torchrl.envs import batched_envs

    if requester is not None:
        requester.join()
    quiet.quiet_fd_sharing()
    quiet.run_quietly("worker", functools.partial(_WORKER_ORIGINALS.get(name) or getattr(batched_envs, name), *args,
                                                  **kwargs))


def run_keeping_rollouts(*args, **kwargs) -> None:
    """torchrl's subcollector loop (the process target of one that fills a replay buffer) over a
    :class:`KeepingPipe`: a pause that comes while a rollout runs is answered once that rollout is in the buffer."""
    from torchrl.collectors._runner import _main_async_collector

    kwargs["pipe_child"] = KeepingPipe(kwargs["pipe_child"])
    _main_async_collector(*args, **kwargs)


class KeepingPipe:
    """A subcollector's end of its pipe, as torchrl's loop polls it. torchrl drops the rollout it just made when a
    message waits after it (``poll(_MIN_TIMEOUT)``): for a pause, that threw away about one rollout per
    subcollector at each pause of the background loop (toy 2 x 4, 20 pauses: 2,400 env steps for 1,280 frames
    written). Here a pause that waits then is held back from that one poll, so the rollout is written to the
    replay buffer, and given at the next poll, the loop's top, where torchrl reads a pause; any other message is
    read as torchrl reads it."""

    def __init__(self, pipe: Any):
        from torchrl.collectors._constants import _MIN_TIMEOUT

        self._pipe = pipe
        self._held: Any = None
        self._after_rollout = _MIN_TIMEOUT  # the timeout of the loop's one poll after a rollout

    def poll(self, timeout: float | None = 0.0) -> bool:
        if self._held is not None:
            return True
        if not self._pipe.poll(timeout):
            return False
        if timeout != self._after_rollout:
            return True
        self._held = self._pipe.recv()
        return not (isinstance(self._held, tuple) and len(self._held) == 2 and self._held[1] == "pause")

    def recv(self) -> Any:
        if self._held is None:
            return self._pipe.recv()
        held, self._held = self._held, None
        return held

    def __getattr__(self, name: str) -> Any:  # send, close, fileno...: the pipe's own
        return getattr(self._pipe, name)


def pickled(fn):
    """``fn`` as torchrl ships factories to a subcollector process."""
    from torchrl.data.utils import CloudpickleWrapper

    return CloudpickleWrapper(fn)


def sender_of(item: Any) -> int | None:
    """The subcollector index in an item of torchrl's output queue: ``((data, idx), j)`` or ``(idx, j)``."""
    head = item[0] if isinstance(item, tuple) and item else None
    if isinstance(head, tuple) and len(head) == 2 and isinstance(head[1], int):
        return head[1]
    return head if isinstance(head, int) else None


INSTANTIATED = "instantiated"  # what a subcollector sends once its env and policy are built
CONTINUE = ("continue", "continue_random")  # what torchrl sends to ask a subcollector for a batch


def startup_error(message: Any) -> tuple[str, str | None]:
    """(one line, traceback) of what a subcollector sent instead of ``INSTANTIATED``."""
    if isinstance(message, dict):
        text = f"{message.get('exception_type')}: {message.get('exception_msg')}"
        return text.splitlines()[0] if text else "", message.get("traceback")
    text = str(message)
    return (text.splitlines()[0] if text else ""), None


def weight_scheme(collector) -> Any:
    """The collector's weight-sync scheme for the policy, or None."""
    return (getattr(collector, "_weight_sync_schemes", None) or {}).get("policy")


def ack_queue(scheme, c: int):
    """The queue subcollector ``c`` acknowledges a weight push on."""
    return scheme._ack_queues[c]


def rewire(scheme, c: int, ctx) -> list:
    """New weight-sync queues for subcollector ``c`` (its old process may have died holding one); the objects they
    replace, which the caller keeps while another restart may still be unpickling them (a restart's process gets
    the whole scheme: dropped, a queue's semaphores are unlinked, and that process fails to start)."""
    from torchrl.weight_update import MultiProcessWeightSyncScheme
    from torchrl.weight_update import MPTransport

    replaced = []
    for name in ("_weight_init_queues", "_instruction_queues", "_ack_queues"):
        replaced.append(getattr(scheme, name)[c])
        getattr(scheme, name)[c] = ctx.Queue()
    if isinstance(scheme, MultiProcessWeightSyncScheme):
        replaced.append(scheme._sender_transports[c])
        scheme._sender_transports[c] = MPTransport(weight_queue=scheme._weight_init_queues[c],
                                                   ack_queue=scheme._ack_queues[c])
    return replaced


def send_first_weights(scheme, c: int, collector, weights) -> None:
    """A restarted subcollector's first weights, as torchrl's scheme gave them to its first process."""
    from torchrl.collectors.utils import _stage_unshareable_weights_on_cpu
    from torchrl.weight_update import MultiProcessWeightSyncScheme

    if isinstance(scheme, MultiProcessWeightSyncScheme):
        prepared = scheme.prepare_weights(weights=weights, model_id=scheme.model_id, strategy=scheme._strategy,
                                          context=collector)
        scheme._sender_transports[c].send_weights_async(_stage_unshareable_weights_on_cpu(prepared),
                                                        model_id=scheme.model_id)
    else:  # shared memory: the buffer every copy reads, updated in place by each push
        scheme._weight_init_queues[c].put(scheme.shared_transport._params_map[c])


def storage_builds_env_in_trainer(rb) -> bool:
    """Whether torchrl would initialise ``rb``'s storage by building subcollector 0's env in the caller."""
    storage = getattr(rb, "_storage", None)
    return storage is not None and not getattr(storage, "initialized", True) and not getattr(storage, "shared_init", False)


def env_worker_processes(env) -> list:
    """The worker processes of a ``ParallelEnv`` (empty for any other env, or before they start)."""
    return list(getattr(env, "_workers", None) or [])


def dead_env_workers(env) -> list[tuple[int, int, int | None]]:
    """``(index, pid, exitcode)`` of each worker of a ``ParallelEnv`` that died; not those torchrl ended and closed
    once it found one dead (``_check_for_faulty_process``: their process objects are closed)."""
    out = []
    for index, proc in enumerate(env_worker_processes(env)):
        try:
            if not proc.is_alive():
                out.append((index, proc.pid, proc.exitcode))
        except ValueError:  # closed by torchrl
            continue
    return out


def ray_remote_collectors(collector) -> list:
    """The list a ``RayCollector`` keeps its actors in (replacing an item replaces that subcollector's actor)."""
    return collector._remote_collectors


def ray_new_weight_scheme(scheme):
    """A ``RayWeightSyncScheme`` configured as ``scheme``, without its connection (a new gloo group to form)."""
    return scheme._copy_uninitialized()


def set_weight_scheme(collector, scheme) -> None:
    """Make ``scheme`` the collector's weight-sync scheme for the policy."""
    collector._weight_sync_schemes["policy"] = scheme


def start_async(collector) -> None:
    """Start an ``AsyncBatchedCollector``'s env workers and inference server now (torchrl: at the first batch)."""
    collector._ensure_started()


def async_context(collector, context) -> None:
    """Make ``context`` the one an ``AsyncBatchedCollector`` (not started) makes its env workers and their queues
    with (its server took its own when the collector was built)."""
    collector._transport._ctx = context


def async_workers(collector) -> list:
    """The started ``AsyncBatchedCollector``'s list of env worker processes (index: the env id)."""
    return collector._workers


def async_transport(collector):
    """The ``AsyncBatchedCollector``'s transport (its env workers' inference slots)."""
    return collector._transport


def forget_trajectory(collector, i: int) -> None:
    """Drop what an ``AsyncBatchedCollector`` holds of env ``i``'s unfinished trajectory (its worker restarts)."""
    collector._yield_queues[i].clear()


def env_index_key() -> str:
    """The key of an ``AsyncBatchedCollector`` batch that holds each step's env worker (its index in the list)."""
    from torchrl.collectors._async_batched import _ENV_IDX_KEY

    return _ENV_IDX_KEY
