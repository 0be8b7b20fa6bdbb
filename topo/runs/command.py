"""``topo runs show RUN [EPISODE]``, ``topo runs trace RUN`` and ``topo replay RUN EPISODE``: a kept run's episodes,
its timeline (:mod:`topo.runs.trace`), and one episode again.

``RUN`` is a run directory (``topo-run-*``) or the report directory holding it (``--report DIR``:
the latest run there). ``runs show`` reads the records through their index (:class:`topo.runtime.episode_index.Index`, no torch);
``replay`` rebuilds the env (:func:`topo.runs.replay.replay`) and exits 1 when the replay differs.
"""
from __future__ import annotations

import contextlib
import json
import sys

import click

from topo.runtime.episode_index import Index
from topo.runtime.episodes import Episode, find_run
from topo.errors import UsageError
from topo.runs.top import task_keys

COLUMNS = ("id", "subcollector", "worker", "task_id", "init_state", "group_id", "seed", "steps", "return", "success",
           "ended", "policy_versions")
HEADERS = ("episode", "sub", "worker", "task", "init", "group_id", "seed", "steps", "return", "success", "ended",
           "versions")


@click.group()
def runs():
    """Read a kept run (topo launch --report DIR, topo.collector(report_dir=DIR))."""


@runs.command("show")
@click.argument("run", type=click.Path(exists=True, file_okay=False))
@click.argument("episode", required=False)
@click.option("--task", callback=task_keys, help="Only episodes of this task: an id, or suite:id in a multi-suite plan.")
@click.option("--worker", type=int, help="Only episodes of this plan row (its global index).")
@click.option("--subcollector", type=int, help="Only episodes of this subcollector.")
@click.option("--version", type=int, help="Only episodes in which this policy version acted.")
@click.option("--min-return", type=float, help="Only episodes whose return is at least this.")
@click.option("--max-return", type=float, help="Only episodes whose return is at most this.")
@click.option("--success/--failure", default=None, help="Only episodes that succeeded (or did not).")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="At most N episodes (the first ones).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def show(run, episode, task, worker, subcollector, version, min_return, max_return, success, limit, fmt):
    """The episodes of RUN with their provenance (plan row, worker life, seed, init state, policy versions),
    filtered; with EPISODE (e.g. w5-r0-e12), that episode's whole record."""
    episodes = _episodes(run)
    if episode is not None:
        found = _one(episodes, episode)
        click.echo(json.dumps(_detail(found), indent=1))
        return
    recorded, total, chosen = episodes.select(task=task, worker=worker, subcollector=subcollector, version=version,
                                              min_return=min_return, max_return=max_return, success=success,
                                              limit=limit)
    if fmt == "json":
        click.echo(json.dumps([e.summary() for e in chosen], indent=1))
        return
    click.echo(f"run {episodes.run_dir}: {recorded} episodes recorded, {total} match"
               + (f", first {len(chosen)} shown" if len(chosen) < total else ""))
    if chosen:
        click.echo(table([e.summary() for e in chosen]))


@runs.command("trace")
@click.argument("run", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--out", default="trace.json", show_default=True, type=click.Path(dir_okay=False),
              help="Where to write the trace (-: stdout).")
def trace(run, out):
    """RUN as a timeline of Chrome trace events (open it in Perfetto or chrome://tracing): each worker's startup
    phases, episodes and close, each subcollector's batches, restarts, recycles, stalls, evaluation rounds."""
    from topo.runs.trace import write

    try:
        path = find_run(run)
    except FileNotFoundError as err:
        raise UsageError(str(err)) from None
    count = write(path, out)
    if out != "-":
        click.echo(f"{count} trace events of {path} written to {out}", err=True)


@click.command()
@click.argument("run", type=click.Path(exists=True, file_okay=False))
@click.argument("episode")
@click.option("--video", type=click.Path(dir_okay=False), default=None,
              help="Write the episode's frames: a PNG strip (.png) or an animated GIF (.gif).")
@click.option("--actions", "actions_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Replay these actions instead of the recorded ones (an .npz: one array per action key).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def replay(run, episode, video, actions_file, fmt):
    """Rebuild EPISODE of RUN from its plan row and seed state, replay its recorded actions, and check every
    step against the recording. Exit 0: identical; 1: it differs (the first differing step is named).
    Needs launch.record_actions: true."""
    from topo.runtime.episodes import arrays
    from topo.compiler.limits import MAX_STEPS_BYTES
    from topo.runs.replay import replay as run_replay

    actions = None if actions_file is None else arrays(actions_file, actions_file, MAX_STEPS_BYTES)
    with contextlib.redirect_stdout(sys.stderr):  # what the env prints as it is built (LIBERO does) is not the result
        result = run_replay(run, episode, actions=actions, video=video, actions_from=actions_file)
    click.echo(json.dumps(result.to_dict(), indent=1) if fmt == "json" else str(result))
    if result.video and fmt == "text":
        click.echo(f"frames: {result.video}")
    sys.exit(0 if result.identical else 1)


def _episodes(run: str) -> Index:
    try:
        return Index(find_run(run))
    except FileNotFoundError as err:
        raise UsageError(str(err)) from None


def _one(episodes: Index, episode: str) -> Episode:
    try:
        return episodes.get(episode)
    except (KeyError, ValueError) as err:
        raise UsageError(str(err).strip("'\"")) from None


def _detail(found: Episode) -> dict:
    start = {k: v for k, v in found.start.items() if k not in ("blobs", "event")}
    return {**found.summary(), "row": found.row, "start": start, "end": found.end,
            "steps_by_version": {("none" if v is None else str(v)): n for v, n in sorted(
                found.versions.items(), key=lambda item: -1 if item[0] is None else item[0])}}


def table(rows: list[dict]) -> str:
    """Episode summaries as aligned columns."""
    cells = [HEADERS] + [tuple(_cell(row[c]) for c in COLUMNS) for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(HEADERS))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    return str(value)
