"""``topo import vla-grpo``: a config in the recipe's format, imported, compiles to the recipe's assignment row
by row; every key is accounted for; bad input exits 2 with located diagnostics.

Expectations come from the recipe's own formulas written out here on the config's keys (its utils.py:
``_libero_worker_assignment``, ``_training_group_repeats``, ``_render_gpu_for_subcollector``,
``_make_env_worker``), never from topo.compiler.assign.
"""
from __future__ import annotations

import copy
import re
from collections import Counter

import pytest
import yaml
from click.testing import CliRunner

from tests.compiler.compiler_helpers import EXAMPLES, SPATIAL, assert_layout, rows

import topo
from topo.cli import main
from topo.importers.hydra import parse_value, resolve
from topo.importers.vla_grpo import task_text

# torchrl's sota-implementations/vla_grpo/config/vla_grpo_libero.yaml as committed: its keys, in its order,
# with its values (its comments left out)
COMMITTED = """\
env:
  backend: libero
  task_suite: libero_spatial
  task_ids: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
  num_envs: 80
  parallel_group_repeats: true
  eval_num_envs: 10
  camera_height: 256
  camera_width: 256
  render_backend: egl
  render_gpu_ids: [2, 3, 4, 5]
  eval_render_gpu_ids: [7]
  render_gpu_device_zero_fallback: true
  env_kwargs: null
  chunk_size: 8
  max_env_steps: 512
  max_outer_steps: 64
  train_init_state_mode: cycle
  train_init_state_id: 0
  seed: 0
tokenizer:
  vocab_size: 256
policy:
  backend: openvla
  mode: tokens
  checkpoint: Haozhan72/Openvla-oft-SFT-libero-spatial-traj1
  unnorm_key: libero_spatial_no_noops
  dataset_statistics: moojink/openvla-7b-oft-finetuned-libero-spatial
  dtype: bfloat16
  temperature: 1.6
  top_k: null
  use_wrist_image: false
  action_head_file: action_head--150000_checkpoint.pt
  proprio_projector_file: proprio_projector--150000_checkpoint.pt
  use_proprio: false
  num_images_in_input: 1
  center_crop: true
  image_backend: torch_reference
  gripper_binarize: true
  gripper_binarize_threshold: 0.0
  gripper_invert: true
  lora_rank: 32
  lora_target_modules: [q_proj, k_proj, v_proj, o_proj]
  device: cuda:0
collector:
  group_size: 8
  candidate_group_size: null
  groups_per_iter: 40
  min_replay_decisions: null
  total_iters: 100
  policy_device: cuda:1
  policy_micro_batch_size: null
  replay_wait_s: 0.5
  replay_log_s: 30.0
  num_collectors: 4
  envs_per_collector: 80
  num_threads: 1
  server_max_batch_size: 1
  server_min_batch_size: 1
  server_timeout: 0.001
  server_collect_stats: true
  server_stats_window_size: 1024
  max_inflight_per_env: 1
  env_sub_threads: 1
  storing_device: cpu
  use_buffers: null
advantage:
  trajectory_return: sum
  keep_return_bounds: [0.1, 0.9]
  candidate_selection: balanced
  candidate_selection_min_size: null
  candidate_selection_max_combinations: 100000
buffer:
  device: cpu
  shared_init: true
  capacity_group_waves: 7
  consume_after_n_samples: 1
loss:
  clip_epsilon: [0.2, 0.28]
  ratio_level: token
  mini_batch_size: 16
  accumulate_batches: 8
optim:
  lr: 5e-6
  weight_decay: 0.0
  warmup_updates: 10
  max_grad_norm: 1.0
train:
  weight_sync_trainable_only: true
logger:
  backend: wandb
  service_backend: process
  project_name: torchrl-sota-vla-grpo
  group_name: null
  exp_name: vla_grpo_libero
  mode: online
  eval_iter: 4
  eval_episodes: 50
  eval_backend: process
  eval_async: false
  eval_busy_policy: skip
  eval_timeout_s: 1800.0
  eval_device: cpu
  video_fps: 8
checkpoint:
  save_iter: 25
  resume: null
"""


