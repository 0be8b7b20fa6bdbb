"""``topo top [RUN]``: a running topology from another terminal, one line per worker (:mod:`topo.runtime.live`), torch-free.

``RUN`` is a run directory (``topo-run-*``), or a report directory holding one (the latest); without it, the
latest run directory in the temporary folder (where a run without ``--report`` lives). It refreshes every
``--interval`` seconds until the run ends (Ctrl-C leaves); ``--once`` prints one view, ``--format json`` as JSON.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tempfile
import time

import click

from topo.runtime.episodes import find_run
from topo.diagnostics import task_order
from topo.errors import UsageError
from topo.runtime.live import STATES, Reader, View, view
from topo.runtime.stall import cut

def task_keys(ctx, param, value):
    """``--task`` as a plan's task keys: ``3`` an id, ``libero_goal:3`` a multi-suite plan's key."""
    def key(text: str) -> int | str:
        return int(text) if text.isdigit() else text

    return None if value is None else tuple(map(key, value)) if isinstance(value, tuple) else key(value)


SORTS = {"row": lambda r: (r["global_index"] or 0,), "subcollector": lambda r: (r["subcollector"], r["worker"]),
         "task": lambda r: (task_order(r["task_id"]), r["global_index"] or 0),
         "state": lambda r: (STATES.index(r["state"]), r["global_index"] or 0),
         "rate": lambda r: (r["step_rate"] is None, r["step_rate"] or 0.0),
         "age": lambda r: (-(r["heartbeat_age_s"] or 0.0),), "rss": lambda r: (-(r["rss_mb"] or 0.0),)}
COLUMNS = (("row", "global_index"), ("sub", "subcollector"), ("w", "worker"), ("node", "node"), ("task", "task_id"),
           ("instruction", "instruction"), ("state", "state"), ("episode", "episode"), ("ep.steps", "episode_steps"),
           ("steps/s", "step_rate"), ("beat", "heartbeat_age_s"), ("rss MB", "rss_mb"), ("drift", "drift"),
           ("restarts", "restarts"), ("recycles", "recycles"), ("version", "policy_version"))


@click.command()
@click.argument("run", required=False, type=click.Path(exists=True, file_okay=False))
@click.option("--once", is_flag=True, help="Print one view and exit.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True, help="Seconds between refreshes.")
@click.option("--sort", type=click.Choice(sorted(SORTS)), default="row", show_default=True)
@click.option("--subcollector", type=int, multiple=True, help="Only this subcollector's workers (repeatable).")
@click.option("--task", multiple=True, callback=task_keys,
              help="Only workers of this task: an id, or suite:id in a multi-suite plan (repeatable).")
@click.option("--state", type=click.Choice(STATES), multiple=True, help="Only workers in this state (repeatable).")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="At most N rows (needs-attention first, always).")
@click.option("--hung-after", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds in one step that make a worker hung (default: half of launch.hang_timeout, else 60).")
def top(run, once, fmt, interval, sort, subcollector, task, state, limit, hung_after):
    """A live view of a running topology: a header (frames/s, batches, evaluations, restarts), what needs
    attention (hung, dead, drifting, near a budget; a stall), then one line per worker: its plan row, state,
    episode in flight, step rate, heartbeat age, RSS, restarts and policy version."""
    path = locate(run)
    reader = Reader(path)
    previous: View | None = None
    try:
        while True:
            try:
                snap = reader.read()
            except OSError:
                if os.path.isdir(path):
                    raise
            if not os.path.isdir(path):  # removed while (or before) it was read
                click.echo(f"run {path} ended: its directory was removed (a run without --report keeps none)")
                return
            current = view(snap, previous, hung_after)
            shown = select(current, subcollector, task, state, sort, limit)
            if fmt == "json":
                click.echo(json.dumps(shown, indent=None if not once else 1))
            else:
                width = shutil.get_terminal_size((160, 40)).columns
                text = render(shown, width)
                redraw = sys.stdout.isatty() and not once
                click.echo(("\x1b[H\x1b[2J" if redraw else "") + text + ("" if redraw or once else "\n"))
            if once or not current.header["running"]:
                return
            previous = current
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def locate(run: str | None) -> str:
    """The run directory to watch: ``run`` (or the latest one it holds), else the latest in the temporary folder."""
    if run is None:
        found = sorted(glob.glob(os.path.join(tempfile.gettempdir(), "topo-run-*", "launch.json")), key=os.path.getmtime)
        if not found:
            raise UsageError(f"no run directory in {tempfile.gettempdir()} (topo-run-*): name one, or the --report "
                             "directory of a run")
        return os.path.dirname(found[-1])
    try:
        return find_run(run)
    except FileNotFoundError as err:
        raise UsageError(str(err)) from None


def select(v: View, subcollectors, tasks, states, sort: str, limit: int | None) -> dict:
    """The view as JSON, its rows (and attention list) filtered, sorted and cut to ``limit``."""
    def keep(r: dict) -> bool:
        return ((not subcollectors or r["subcollector"] in subcollectors) and (not tasks or r["task_id"] in tasks)
                and (not states or r["state"] in states))

    rows = sorted((r for r in v.rows if keep(r)), key=SORTS[sort])
    return {**v.to_dict(), "attention": [r for r in v.attention if keep(r)],
            "rows": rows[:limit] if limit is not None else rows, "matching": len(rows)}


def render(shown: dict, width: int = 160) -> str:
    """The header, the stall, what needs attention, and the rows as aligned columns."""
    h = shown["header"]
    status = "running" if h["running"] else ("ended ok" if h["ok"] else f"ended: {cut(h['error'] or 'failed', 80)}")
    states = ", ".join(f"{n} {s}" for s, n in h["states"].items())
    fps = f"{h['frames_per_s']:.1f} frames/s" if h["frames_per_s"] is not None else "- frames/s"
    lines = [f"topo top  {h['name']}  {h['run_dir']}",
             f"{status} {h['elapsed_s']:.0f}s | {h['workers']} workers: {states} | {fps}, {h['frames']} frames, "
             f"{h['batches']} batches | policy version {_cell(h['policy_version'])} | {h['restarts']} restarts, "
             f"{h['recycles']} recycles | {h['evaluations']} evaluations" + _last_eval(h["last_eval"])]
    if h.get("breakdown"):
        lines.append(f"time breakdown: {cut(json.dumps(h['breakdown']), width - 16)}")
    if shown["stall"]:
        lines.append(f"STALLED: {cut(shown['stall']['message'], width - 9)}")
    if shown["attention"]:
        lines.append(f"needs attention ({len(shown['attention'])}):")
        lines += [f"  {', '.join(r['attention']):<14} sub{r['subcollector']}/w{r['worker']} row {r['global_index']} "
                  f"{r['state']} pid {_cell(r['pid'])} beat {_cell(r['heartbeat_age_s'])}s"
                  + (f" step running {r['step_s']:.1f}s" if r["step_s"] else "")
                  + (f" drift {r['drift']:.2f}" if r["drift"] else "") for r in shown["attention"][:20]]
        if len(shown["attention"]) > 20:
            lines.append(f"  ... and {len(shown['attention']) - 20} more")
    cells = [tuple(name for name, _ in COLUMNS)]
    cells += [tuple(_cell(cut(r[key], 24) if key == "instruction" and r[key] else r[key]) for _, key in COLUMNS)
              for r in shown["rows"]]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip()[:width] for c in cells]
    if shown["matching"] > len(shown["rows"]):
        lines.append(f"... {shown['matching'] - len(shown['rows'])} more rows (--limit)")
    return "\n".join(lines)


def _last_eval(last: dict | None) -> str:
    if not last:
        return ""
    return f" (round {last['round']}: success {_cell(last['success_rate'])})"


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)
