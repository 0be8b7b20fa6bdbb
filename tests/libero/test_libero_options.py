"""topo's LIBERO builder options on real LIBERO (task 0, 64 px): the model cache hit, missed, corrupt and
off, and renders skipped, give observations bit-identical to torchrl's own LiberoEnv; a soft reset with
the gripper reset starts every episode like a hard reset, and without it does not; workers with other
seeds start bit-identical from one init state with fixtures_by_init_state, and without it do not. Those three
scenarios run one after the other in one fresh process (its GL; LIBERO's imports paid once), each a function of
its own whose outcome its own test checks; the cache commands run in processes of their own. ~2 GB, 30-60 s each."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests import preimported
from tests.libero.libero_helpers import ROOT, needs_libero, run_python

pytestmark = [pytest.mark.libero, needs_libero]

COMMON = """
    import json, sys
    import numpy as np
    import torch
    import topo.envs.libero as L

    ENV = {"task_suite": "libero_spatial", "task_id": 0, "camera_height": 64, "camera_width": 64,
           "max_episode_steps": 64, "init_state_mode": "fixed", "init_state_id": 0}
    # the options that keep LiberoEnv's output; fixtures_by_init_state changes the fixtures on purpose
    ON = {"model_cache": True, "skip_unread_renders": True, "reset_gripper": True, "fixtures_by_init_state": False}
    g = torch.Generator().manual_seed(0)
    # gripper closing; 4 steps (each ~0.2 s on a CPU, in 12 episodes) already leave the gripper command that a soft
    # reset without reset_gripper carries into the next episode (test_soft_resets_... asserts that it does)
    ACTIONS = [torch.cat([torch.rand(6, generator=g) * 2 - 1, torch.ones(1)]) for _ in range(4)]

    def snapshot(env, td, prefix=()):
        sim = env._env.env.sim
        return [td[prefix + ("observation", "image")].numpy().copy(), td[prefix + ("observation", "state")].numpy().copy(),
                sim.data.qpos.copy(), sim.data.qvel.copy()]

    def episode(env):
        td = env.reset()
        out = snapshot(env, td)
        for action in ACTIONS:
            td = env.step(td.set("action", action))
            out += snapshot(env, td, ("next",))
            td = td["next"]
        return out

    def same(a, b):
        return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
