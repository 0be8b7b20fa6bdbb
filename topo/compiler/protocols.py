"""Named evaluation protocols: ``eval: {protocol: libero}`` (``topo eval SPEC --protocol libero``) is the field's
reference evaluation, written out as the eval section it stands for before anything reads it.

LIBERO, as the OpenVLA reference evaluation runs it (``openvla/openvla``, ``experiments/robot/libero/
run_libero_eval.py``; the same figures in ``physical-intelligence/openpi``, ``examples/libero/main.py``):

- the four standard suites, ``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10`` (the suites its
  papers report; ``libero_90`` may be named with ``suites``);
- every task, each of its 50 init states once (``num_trials_per_task = 50``, episode ``i`` from init state ``i``);
- at most 220 / 280 / 300 / 520 steps (``libero_90``: 400) after the settle steps, per suite (``max_steps``: the
  longest training demo's 193 / 254 / 270 / 505 / 373 steps, and some room);
- 10 no-op settle steps at each reset (``num_steps_wait = 10``: the objects fall into place first);
- seed 7 (``seed = 7``): given here to every episode, so an episode's outcome is a function of its suite, task,
  init state and the weights, never of its worker, its order or the worker count.

``suites``, ``tasks`` (ids within each suite) and ``init_states`` narrow it for a quick look; the plan and every
table then say the run is narrowed. What the protocol fixes (``trials``, ``seeds``, ``max_episode_steps``) a spec
may not write beside it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

#: the private key of a spec's data where :func:`expand` leaves what the eval section cannot say
KEY = "_protocol"


@dataclass(frozen=True)
class Protocol:
    name: str
    backend: str
    suites: tuple[str, ...]  # the default suites, in the order episodes run
    horizons: Mapping[str, int]  # steps per episode, per suite
    env_kwargs: Mapping[str, Any]  # the eval workers' kwargs over env.kwargs
    init_states: int  # per task
    seed: int  # every episode's
    source: str


LIBERO = Protocol(
    name="libero", backend="libero",
    suites=("libero_spatial", "libero_object", "libero_goal", "libero_10"),
    horizons={"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400},
    env_kwargs={"settle_steps": 10}, init_states=50, seed=7,
    source="openvla/openvla experiments/robot/libero/run_libero_eval.py (max_steps per suite, num_steps_wait 10, "
           "num_trials_per_task 50, seed 7)")
PROTOCOLS = {p.name: p for p in (LIBERO,)}
FIXED = ("trials", "seeds", "max_episode_steps")  # what a protocol decides


def expand(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``data`` (schema-valid) with its eval section written out: a protocol's tasks suite-qualified, its init
    states and one trial; ``variants``' perturbed suites beside each eval suite. Under :data:`KEY`, what the eval
    section has no key for: the protocol's horizons per suite, eval workers' kwargs, seed, what narrows it and what
    the spec wrote that it fixes; each variant suite's base suite."""
    section = data.get("eval")
    if not isinstance(section, dict) or not (section.get("protocol") or section.get("variants")):
        return data
    out, extra = dict(section), {}
    if section.get("protocol"):
        out, extra = _protocol(section)
    default = ((data.get("env") or {}).get("kwargs") or {}).get("task_suite")
    variants = {}
    tasks = out.get("tasks", (data.get("assignment") or {}).get("tasks"))  # eval's default: the training tasks
    if section.get("variants") and tasks is not None:
        items = tasks if isinstance(tasks, list) else [tasks]
        perturbed = []
        for item in items:
            suite, rest = (item.split(":", 1) if isinstance(item, str) and ":" in item else (default, item))
            for variant in section["variants"]:
                variants[f"{suite}_{variant}"] = suite
                perturbed.append(f"{suite}_{variant}:{rest}")
        out["tasks"] = [*(f"{default}:{item}" if not (isinstance(item, str) and ":" in item) else item
                          for item in items), *perturbed]
    out.pop("variants", None)
    if extra:
        extra["horizons"] = {suite: PROTOCOLS[extra["name"]].horizons[base] for suite in [*extra["suites"], *variants]
                             if (base := base_of(suite, PROTOCOLS[extra["name"]].horizons))}
    return {**data, "eval": out, KEY: {**extra, "variants": variants}}


def _protocol(section: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    p = PROTOCOLS[section["protocol"]]
    suites = list(dict.fromkeys(section.get("suites") or p.suites))
    tasks = section.get("tasks", "all")
    items = [f"{suite}:{item}" for suite in suites for item in (tasks if isinstance(tasks, list) else [tasks])]
    narrowed = {key: section[key] for key in ("suites", "tasks", "init_states") if key in section}
    out = {key: value for key, value in section.items() if key not in ("protocol", "suites", *FIXED)}
    out.update(tasks=items, init_states=section.get("init_states", f"0-{p.init_states - 1}"), trials=1)
    return out, {"name": p.name, "backend": p.backend, "suites": suites, "narrowed": narrowed or None,
                 "env_kwargs": dict(p.env_kwargs), "seed": p.seed, "source": p.source,
                 "overridden": [key for key in FIXED if key in section],
                 "qualified": [item for item in (tasks if isinstance(tasks, list) else [tasks])
                               if isinstance(item, str) and ":" in item]}


def base_of(suite: str, known: Mapping[str, Any]) -> str | None:
    """The protocol's suite that ``suite`` is, or perturbs (LIBERO-PRO's ``libero_goal_swap`` is ``libero_goal``'s)."""
    return max((name for name in known if suite == name or suite.startswith(name + "_")), key=len, default=None)
