"""Episode records that stay small and fast: bytes per episode, and ``topo runs show`` on a million episodes.

    python benchmarks/records.py                          # 320 worker lives x 3125 episodes (needs ~6 GB of disk)
    python benchmarks/records.py --lives 32 --episodes 625 --out /tmp/records.json   # a quick try

1. Bytes per episode of a real toy run (2 x 2 ToyVLAEnv workers, TinyVLA, 16-step episodes), as written now (seed-state
   blobs as zlib streams where shorter) and as the previous writer wrote them (the same records with every blob
   inflated back: plain base64), and what the index adds.
2. A generated record set in the exact format workers write: one life recorded by :func:`topo.envs.recording.wrap`
   on a real toy env (random actions, a reset every 16 steps), copied to every plan row of a 10 x 32 toy plan under
   that row's episode ids, and each subcollector's policy versions (an episode spans 2 batches, a new version
   every 10 batches).
3. ``topo runs show`` as a process, on the set: the first query (it makes the index: the one-time cost), then each
   filter and one EPISODE lookup, ``--repeats`` times (median); beside it the previous reader (every record read:
   :class:`topo.runtime.episodes.Episodes`, what ``runs show`` ran before) on the ``--old-lives`` first lives
   only (it holds every record in memory: a million would take ~6 GB), with its time per episode scaled.

Results: ``benchmarks/results/records.json``.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SUBCOLLECTORS = 10
QUERIES = {"task": ["--task", "3", "--limit", "20"], "worker": ["--worker", "17", "--limit", "20"],
           "version": ["--version", "5", "--limit", "20"], "min_return": ["--min-return", "-20", "--limit", "20"],
           "failure": ["--failure", "--limit", "20"], "all": ["--limit", "20"]}
OLD = """import sys, json
from topo.runtime.episodes import Episodes
from topo.runs.command import table
episodes = Episodes(sys.argv[1])
if len(sys.argv) > 2:
    print(json.dumps(episodes.get(sys.argv[2]).summary()))
else:
    chosen = episodes.select(task=3)
    print(len(episodes), len(chosen)); print(table([e.summary() for e in chosen[:20]]))