"""


SCENARIOS = """
    def cache_states(cache):
        L.configure_rendering(None)
        L.prepare_libero()
        from torchrl.envs import LiberoEnv

        plain = LiberoEnv(**ENV, env_kwargs={"hard_reset": False}, init_states=L.load_init_states("libero_spatial", 0))
        plain.set_seed(7)
        reference = episode(plain)
        reference_xml = plain._env.env.sim.model.get_xml()
        plain.close()

        def corrupt():
            import pathlib
            [binary] = pathlib.Path(cache).glob("*.mjb")
            binary.write_bytes(binary.read_bytes()[:1000])

        results = {}
        for name, options, before in (("miss", {**ON, "model_cache": cache}, None),
                                      ("hit", {**ON, "model_cache": cache}, None),
                                      ("corrupt", {**ON, "model_cache": cache}, corrupt),
                                      ("off", {**ON, "model_cache": False}, None),
                                      ("renders", {**ON, "model_cache": False, "skip_unread_renders": False}, None)):
            if before:
                before()
            env = L.build({**ENV, "env_kwargs": {"hard_reset": False}, "options": options})
            env.set_seed(7)
            trace = episode(env)
            cache_state = env.topo_model_cache
            results[name] = {"same": same(reference, trace), "renders": dict(env.topo_renders),
                             "cache": cache_state and cache_state["construction"][0]["result"],
                             "xml": env._env.env.sim.model.get_xml() == reference_xml if name == "hit" else None}
            env.close()
        return results

    def soft_resets():
        runs = {}
        for name, hard, options in (("hard", True, ON), ("soft", False, ON),
                                    ("soft_unfixed", False, {**ON, "reset_gripper": False})):
            env = L.build({**ENV, "env_kwargs": {"hard_reset": hard}, "options": options})
            env.set_seed(3)
            runs[name] = [episode(env), episode(env)]
            resets = env.topo_model_cache["resets"]
            env.close()
            if hard:
                hard_resets = resets
        hard, soft, unfixed = runs["hard"], runs["soft"], runs["soft_unfixed"]
        return {
            "soft": [same(hard[0], soft[0]), same(hard[1], soft[1])],
            "unfixed": [same(hard[0], unfixed[0]), same(hard[1], unfixed[1])],
            "unfixed_qpos_gap": float(np.abs(hard[1][2] - unfixed[1][2]).max()),
            "hard_resets": hard_resets,
        }

    def group_starts():
        def starts(seed, options, init_state=0):
            env = L.build({**ENV, "init_state_id": init_state, "env_kwargs": {"hard_reset": False}, "options": options})
            env.set_seed(seed)
            stream = np.random.get_state()[1].copy()
            g = torch.Generator().manual_seed(seed)
            out = []
            for _ in range(2):
                td = env.reset()
                model = env._env.env.sim.model
                out.append(snapshot(env, td) + [model.body_pos.copy(), model.body_quat.copy()])
                for _ in range(2):  # acting differently in between: the next start must not show it
                    td = env.step(td.set("action", torch.rand(7, generator=g) * 2 - 1))["next"]
            untouched = bool(np.array_equal(stream, np.random.get_state()[1]))  # the worker's own numpy stream
            env.close()
            return out, untouched

        FAIR = {**ON, "fixtures_by_init_state": True}
        (a, a_stream), (b, b_stream) = starts(0, FAIR), starts(1, FAIR)
        (c, _), (d, d_stream) = starts(0, ON), starts(1, ON)
        (e, _) = starts(0, FAIR, init_state=1)
        names = ["image", "state", "qpos", "qvel", "body_pos", "body_quat"]
        differ = lambda x, y: [n for n, u, v in zip(names, x, y) if not np.array_equal(u, v)]
        return {
            "on": [differ(x, y) for x, y in zip(a, b)],
            "on_repeat": differ(a[0], a[1]),
            "off": [differ(x, y) for x, y in zip(c, d)],
            "off_body_gap_m": float(np.abs(c[0][4] - d[0][4]).max()),
            "other_init_state": differ(a[0], e[0]),
            "streams": [a_stream, b_stream, d_stream],
        }

    import traceback
    outcomes = {}
    for name, scenario, args in (("cache", cache_states, (CACHE,)), ("soft", soft_resets, ()),
                                 ("groups", group_starts, ())):
        try:
            outcomes[name] = {"out": scenario(*args)}
        except Exception:  # the next scenario still runs; this one's test shows the traceback
            outcomes[name] = {"error": traceback.format_exc()}
    print(json.dumps(outcomes))
"""


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """The three scenarios' outcomes, from one process: {name: {"out": ...} or {"error": traceback}}."""
    cache = tmp_path_factory.mktemp("options") / "cache"
    proc = run_python(COMMON + f"\n    CACHE = {str(cache)!r}\n" + SCENARIOS, timeout=900)
    shutil.rmtree(cache, ignore_errors=True)  # 262 MB: pytest keeps the temporary directories of recent sessions
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def outcome(scenarios: dict, name: str) -> dict:
    assert "error" not in scenarios[name], scenarios[name]["error"]
    return scenarios[name]["out"]


def test_cache_states_and_skipped_renders_are_bit_identical_to_libero_env(scenarios):
    out = outcome(scenarios, "cache")
    assert {name: r["same"] for name, r in out.items()} == dict.fromkeys(out, True)
    assert {name: r["cache"] for name, r in out.items()} == {
        "miss": "miss", "hit": "hit", "corrupt": "corrupt", "off": None, "renders": None}
    assert out["hit"]["xml"] is True  # a loaded model still answers get_xml() as a compiled one
    # 2 cameras: construction's 2 frames each, and 11 of the reset's 12 each (env reset, init state, 10 settle
    # steps): only the last settle step is rendered
    assert out["hit"]["renders"] == {"made": 2, "skipped": 2 * 2 + 2 * 11}
    assert out["renders"]["renders"] == {}


