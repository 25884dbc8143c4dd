#!/usr/bin/env bash
# scaling_test.sh mpirun|srun SCRATCH LLMTRAIN MPIEXEC: scripts/scaling-test.sh on
# configs/tiny.toml at 1, 2 and 4 ranks with --json (a short run: one warm-up and two timed
# steps, a micro-batch of 2, one thread per rank), then checks its rows: every key present,
# the ranks as asked, each size's global batch dp times the smallest's (weak scaling), the
# smallest size's efficiency exactly 1, positive throughputs, and plan's prediction present.
#   mpirun: over Open MPI with --oversubscribe.
#   srun:   on a real single-node Slurm cluster started here (slurm_test_cluster.sh); the
#           script, run outside an allocation, takes one with salloc and runs every size in
#           it with srun. Skipped (exit 77) where the Slurm daemons cannot start.
set -u
launcher=$1 scratch=$2 bin=$3 mpiexec=$4
source_dir=$PWD
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

args=(configs/tiny.toml --json --sizes 1,2,4 --warmup 1 --steps 2 --llmtrain "$bin" --logs "$scratch/logs"
      --set train.batch_size=2 --set train.threads=1)
if [ "$launcher" = srun ]; then
    export PATH=$PATH:/usr/sbin:/sbin
    unset "${!SLURM_@}" "${!SALLOC_@}"  # a test run inside a Slurm job talks to its own cluster only
    # shellcheck source=tests/e2e/slurm_test_cluster.sh
    . "$(dirname "$0")/slurm_test_cluster.sh"
    start_slurm_cluster salloc
    # Four tasks on a node of two CPUs: the allocation and each step overcommit.
    args+=(--launcher srun --alloc-args "--overcommit --time=10" --launcher-args "--overcommit")
else
    rm -rf "$scratch" && mkdir -p "$scratch"
    args+=(--launcher mpirun --launcher-args "--oversubscribe")
fi

cd "$source_dir" || fail "no source directory"
MPIEXEC=$mpiexec scripts/scaling-test.sh "${args[@]}" >"$scratch/rows.json" 2>"$scratch/stderr"
status=$?
[ "$status" -eq 0 ] || { cat "$scratch/stderr"; tail -n 20 "$scratch"/logs/*.err 2>/dev/null; fail "scripts/scaling-test.sh exited $status"; }
cat "$scratch/rows.json"

python3 - "$scratch/rows.json" "$launcher" <<'EOF' || fail "the rows are not as asked"
import json, sys

out = json.load(open(sys.argv[1]))
rows = out["rows"]
problems = []
if out["launcher"] != sys.argv[2]:
    problems.append(f"launcher {out['launcher']}, not {sys.argv[2]}")
if out["scaling"] != "weak":
    problems.append(f"scaling {out['scaling']}, not weak")
if [r.get("ranks") for r in rows] != [1, 2, 4]:
    problems.append(f"ranks {[r.get('ranks') for r in rows]}, not [1, 2, 4]")
keys = ["ranks", "nodes", "tokens_per_second", "tokens_per_second_per_device", "efficiency", "exposed_comm_share",
        "predicted_tokens_per_second", "data_wait_share", "bubble_share", "mfu", "speedup", "flag"]
for r in rows:
    missing = [k for k in keys if k not in r]
    if missing:
        problems.append(f"row of {r.get('ranks')} ranks lacks {missing}")
        continue
    if r["nodes"] != 1:
        problems.append(f"{r['ranks']} ranks on {r['nodes']} nodes, not 1")
    if not r["tokens_per_second"] > 0 or abs(r["tokens_per_second_per_device"] * r["ranks"] - r["tokens_per_second"]) > 1e-6 * r["tokens_per_second"]:
        problems.append(f"{r['ranks']} ranks: tokens/s {r['tokens_per_second']}, per device {r['tokens_per_second_per_device']}")
    if not isinstance(r["predicted_tokens_per_second"], (int, float)) or not r["predicted_tokens_per_second"] > 0:
        problems.append(f"{r['ranks']} ranks: no prediction ({r['predicted_tokens_per_second']})")
    if r["global_batch_sequences"] != rows[0]["global_batch_sequences"] * r["dp"]:
        problems.append(f"{r['ranks']} ranks: global batch {r['global_batch_sequences']}, not dp {r['dp']} x {rows[0]['global_batch_sequences']}")
    # dp traffic exists from 2 ranks on; its blocked time is measured, so never negative.
    groups = set(r["exposed_comm_share"])
    if (r["ranks"] > 1) != ("dp" in groups) or any(not 0 <= s <= 1 for s in r["exposed_comm_share"].values()):
        problems.append(f"{r['ranks']} ranks: exposed communication {r['exposed_comm_share']}")
    if r["mfu"] is None or not r["mfu"] > 0:
        problems.append(f"{r['ranks']} ranks: MFU {r['mfu']} (this-cpu.toml gives the peak)")
if rows and rows[0].get("efficiency") != 1:
    problems.append(f"the smallest size's efficiency is {rows[0].get('efficiency')}, not 1")
print("\n".join(problems) or "rows as asked")
sys.exit(1 if problems else 0)
EOF
echo "PASS: scaling-test.sh over $launcher: rows for 1, 2 and 4 ranks"