def write_config(tmp_path, text: str = COMMITTED, name: str = "vla_grpo_libero.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def run_import(config, *args):
    result = CliRunner().invoke(main, ["import", "vla-grpo", str(config), *map(str, args)])
    return result


def imported_plan(tmp_path, *overrides, text: str = COMMITTED):
    """(the recipe config as the recipe sees it after the overrides, the plan of the imported spec)."""
    config = write_config(tmp_path, text)
    out = tmp_path / "spec.yaml"
    result = run_import(config, *[a for o in overrides for a in ("--set", o)], "-o", out)
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load(text)
    for override in overrides:
        key, _, value = override.partition("=")
        section, name = key.split(".")
        cfg[section][name] = parse_value(value)
    return cfg, topo.compile_spec(out)


def recipe_row(cfg: dict, c: int, w: int) -> dict:
    """What the recipe builds for worker w of collector c, from its config keys and its formulas."""
    env, col = cfg["env"], cfg["collector"]
    g = c * col["envs_per_collector"] + w  # worker_idx + worker_idx_offset (collector_idx * envs_per_collector)
    task_ids, group_size = env["task_ids"], col["group_size"]
    candidate = col["candidate_group_size"] or group_size
    if env["parallel_group_repeats"]:  # _training_group_repeats gives group_size, then the parallel branch
        logical = g // group_size
        task, repeats, offset, mode = task_ids[logical % len(task_ids)], candidate // group_size, logical * 10**6, \
            "init_state"
    else:  # group_repeats = candidate_group_size, passed as is
        task, repeats, offset, mode = task_ids[g % len(task_ids)], candidate, g * 10**6, "episode"
    ids = env["render_gpu_ids"]
    return {"task_id": task, "instruction": SPATIAL[task], "group_id_offset": offset, "group_repeats": repeats,
            "group_id_mode": mode, "seed": env["seed"] + g, "init_state_mode": env["train_init_state_mode"],
            "init_state_id": env.get("train_init_state_id", 0),
            "render_gpu": ids[c % len(ids)] if ids else None}


def assert_recipe_rows(cfg: dict, plan: dict):
    col, env = cfg["collector"], cfg["env"]
    n, m = col["num_collectors"], col["envs_per_collector"]
    assert_layout(plan, [m] * n)
    for row in rows(plan):
        want = recipe_row(cfg, row["subcollector"], row["index"])
        assert {k: row[k] for k in want} == want, (row["subcollector"], row["index"])
        kw = row["kwargs"]
        assert {k: kw["env"][k] for k in ("task_suite", "task_id", "instruction", "camera_height", "camera_width",
                                          "max_episode_steps", "init_state_mode", "init_state_id", "group_repeats",
                                          "group_id_offset", "group_id_mode", "env_kwargs")} == {
            "task_suite": env["task_suite"], "camera_height": env["camera_height"],
            "camera_width": env["camera_width"], "max_episode_steps": env["max_env_steps"],
            "env_kwargs": env["env_kwargs"] or {}, **{k: want[k] for k in (
                "task_id", "instruction", "init_state_mode", "init_state_id", "group_repeats", "group_id_offset",
                "group_id_mode")}}
        assert kw["seed"] == want["seed"] and kw["render_gpu"] == want["render_gpu"]
        numbering = "egl" if want["render_gpu"] is not None else None
        assert (row["render_numbering"], kw["render_numbering"]) == (numbering, numbering)
        assert kw["render_fallback"] is bool(numbering and env["render_gpu_device_zero_fallback"])
    assert (plan["start_methods"], plan["collector"]) == (
        {"subcollectors": "spawn", "workers": "spawn"}, {"sync": False, "frames_per_batch": m, "total_frames": -1})
    assert plan["launch"]["metadata_from_workers"] is True and plan["launch"]["use_buffers"] is False


# --- the recipe's assignment, row by row ---------------------------------------------------------------

def test_committed_config_imports_to_the_recipes_4x80(tmp_path):
    cfg, plan = imported_plan(tmp_path)
    assert_recipe_rows(cfg, plan)
    assert len(rows(plan)) == 320
    assert {r["group_repeats"] for r in rows(plan)} == {1}  # candidate_group_size null: the group size, 8 // 8
    assert [s["render_gpu"] for s in plan["subcollectors"]] == [2, 3, 4, 5]
    assert plan["render"] == {"numbering": "egl", "device_zero_fallback": True}
    assert plan["name"] == "vla_grpo_libero"


def test_5x64_override_imports_to_the_recipes_5x64(tmp_path):
    cfg, plan = imported_plan(tmp_path, "collector.num_collectors=5", "collector.envs_per_collector=64")
    assert_recipe_rows(cfg, plan)
    assert [s["render_gpu"] for s in plan["subcollectors"]] == [2, 3, 4, 5, 2]  # render_gpu_ids[c % 4]
    assert [t["workers"] for t in plan["coverage"]["tasks"]] == [32] * 10  # 40 groups over tasks 0-9


def test_serial_group_mode_and_other_values(tmp_path):
    """parallel_group_repeats false: task g % T, group ids g * 10**6, candidate repeats per worker, episode ids."""
    cfg, plan = imported_plan(tmp_path, "env.parallel_group_repeats=false", "collector.candidate_group_size=16",
                              "env.train_init_state_mode=fixed", "env.train_init_state_id=7", "env.seed=1000",
                              "env.task_ids=[3,1,4]", "collector.num_collectors=2", "collector.envs_per_collector=6",
                              "env.render_gpu_ids=[1]", "env.render_gpu_device_zero_fallback=false",
                              "env.env_kwargs={hard_reset: false}")
    assert_recipe_rows(cfg, plan)
    assert [r["task_id"] for r in rows(plan)][:4] == [3, 1, 4, 3] and rows(plan)[5]["group_repeats"] == 16


def test_the_4x80_example_is_the_committed_config_imported(tmp_path):
    """examples/libero_spatial_4x80.yaml is, after its own opening comments, exactly what the import writes."""
    result = run_import(write_config(tmp_path))
    assert result.exit_code == 0
    example = (EXAMPLES / "libero_spatial_4x80.yaml").read_text()
    assert example[example.index("# Written by `topo import vla-grpo vla_grpo_libero.yaml`"):] == result.stdout


def test_every_key_is_written_defaulted_or_named(tmp_path):
    result = run_import(write_config(tmp_path))
    spec = result.stdout
    written = {key for line in spec.splitlines() if not line.startswith("#") and "# " in line
               for key in re.findall(r"\b[a-z_]+\.[a-z_]+\b", line.split("# ", 1)[1])}
    closing = spec[spec.index("# Read from the config"):]
    cfg = yaml.safe_load(COMMITTED)
    for section, body in cfg.items():
        for key in body:
            dotted = f"{section}.{key}"
            assert dotted in written or dotted in closing, dotted
    assert "spec written to stdout: 23 value(s)" in result.stderr and "5 equal to topo's defaults" in result.stderr
    assert "not expressed: 20 policy keys: the policy" in result.stderr
    assert "not expressed: logger.eval_backend: where the recipe's Evaluator runs" in result.stderr
    assert "eval_num_envs" not in result.stderr and "eval_render_gpu_ids" not in result.stderr  # both written


# --- the recipe's evaluation: an eval section, with the seed overlap fixed and the training tasks warned about ---

def recipe_eval_rows(cfg: dict) -> list[dict]:
    """What the recipe's evaluator runs, from its config keys and formulas (utils.py: make_evaluator,
    _make_eval_env, _libero_worker_assignment(eval_mode=True), _worker_render_gpu_device_id(eval_mode=True)):
    eval_num_envs workers, worker w on task_ids[w % T] with init states cycled from 0 (LiberoEnv cycle mode),
    rendering on ids[w % len] (eval_render_gpu_ids, or render_gpu_ids when null); eval_episodes episodes in all."""
    env, log = cfg["env"], cfg["logger"]
    ids = env["eval_render_gpu_ids"] or env["render_gpu_ids"]
    n, tasks = env["eval_num_envs"], env["task_ids"]
    per_worker = log["eval_episodes"] // n  # the committed config: 50 over 10 workers
    return [{"task": tasks[w % len(tasks)], "init_states": list(range(per_worker)),
             "render_gpu": ids[w % len(ids)] if ids else None} for w in range(n)]


def eval_rows(plan: dict) -> list[dict]:
    return [row for sub in plan["eval"]["subcollectors"] for row in sub["workers"]]


def test_the_recipes_evaluation_becomes_the_eval_section(tmp_path):
    cfg, plan = imported_plan(tmp_path)
    ev = plan["eval"]
    want = recipe_eval_rows(cfg)
    got = [{"task": row["tasks"][0], "init_states": [e["init_state_id"] for e in row["episodes"]],
            "render_gpu": row["render_gpu"]} for row in eval_rows(plan)]
    assert got == want and all(len(row["tasks"]) == 1 for row in eval_rows(plan))
    assert (ev["tasks"], ev["held_out"], ev["init_states"], ev["trials"], ev["episodes"]) == (
        list(range(10)), [], [0, 1, 2, 3, 4], 1, cfg["logger"]["eval_episodes"])
    assert (ev["every"], ev["async"], ev["busy_policy"], ev["exploration"]) == (4, False, "skip", "deterministic")
    # the recipe's eval ParallelEnv is seeded env.seed + 1: training worker 1's seed. topo starts after training's
    training = {row["seed"] for row in rows(plan)}
    seeds = [e["seed"] for row in eval_rows(plan) for e in row["episodes"]]
    assert cfg["env"]["seed"] + 1 in training and not training & set(seeds)
    assert ev["seeds"] == {"strategy": "offset", "base": 320} and seeds == list(range(320, 370))
    row = eval_rows(plan)[0]
    assert (row["render_numbering"], row["kwargs"]["render_fallback"]) == ("egl", True)
    assert row["kwargs"]["env"]["max_episode_steps"] == cfg["env"]["max_env_steps"]  # the training's horizon


def test_eval_render_ids_null_reuse_the_training_ids_per_worker(tmp_path):
    """env.eval_render_gpu_ids null: worker w renders on render_gpu_ids[w % 4]; topo gives each id an eval
    subcollector with as many workers as the recipe puts on it."""
    cfg, plan = imported_plan(tmp_path, "env.eval_render_gpu_ids=null")
    want = Counter(r["render_gpu"] for r in recipe_eval_rows(cfg))
    assert Counter(row["render_gpu"] for row in eval_rows(plan)) == want == {2: 3, 3: 3, 4: 2, 5: 2}
    assert [(s["num_workers"], s["render_gpu"]) for s in plan["eval"]["subcollectors"]] == [(3, 2), (3, 3), (2, 4),
                                                                                           (2, 5)]
    assert sorted(row["tasks"][0] for row in eval_rows(plan)) == list(range(10))  # still every task, once each


def test_eval_episodes_that_do_not_split_over_the_tasks_round_up(tmp_path):
    config = write_config(tmp_path)
    result = run_import(config, "--set", "logger.eval_episodes=55", "--set", "logger.eval_async=true",
                        "--set", "logger.eval_busy_policy=queue", "--set", "logger.eval_iter=null")
    assert result.exit_code == 0, result.output
    assert "init_states: 0-5" in result.stdout and "rounded up: 60 episodes, every task alike" in result.stdout
    assert "async: true" in result.stdout and "busy_policy: queue" in result.stdout
    assert "every:" not in result.stdout and "logger.eval_iter: null (no periodic evaluation" in result.stdout
    spec = tmp_path / "spec.yaml"
    spec.write_text(result.stdout)
    ev = topo.compile_spec(spec)["eval"]
    assert (ev["episodes"], ev["every"], ev["async"], ev["busy_policy"]) == (60, None, True, "queue")


def test_where_the_import_differs_is_said_and_validate_warns(tmp_path):
    config = write_config(tmp_path)
    out = tmp_path / "spec.yaml"
    result = run_import(config, "-o", out)
    assert "differs from the recipe: eval.seeds.base: 320, after the 320 training seeds 0-319: the recipe seeds " \
           "its evaluation with env.seed + 1 = 1, the seed of training worker 1" in result.stderr
    assert "differs from the recipe: eval.tasks: the recipe evaluates on its training tasks" in result.stderr
    assert "# Where this spec differs from the recipe, on purpose:" in out.read_text()
    checked = run("validate", out)
    assert checked.exit_code == 0
    assert "warning eval-on-train-tasks at eval.tasks" in checked.output
    assert "leave some out of assignment.tasks and evaluate on them (held-out tasks)" in checked.output
    # the recipe's own seed, written back by hand, is refused with the fix
    out.write_text(out.read_text().replace("base: 320 ", "base: 1   "))
    refused = run("validate", out)
    assert refused.exit_code == 2 and "error eval-seed-overlaps-train at eval.seeds.base" in refused.output
    assert "hint: eval.seeds.base: 320 (training base 0 + 320 workers: after the training seeds)" in refused.output


def test_a_config_without_the_eval_keys_still_imports(tmp_path):
    text = "\n".join(line for line in COMMITTED.splitlines() if "eval_" not in line) + "\n"
    result = run_import(write_config(tmp_path, text))
    assert result.exit_code == 0, result.output
    assert "eval:\n  tasks: 0-9" in result.stdout and "workers:" not in result.stdout.split("eval:")[1]


def test_bad_eval_keys_exit_2_located(tmp_path):
    text = COMMITTED.replace("eval_busy_policy: skip", "eval_busy_policy: later")
    config = write_config(tmp_path, text)
    result = run_import(config)
    line = COMMITTED.splitlines().index("  eval_busy_policy: skip") + 1
    assert result.exit_code == 2
    assert f"{config}:{line}:3: error import-type at logger.eval_busy_policy: logger.eval_busy_policy must be skip or " \
           "queue or error, got 'later'" in result.stderr


# --- unknown keys, settings a spec cannot carry, bad input -------------------------------------------------

def test_unknown_keys_are_reported_and_strict_fails(tmp_path):
    text = COMMITTED.replace("  seed: 0\n", "  seed: 0\n  task_idz: [1]\n") + "wandb:\n  entity: me\n"
    config = write_config(tmp_path, text)
    result = run_import(config, "--set", "+collector.num_colectors=5")
    assert result.exit_code == 0
    assert f"{config}:21:3: warning import-unknown-key at env.task_idz" in result.stderr
    assert "did you mean env.task_ids?" in result.stderr
    assert "--set: warning import-unknown-key at collector.num_colectors" in result.stderr
    assert "did you mean collector.num_collectors?" in result.stderr
    assert f"{config}:" in result.stderr and "section 'wandb' is not one of the vla_grpo recipe's" in result.stderr
    assert "# Unknown to this importer (not written):\n#   env.task_idz\n#   collector.num_colectors\n#   wandb" \
        in result.stdout
    strict = run_import(config, "--strict")
    assert strict.exit_code == 2 and "import-unknown-key" in strict.stderr and strict.stdout == ""


def test_osmesa_renders_on_the_cpu_and_says_so(tmp_path):
    result = run_import(write_config(tmp_path), "--set", "env.render_backend=osmesa")
    assert result.exit_code == 0
    assert "--set: warning import-render-backend at env.render_backend" in result.stderr
    assert "render_gpu_ids [2, 3, 4, 5] and render_gpu_device_zero_fallback not written" in result.stderr
    assert "launch with MUJOCO_GL=osmesa" in result.stderr
    assert "render_devices" not in result.stdout


@pytest.mark.parametrize("overrides, text, code, where", [
    (["~collector.num_collectors"], None, "import-missing-key", "--set: error import-missing-key at "
                                                                "collector.num_collectors"),
    (["collector.num_colectors=5"], None, "set-unknown-key", "did you mean 'collector.num_collectors'?"),
    (["+collector.num_collectors=5"], None, "set-key-exists", "collector.num_collectors is already in the config"),
    (["collector"], None, "set-syntax", "--set expects key=value"),
    ([], COMMITTED.replace("num_collectors: 4", "num_collectors: four"), "import-type",
     "CFG:55:3: error import-type at collector.num_collectors: collector.num_collectors must be a positive integer"),
    (["env.backend=toy"], None, "import-backend", "env.backend is 'toy'"),
    ([], "defaults:\n  - base\n" + COMMITTED, "import-defaults-list", "CFG:1:1: error import-defaults-list"),
    ([], COMMITTED.replace("  seed: 0\n", "  seed: ${oc.env:SEED}\n"), "import-interpolation",
     "CFG:20:3: error import-interpolation at env.seed: env.seed: cannot resolve ${oc.env:SEED} calls a resolver"),
    ([], "env: [1\n", "yaml-syntax", "CFG:"),
])
def test_bad_input_exits_2_located(tmp_path, overrides, text, code, where):
    config = write_config(tmp_path, text or COMMITTED)
    result = run_import(config, *[a for o in overrides for a in ("--set", o)])
    assert result.exit_code == 2, result.output
    assert f" {code}" in result.stderr and where.replace("CFG", str(config)) in result.stderr, result.stderr
    assert "Traceback" not in result.output and result.stdout == ""


def test_missing_config_and_unwritable_output(tmp_path):
    missing = run_import(tmp_path / "nope.yaml")
    assert missing.exit_code == 2 and "no such file" in missing.stderr and missing.stdout == ""
    unwritable = run_import(write_config(tmp_path), "-o", tmp_path / "no" / "spec.yaml")
    assert unwritable.exit_code == 2 and "cannot write the spec" in unwritable.stderr


# --- Hydra: overrides and interpolations ------------------------------------------------------------------

def test_simple_interpolations_resolve_and_the_rest_are_named():
    data = {"env": {"camera_height": 224, "camera_width": "${.camera_height}", "suite": "libero_spatial",
                    "exp": "vla_${env.suite}_${collector.n}", "seed": "${oc.env:SEED}", "loop": "${env.loop}",
                    "gone": "${env.nothing}", "literal": "\\${not.this}", "ids": "${collector.ids}"},
            "collector": {"n": 4, "ids": [2, 3]}}
    resolved, unresolved = resolve(copy.deepcopy(data))
    env = resolved["env"]
    assert (env["camera_width"], env["exp"], env["ids"], env["literal"]) == (224, "vla_libero_spatial_4", [2, 3],
                                                                             "${not.this}")
    assert unresolved == {("env", "seed"): "${oc.env:SEED} calls a resolver",
                          ("env", "loop"): "${env.loop} refers back to itself",
                          ("env", "gone"): "${env.nothing}: no key env.nothing"}
    assert env["seed"] == "${oc.env:SEED}"  # kept as written


def test_interpolated_values_follow_overrides(tmp_path):
    text = COMMITTED.replace("camera_width: 256", "camera_width: ${.camera_height}")
    cfg, plan = imported_plan(tmp_path, "env.camera_height=128", text=text)
    assert rows(plan)[0]["kwargs"]["env"]["camera_width"] == 128


@pytest.mark.parametrize("text, value", [
    ("5", 5), ("[2,3,4,5]", [2, 3, 4, 5]), ("null", None), ("true", True), ("5e-6", 5e-6), ("cycle", "cycle"),
    ("'0'", "0"), ("{hard_reset: false}", {"hard_reset": False}), ("", ""),
])
def test_override_values_typed_as_hydra_does(text, value):
    assert parse_value(text) == value


@pytest.mark.parametrize("ids, text", [
    (list(range(10)), "0-9"), ([4], 4), ([1, 2], [1, 2]), ([3, 1, 2], [3, 1, 2]),
    ([0, 1, 2, 5, 7, 8, 9], ["0-2", 5, "7-9"]), ([9, 8, 7], [9, 8, 7]),
])
def test_task_lists_keep_their_order(ids, text):
    assert task_text(ids) == text


def test_importing_imports_no_torch(tmp_path):
    config = write_config(tmp_path)
    code = f"""
import sys
from topo.importers import hydra
from topo.importers.vla_grpo import convert
imported = convert(hydra.read({str(config)!r}), "vla_grpo_libero.yaml")
assert "subcollectors: 4" in imported.text
heavy = [m for m in ("torch", "torchrl", "numpy", "robosuite", "mujoco") if m in sys.modules]
assert not heavy, heavy
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# --- the recipe's chunk-decision stack: env.chunk_size and env.max_outer_steps expressed as env.transforms ---

def test_the_recipes_transform_stack_is_written_in_each_worker(tmp_path):
    cfg, plan = imported_plan(tmp_path, "env.max_outer_steps=32")
    stack = [{"name": "MultiAction", "kwargs": {"stack_rewards": False}}, {"name": "SuccessReward", "kwargs": {}},
             {"name": "StepCounter", "kwargs": {"max_steps": 32}}]
    assert (plan["env"]["transforms"], plan["env"]["transforms_at"]) == (stack, "worker")
    assert all(row["kwargs"]["transforms"] == stack for row in rows(plan))
    result = run_import(write_config(tmp_path))
    assert "chunk_size" not in result.stderr and "max_outer_steps" not in result.stderr.split("not expressed", 1)[1]
    assert "differs from the recipe: env.transforms: policy.mode is 'tokens'" in result.stderr
    assert "GripperPostProcessTransform" in result.stderr and "ActionTokenizerTransform" in result.stderr


def written_stack(result) -> list[str]:
    """The spec's env.transforms lines, as written."""
    lines = result.stdout.splitlines()
    start = lines.index("  transforms:") + 1
    return [line for line in lines[start:] if line.startswith("    - ")]


def test_a_token_policys_tokens_are_decoded_after_multiaction_in_each_worker(tmp_path):
    """policy.backend tiny emits ("vla_action", "tokens"): the recipe decodes them in each env with
    ActionTokenizerTransform(UniformActionTokenizer(tokenizer.vocab_size, low=-1.0, high=1.0)) after MultiAction."""
    overrides = ("policy.backend=tiny", "tokenizer.vocab_size=64", "env.max_outer_steps=8")
    result = run_import(write_config(tmp_path), *[a for o in overrides for a in ("--set", o)])
    assert written_stack(result) == [
        "    - {MultiAction: {stack_rewards: false}} # env.chunk_size: 8 env steps per decision, the policy's chunk, "
        "which MultiAction unbinds; in each worker, as the recipe's collector wraps its envs",
        "    - {'topo.recipes.vla_grpo:action_tokens': {vocab_size: 64, low: -1.0, high: 1.0}} # tokenizer.vocab_size: "
        "the tiny policy's ('vla_action', 'tokens') decoded to its chunk; low, high: the recipe's "
        "UniformActionTokenizer bounds (no key) (--set)",
        "    - SuccessReward                 # the recipe's decision reward, its outer success flag (no key)",
        "    - {StepCounter: {max_steps: 8}} # env.max_outer_steps: decisions per episode (--set)"]
    _, plan = imported_plan(tmp_path, *overrides)
    stack = [{"name": "MultiAction", "kwargs": {"stack_rewards": False}},
             {"name": "topo.recipes.vla_grpo:action_tokens", "kwargs": {"vocab_size": 64, "low": -1.0, "high": 1.0}},
             {"name": "SuccessReward", "kwargs": {}}, {"name": "StepCounter", "kwargs": {"max_steps": 8}}]
    assert (plan["env"]["transforms"], plan["env"]["transforms_at"]) == (stack, "worker")
    assert all(row["kwargs"]["transforms"] == stack for row in rows(plan))
    assert "tokenizer" not in result.stderr.split("not expressed", 1)[1] and "policy.mode is" not in result.stderr


def test_a_token_policys_imported_spec_validates_and_names_its_decoding_as_code(tmp_path):
    out = tmp_path / "spec.yaml"
    assert run_import(write_config(tmp_path), "--set", "policy.backend=tiny", "-o", out).exit_code == 0
    checked = run("validate", out)
    assert checked.exit_code == 0 and "0 error(s)" in checked.output
    planned = run("plan", out, "--dry-run")
    assert planned.exit_code == 0
    assert "note: launching this plan imports topo.envs.libero (env builder topo.envs.libero:build) and " \
           "topo.recipes.vla_grpo (env transform topo.recipes.vla_grpo:action_tokens)" in planned.output


def test_a_bad_vocab_size_exits_2_located(tmp_path):
    result = run_import(write_config(tmp_path), "--set", "policy.backend=tiny", "--set", "tokenizer.vocab_size=0")
    assert result.exit_code == 2
    assert "error import-type at tokenizer.vocab_size: tokenizer.vocab_size must be a positive integer, got 0" \
        in result.output


def test_openvla_l1_decodes_in_the_policy_and_multiaction_reads_its_chunk(tmp_path):
    result = run_import(write_config(tmp_path), "--set", "policy.mode=l1")
    assert written_stack(result) == [
        "    - {MultiAction.from_vla: {stack_rewards: false}} # env.chunk_size: 8 env steps per decision, the "
        "policy's chunk, which MultiAction unbinds; in each worker, as the recipe's collector wraps its envs",
        "    - SuccessReward                 # the recipe's decision reward, its outer success flag (no key)",
        "    - {StepCounter: {max_steps: 64}} # env.max_outer_steps: decisions per episode"]
    _, plan = imported_plan(tmp_path, "policy.mode=l1")
    assert plan["env"]["transforms"][0] == {"name": "MultiAction.from_vla", "kwargs": {"stack_rewards": False}}
    assert "policy.mode is" not in result.stderr
    assert "not expressed: tokenizer.vocab_size: the action tokenizer" in result.stderr  # unused: no tokens