def test_soft_resets_start_like_hard_resets_only_with_the_gripper_reset(scenarios):
    """Two episodes from one init state, the first closing the gripper: soft reset vs hard reset."""
    out = outcome(scenarios, "soft")
    assert out["soft"] == [True, True]
    assert out["unfixed"] == [True, False] and out["unfixed_qpos_gap"] > 0
    assert out["hard_resets"] == {"hit": 2}  # each episode's hard reset loads the model


def test_group_members_start_identically_only_with_fixtures_by_init_state(scenarios):
    """Workers of one GRPO group: one task and init state, their own seeds. Each runs two episodes from the
    init state, acting differently in between; every start is compared, fixtures (body_pos/quat) included."""
    out = outcome(scenarios, "groups")
    assert out["on"] == [[], []]  # bit-identical starts, both episodes, whatever each did in between
    assert out["on_repeat"] == []  # every start from one init state is the same start
    assert "body_pos" in out["off"][0] and out["off_body_gap_m"] > 1e-3
    assert "body_pos" in out["other_init_state"]  # other init states still get other fixtures
    assert out["streams"] == [True, True, False]  # resets no longer draw from the worker's seeded stream


def two_task_spec(tmp_path, suite: str, workers: int):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""version: 1
env:
  backend: libero
  kwargs: {{task_suite: {suite}, camera_height: 64, camera_width: 64, env_kwargs: {{hard_reset: false}}}}
topology: {{subcollectors: 1, workers_per_subcollector: {workers}}}
assignment: {{tasks: 0-1}}
""")
    return spec


def topo(*args):
    return preimported.run([sys.executable, "-m", "topo.cli", "cache", *map(str, args)], capture_output=True, text=True,
                           timeout=600, cwd=ROOT, stdin=subprocess.DEVNULL)


def test_cache_warm_compiles_each_task_once_and_builds_hit(tmp_path):
    """Over 30 s: two real MuJoCo compiles of libero_object scenes, then four topo processes that
    each import LIBERO (warm again, list, a build that hits, clear): the whole cache life on real models."""
    spec = two_task_spec(tmp_path, "libero_object", 4)  # libero_object's tasks have scenes of their own
    cache = tmp_path / "cache"  # (libero_spatial's ten share one model)
    first = topo("warm", str(spec), "--dir", str(cache))
    assert first.returncode == 0, first.stderr[-3000:]
    lines = first.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["libero_object task 0", "libero_object task 1"]
    assert all("compiled in" in line for line in lines[:2]) and lines[2] == "2 of 2 model(s) ready"
    again = topo("warm", str(spec), "--dir", str(cache))
    assert again.returncode == 0 and again.stdout.count("cached already") == 2
    listing = topo("list", "--dir", str(cache))
    assert listing.stdout.count("libero_object task") == 2 and "2 entries" in listing.stdout
    built = run_python(f"""
        import json
        import topo.envs.libero as L
        env = L.build({{"task_suite": "libero_object", "task_id": 1, "camera_height": 64, "camera_width": 64,
                        "env_kwargs": {{"hard_reset": False}}, "options": {{"model_cache": {str(cache)!r}}}}})
        print(json.dumps(env.topo_model_cache["construction"]))
        env.close()
    """)
    assert built.returncode == 0, built.stderr[-3000:]
    [event] = json.loads(built.stdout.strip().splitlines()[-1])
    assert event["result"] == "hit"
    cleared = topo("clear", "--dir", str(cache))
    assert cleared.returncode == 0 and cleared.stdout.startswith("removed 6 file(s)")
    assert os.listdir(cache) == []


def test_cache_warm_first_worker_builds_resets_and_steps_one_worker(tmp_path):
    spec = two_task_spec(tmp_path, "libero_spatial", 2)
    cache = tmp_path / "cache"
    done = topo("warm", spec, "--dir", cache, "--first-worker")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "cached already" in lines[1] and lines[2] == "2 of 2 model(s) ready"  # one scene for both tasks
    assert lines[3].startswith("first worker (libero_spatial task 0): built in ") and "reset and stepped" in lines[3]
