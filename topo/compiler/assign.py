"""The assignment policy: which task, instruction, group ids, seed, init state and render GPU each worker gets.

The defaults reproduce torchrl's vla_grpo LIBERO recipe. With ``g = offset(c) + w`` the global index
of worker ``w`` of subcollector ``c``:

- seed = base + g (``strategy: offset``), or the g-th child of ``numpy.random.SeedSequence(base)``
  (``strategy: sequence``, independent streams), or ``seeds.list[g]``;
- without parallel group repeats: task = tasks[g % T], group_id_offset = g * 10**6,
  group_repeats = candidate_size (when groups are declared), group_id_mode = episode;
- with parallel group repeats: logical = g // size, task = tasks[logical % T],
  group_id_offset = logical * 10**6, group_repeats = candidate_size // size, group_id_mode = init_state;
- render GPU = render_gpus[c % len] for every worker of subcollector c (an id in the spec's numbering:
  CUDA by default, EGL for ``render_devices: {numbering: egl}``).
"""
from __future__ import annotations

from typing import Sequence

from topo.backends.base import Assignment, Backend, TaskCatalog
from topo.compiler.spec import Spec, TaskKey

GROUP_ID_OFFSET = 10**6


def task_list(spec: Spec, catalog: TaskCatalog | None) -> tuple[TaskKey, ...]:
    """The task keys workers cycle through ('all' is the backend's whole catalog)."""
    if spec.tasks_all:
        return catalog.ids if catalog is not None else ()
    return expand(spec.tasks or (), catalog)


def expand(keys: Sequence[TaskKey], catalog: TaskCatalog | None) -> tuple[TaskKey, ...]:
    """``keys`` with each 'all' marker (``"all"``, ``"suite:all"``) replaced by the catalog's ids (of that suite)."""
    out: list[TaskKey] = []
    for key in keys:
        if isinstance(key, str) and (key == "all" or key.endswith(":all")):
            out += [i for i in (catalog.ids if catalog is not None else ()) if str(i).startswith(key[:-3])]
        else:
            out.append(key)
    return tuple(out)


def seeds(spec: Spec) -> list[int]:
    n = spec.total_workers
    if spec.seed_list is not None:
        return list(spec.seed_list[:n])
    if spec.seed_strategy == "sequence":
        import numpy as np

        children = np.random.SeedSequence(spec.seed_base).spawn(n)
        return [int(child.generate_state(1, np.uint64)[0]) >> 1 for child in children]
    return [spec.seed_base + g for g in range(n)]


def block_of(blocks, g: int):
    acc = 0
    for block in blocks:
        acc += block.workers
        if g < acc:
            return block
    return None


def assign(spec: Spec, backend: Backend, catalog: TaskCatalog | None) -> list[list[Assignment]]:
    """One :class:`Assignment` per worker, per subcollector. Pure and deterministic."""
    tasks = task_list(spec, catalog)
    seed_of = seeds(spec)
    groups = spec.groups
    parallel = groups.parallel_repeats
    repeats = (groups.candidate_size // groups.size if parallel else groups.candidate_size) if groups.declared else None
    mode = "init_state" if parallel else "episode"
    blocks = _expand_blocks(spec.blocks) if spec.blocks else None
    overrides = spec.instructions
    cache: dict = {}

    def instruction_of(task):
        if task not in cache:
            text = overrides.get(task) if task is not None else None
            cache[task] = text if text is not None else backend.default_instruction(task, catalog)
        return cache[task]

    size = groups.size if parallel else 1
    n_tasks = len(tasks)
    ism, isid = spec.init_state_mode, spec.init_state_id
    out: list[list[Assignment]] = []
    for c, (first, count) in enumerate(zip(spec.offsets, spec.workers)):
        gpu = spec.render_gpus[c % len(spec.render_gpus)] if spec.render_gpus else None
        rows = []
        for g in range(first, first + count):
            unit = g // size
            extra = {}
            if blocks is not None:
                block = blocks[g] if g < len(blocks) else None
                task = block.task if block else None
                instruction = (block.instruction if block else None) or instruction_of(task)
                extra = block.kwargs if block else {}
            else:
                task = tasks[unit % n_tasks] if n_tasks else None
                instruction = instruction_of(task)
            seed = seed_of[g] if g < len(seed_of) else None
            rows.append(Assignment(c, g - first, g, task, instruction, unit * GROUP_ID_OFFSET, repeats, mode,
                                   seed, ism, isid, gpu, extra))
        out.append(rows)
    return out


def _expand_blocks(blocks: Sequence) -> list:
    return [block for block in blocks for _ in range(block.workers)]
