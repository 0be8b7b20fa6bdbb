"""What makes two runs of an evaluation's episodes differ, measured: the same spec evaluated in separate processes
under each way of starting its eval workers, and with another count of eval workers, each run's episodes
compared with the first's (outcome, length, observation checksum).

    python benchmarks/eval_reproduce.py            # toy (TinyVLA, examples/toy_eval.yaml) and real LIBERO
    python benchmarks/eval_reproduce.py --toy-only

Each case is ``topo eval`` in a fresh process with a certificate (``--certificate``); the cases: the spec as written
(forkserver with preload, topo's default), ``spawn``, the same again (a second process), and the eval workers
per eval subcollector changed (the policy's CPU forward then sees another batch size). Results:
``benchmarks/results/eval_reproduce.json``: per backend and case, the episodes that differ from the first case's and
the first field that does.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SPECS = {"toy": "examples/toy_eval.yaml", "libero": "examples/libero_cpu_eval.yaml"}
CASES = {"forkserver": {}, "spawn": {"topology": {"start_method": {"workers": "spawn"}}},
         "forkserver again": {}, "one eval worker": {"eval": {"workers": 1}}}


def merged(base: dict, change: dict) -> dict:
    out = dict(base)
    for key, value in change.items():
        out[key] = merged(base.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def run(spec: dict, folder: str, name: str) -> list[dict]:
    path = os.path.join(folder, f"{name.replace(' ', '_')}.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(spec, handle, sort_keys=False)
    cert = os.path.join(folder, f"{name.replace(' ', '_')}.json")
    done = subprocess.run([sys.executable, "-m", "topo", "eval", path, "--quiet", "--certificate", cert], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "MUJOCO_GL": "egl"}, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}")
    with open(cert) as handle:
        return json.load(handle)["runs"][0]["episodes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--toy-only", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from topo.launch.evaluation.certificate import first_difference

    out = {"command": "python benchmarks/eval_reproduce.py" + (" --toy-only" if args.toy_only else ""), "backends": {}}
    for backend, file in SPECS.items():
        if backend == "libero" and args.toy_only:
            continue
        with open(os.path.join(ROOT, file)) as handle:
            base = yaml.safe_load(handle)
        with tempfile.TemporaryDirectory() as folder:
            first, cases = None, {}
            for name, change in CASES.items():
                got = run(merged(base, change), folder, name)
                first = first or got
                differ = {e["episode"]: first_difference(e, g) for e, g in zip(first, got)
                          if first_difference(e, g) is not None}
                cases[name] = {"episodes": len(got), "differ": len(differ),
                               "first": next(iter(differ.items()), None)}
                print(backend, name, cases[name], flush=True)
        out["backends"][backend] = {"spec": file, "cases": cases}
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "eval_reproduce.json"), "w") as handle:
        json.dump(out, handle, indent=1)
        handle.write("\n")


if __name__ == "__main__":
    main()
