"""What a seed state costs at each reset, pickled (before issue #35) and as plain data (now), side by side.

    python benchmarks/seed_state_codec.py                 # the toy env of provenance_cost.py
    python benchmarks/seed_state_codec.py --env libero    # real LIBERO (64 px, CPU)

One env, built here as its worker builds it (row 0 of provenance_cost.py's spec), reset ``--resets`` times
with a few random steps between; at each reset its seed state is taken once (:func:`seed_state`) and every
part encoded both ways, in alternating order: ``pickle`` (the old encoding, reproduced here: torch's state as
raw bytes, the rest ``pickle.dumps``) and ``data`` (:func:`topo.envs.recording.encode`). Per reset, medians in
microseconds: ``encode_us`` the encoding alone; ``record_us`` what the worker pays for the parts it records
(encode, digest, compress, base64: ``LifeWriter``), the figure the run feels; ``decode_us`` the decoding alone
(``pickle.loads`` against :func:`decode_seed_state`) and ``read_us`` with the inflating before it, what
``topo replay`` pays once per episode. A worker records a part only when it changed since its last reset, so
these are the most a reset can cost. ``bytes``: as written to the record (base64 of the compressed blob).
Results: ``benchmarks/results/seed_state_codec_<env>.json``.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import pickle
import statistics
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _old(name: str, value) -> bytes:
    return value.tobytes() if name == "torch" else pickle.dumps(value)


def _old_read(name: str, blob: bytes):
    import torch

    return torch.frombuffer(bytearray(blob), dtype=torch.uint8) if name == "torch" else pickle.loads(blob)


def build(env_name: str):
    import yaml

    import topo
    from provenance_cost import SPECS
    from topo.runtime.builder import import_builder

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(SPECS[env_name], f)
    plan = topo.load(f.name).to_dict()
    os.unlink(f.name)
    kwargs = plan["subcollectors"][0]["workers"][0]["kwargs"]
    render = {key: kwargs.get(key) for key in ("render_gpu", "render_numbering", "render_fallback")}
    env = import_builder(kwargs["builder"])(dict(kwargs["env"]), **render)
    env.set_seed(kwargs["seed"])
    return env


def measure(env_name: str, resets: int, steps: int) -> dict:
    from torchrl.envs.utils import step_mdp

    from topo.envs.recording import compressed, decode_seed_state, encode, seed_state, state_names
    from topo.runtime.episodes import blob_bytes

    env = build(env_name)
    env.reset()
    names = state_names(env)
    keys = ("encode_us", "record_us", "decode_us", "read_us", "bytes")
    per = {codec: {key: [] for key in keys} for codec in ("pickle", "data")}
    parts_bytes: dict[str, dict[str, int]] = {"pickle": {}, "data": {}}
    take_us = []
    for r in range(resets):
        started = time.perf_counter()
        state = seed_state(env, names)
        take_us.append((time.perf_counter() - started) * 1e6)
        for codec in ("pickle", "data") if r % 2 == 0 else ("data", "pickle"):
            write = _old if codec == "pickle" else encode
            started = time.perf_counter()
            blobs = {name: write(name, value) for name, value in state.items()}
            encoded = time.perf_counter()
            texts = {}
            for name, blob in blobs.items():  # as a worker records a part that changed (LifeWriter)
                hashlib.blake2b(blob, digest_size=16).hexdigest()
                texts[name] = base64.b64encode(compressed(blob)).decode()
            recorded = time.perf_counter()
            per[codec]["encode_us"].append((encoded - started) * 1e6)
            per[codec]["record_us"].append((recorded - started) * 1e6)
            parts_bytes[codec] = {name: len(text) for name, text in texts.items()}
            per[codec]["bytes"].append(sum(parts_bytes[codec].values()))
            started = time.perf_counter()
            read = {name: blob_bytes(text) for name, text in texts.items()}  # as replay reads them back
            inflated = time.perf_counter()
            if codec == "pickle":
                {name: _old_read(name, blob) for name, blob in read.items()}
            else:
                decode_seed_state(read)
            done = time.perf_counter()
            per[codec]["decode_us"].append((done - inflated) * 1e6)
            per[codec]["read_us"].append((done - started) * 1e6)
        td = env.reset()
        for _ in range(steps):
            td = env.rand_step(td)
            if bool(td["next", "done"].any()):
                break
            td = step_mdp(td)
    env.close()
    summary = {codec: {**{key + "_median": round(statistics.median(v[key]), 1) for key in keys},
                       "bytes_by_part": parts_bytes[codec]} for codec, v in per.items()}
    summary["ratio_data_over_pickle"] = {
        key: round(summary["data"][key + "_median"] / summary["pickle"][key + "_median"], 3) for key in keys}
    return {"take_seed_state_us_median": round(statistics.median(take_us), 1), **summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", choices=("toy", "libero"), default="toy")
    parser.add_argument("--resets", type=int, default=None, help="default: toy 2000, libero 100")
    parser.add_argument("--steps", type=int, default=2, help="random steps between resets")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    resets = args.resets or {"toy": 2000, "libero": 100}[args.env]
    result = measure(args.env, resets, args.steps)
    out = {"what": __doc__.split("\n\n")[0], "env": args.env, "resets": resets, "cores": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d"), **result}
    path = args.out or os.path.join(HERE, "results", f"seed_state_codec_{args.env}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