"""


def folder_bytes(folder: str, index: bool = False) -> int:
    where = os.path.join(folder, ".index") if index else folder
    return sum(os.path.getsize(os.path.join(where, n)) for n in os.listdir(where) if n.endswith((".jsonl", ".idx")))


def inflated(line: bytes) -> bytes:
    """A start line as the previous writer wrote it: its blobs plain base64."""
    from topo.runtime.episodes import blob_bytes

    record = json.loads(line)
    if "blobs" in record:
        record["blobs"] = {k: base64.b64encode(blob_bytes(v)).decode() for k, v in record["blobs"].items()}
    return (json.dumps(record) + "\n").encode()


def real_toy(batches: int) -> dict:
    """A real toy run's records: bytes per episode now, before, and of the index."""
    out = subprocess.run([sys.executable, __file__, "--toy-run", str(batches)], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def toy_run(batches: int) -> None:
    import yaml

    import topo
    from provenance_cost import SPECS
    from topo.runtime.episode_index import Index

    with tempfile.TemporaryDirectory() as tmp:
        spec = os.path.join(tmp, "toy.yaml")
        with open(spec, "w") as f:
            yaml.safe_dump(SPECS["toy"], f)
        plan = topo.load(spec)
        policy = plan.make_policy()
        with topo.collector(plan, policy=policy, progress=False, report_dir=tmp, max_frames_per_traj=16) as run:
            for _, _ in zip(range(batches), run.collector):
                run.update_weights()
        folder = run.report["episodes"]["folder"]
        episodes = run.report["episodes"]["recorded"]
        now = folder_bytes(folder)
        before = now
        for name in os.listdir(folder):
            if not name.startswith("versions."):
                with open(os.path.join(folder, name), "rb") as f:
                    lines = f.readlines()
                before += sum(len(inflated(line)) - len(line) for line in lines if line.startswith(b'{"event": "start"'))
        Index(folder[:-len("/episodes")]).select(limit=1)
        print(json.dumps({"episodes": episodes, "bytes_per_episode_before": round(before / episodes),
                          "bytes_per_episode_now": round(now / episodes),
                          "index_bytes_per_episode": round(folder_bytes(folder, index=True) / episodes)}))


def template(per_life: int) -> list[bytes]:
    """One worker life's records as :func:`~topo.envs.recording.wrap` writes them on a real toy env: its lines."""
    import torch
    from torchrl.envs.utils import step_mdp

    from topo.envs.recording import wrap
    from topo.envs.toy import build

    with tempfile.TemporaryDirectory() as tmp:
        env = build({"success_steps": 4, "state_dim": 8, "instruction": "lift the block"})
        env.set_seed(0)
        env = wrap(env, tmp, {"subcollector": 0, "index": 0, "global_index": 0}, 0, 0, False)
        gen = torch.Generator().manual_seed(0)
        td = env.reset()
        for e in range(per_life):
            for _ in range(16):
                td["action"] = torch.rand(4, generator=gen) * 2 - 1
                td = step_mdp(env.step(td))
                if td["done"].any():
                    break
            if e + 1 < per_life:
                td = env.reset()
        env.close()
        with open(os.path.join(tmp, "episodes", "w0.r0.jsonl"), "rb") as f:
            return f.readlines()


def generate(run_dir: str, lives: int, per_life: int, lines: list[bytes]) -> None:
    """``lives`` worker lives of ``per_life`` episodes each (the template's, under each row's ids), versions, a plan."""
    import yaml

    import topo
    from topo.runtime.episodes import EpisodeId, versions_file

    spec = {"version": 1, "name": "records", "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
            "topology": {"subcollectors": SUBCOLLECTORS, "workers_per_subcollector": lives // SUBCOLLECTORS},
            "assignment": {"tasks": "0-7", "seeds": {"base": 0}}}
    os.makedirs(os.path.join(run_dir, "episodes"))
    with open(os.path.join(run_dir, "spec.yaml"), "w") as f:
        yaml.safe_dump(spec, f)
    plan = topo.load(os.path.join(run_dir, "spec.yaml")).to_dict()
    with open(os.path.join(run_dir, "launch.json"), "w") as f:
        json.dump({"plan": plan}, f)
    ids = re.compile(rb'"id": (\d+)')
    for row in range(lives):
        base = int(EpisodeId(row, 0, 0))
        with open(os.path.join(run_dir, "episodes", f"w{row}.r0.jsonl"), "wb") as f:
            f.writelines(ids.sub(lambda m: b'"id": %d' % (base + int(m[1])), line, 1) for line in lines)
    per_sub = lives // SUBCOLLECTORS
    for sub in range(SUBCOLLECTORS):
        with open(versions_file(run_dir, sub, 0), "w") as f:
            for batch in range(2 * per_life):
                pairs = [[int(EpisodeId(sub * per_sub + w, 0, batch // 2)), batch // 10, 8] for w in range(per_sub)]
                f.write(json.dumps({"batch": batch + 1, "time": time.time(), "pairs": pairs}) + "\n")


def timed(args: list[str], repeats: int = 1) -> tuple[float, str]:
    """Median seconds of a process, and its output."""
    times, out = [], ""
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": ROOT})
        times.append(time.perf_counter() - started)
        if done.returncode:
            raise SystemExit(f"{args}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        out = done.stdout
    return round(statistics.median(times), 3), out


def show(run_dir: str, *extra: str, repeats: int = 1) -> tuple[float, str]:
    return timed(["-m", "topo", "runs", "show", run_dir, *extra], repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lives", type=int, default=320)
    parser.add_argument("--episodes", type=int, default=3125, help="per worker life")
    parser.add_argument("--old-lives", type=int, default=10, help="lives the previous reader reads (all in memory)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=40, help="of the real toy run")
    parser.add_argument("--dir", default=None, help="where to write the record set (default: a temp dir, removed)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "records.json"))
    parser.add_argument("--toy-run", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.toy_run is not None:
        sys.path.insert(0, HERE)
        return toy_run(args.toy_run)
    result = {"what": __doc__.split("\n\n")[0], "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
              "real_toy_run": real_toy(args.batches)}
    print("real toy run:", result["real_toy_run"], flush=True)
    root = tempfile.mkdtemp(prefix="topo-records-", dir=args.dir)
    try:
        started = time.perf_counter()
        lines = template(args.episodes)
        runs = {"all": os.path.join(root, "topo-run-all"), "old": os.path.join(root, "topo-run-old")}
        generate(runs["all"], args.lives, args.episodes, lines)
        generate(runs["old"], args.old_lives, args.episodes, lines)
        n, n_old = args.lives * args.episodes, args.old_lives * args.episodes
        folder = os.path.join(runs["all"], "episodes")
        result["generated"] = {"episodes": n, "worker_lives": args.lives, "episodes_per_life": args.episodes,
                               "seconds": round(time.perf_counter() - started, 1),
                               "records_bytes_per_episode": round(folder_bytes(folder) / n)}
        print("generated:", result["generated"], flush=True)
        first, _ = show(runs["all"], *QUERIES["task"])
        result["generated"]["index_bytes_per_episode"] = round(folder_bytes(folder, index=True) / n)
        new = {"index_build_s": first}
        for name, query in QUERIES.items():
            new[name + "_s"], out = show(runs["all"], *query, repeats=args.repeats)
            print(name, new[name + "_s"], out.splitlines()[0], flush=True)
        new["episode_s"], _ = show(runs["all"], "w17-r0-e3000" if args.episodes > 3000 else "w17-r0-e1",
                                   repeats=args.repeats)
        small = {"index_build_s": show(runs["old"], *QUERIES["task"])[0]}
        small["task_s"] = show(runs["old"], *QUERIES["task"], repeats=args.repeats)[0]
        small["episode_s"] = show(runs["old"], "w7-r0-e1", repeats=args.repeats)[0]
        old = {"task_s": timed(["-c", OLD, runs["old"]], args.repeats)[0],
               "episode_s": timed(["-c", OLD, runs["old"], "w7-r0-e1"], args.repeats)[0]}
        per = lambda s: s / n_old  # noqa: E731
        result["runs_show"] = {
            "episodes": n, "index": new,
            "side_by_side": {"episodes": n_old, "index": small, "previous_reader": old,
                             "ratio_previous_over_index": {k: round(old[k] / small[k], 1) for k in old}},
            "previous_reader_scaled_to_all_s": {k: round(per(v) * n, 1) for k, v in old.items()}}
        print(json.dumps(result["runs_show"], indent=1), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
