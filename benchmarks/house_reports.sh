#!/usr/bin/env bash
# The house redesign (#30) changes no behaviour: the report of a toy and a LIBERO launch, before the redesign
# (the commit before cd52f5a) and now, compared key by key (human lines with their figures masked, summary.json's
# keys, and the fields a launch guarantees). Results: benchmarks/results/house_reports.json.
#   bash benchmarks/house_reports.sh
set -u
cd "$(dirname "$0")/.."
here=$PWD out=${TMPDIR:-/tmp}/house_reports
rm -rf "$out" && mkdir -p "$out"
git worktree add -f "$out/before" cd52f5a^ >/dev/null 2>&1
for side in before now; do
  root=$here; [ $side = before ] && root=$out/before
  for spec in toy_2x3 libero_cpu; do
    dir=$out/$side/$spec; mkdir -p "$dir"
    (cd "$root" && MUJOCO_GL=egl PYTHONPATH=$root "$here/.venv/bin/python" -m topo launch examples/$spec.yaml --batches 2 \
       --report "$dir/report" > "$dir/stdout.txt" 2> "$dir/stderr.txt"; echo "exit $?" >> "$dir/stdout.txt")
  done
done
git worktree remove --force "$out/before"
.venv/bin/python - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
mask = lambda text: [re.sub(r"[0-9a-f]{64}|topo-run-\w+|/\S+/(before|now)/|\d+(\.\d+)?", "N", line) for line in text.splitlines()]
def keys(d, prefix=""):
    return {prefix + k for k in d} | {f"{k}/{j}" for k, v in d.items() if isinstance(v, dict) and not prefix for j in v}
result = {}
for spec in ("toy_2x3", "libero_cpu"):
    a, b = ({"lines": mask(open(f"{out}/{s}/{spec}/stdout.txt").read()),
             "summary": json.load(open(f"{out}/{s}/{spec}/report/summary.json"))} for s in ("before", "now"))
    result[spec] = {"lines_only_before": [l for l in a["lines"] if l not in b["lines"]],
                    "lines_only_now": [l for l in b["lines"] if l not in a["lines"]],
                    "keys_only_before": sorted(keys(a["summary"]) - keys(b["summary"])),
                    "keys_only_now": sorted(keys(b["summary"]) - keys(a["summary"])),
                    "guarantees_equal": {k: a["summary"][k] == b["summary"][k] for k in
                                         ("ok", "exit_code", "constructions", "env_closes", "seeds", "first_batch")},
                    "all_ready_s": [a["summary"]["timings_s"]["all_ready"], b["summary"]["timings_s"]["all_ready"]]}
json.dump(result, open("benchmarks/results/house_reports.json", "w"), indent=1)
print(json.dumps(result, indent=1))
PY
