#!/usr/bin/env bash
# What an option buys on this machine: `llmtrain bench` of one config and layout with the
# option off and on, alternated for ROUNDS rounds (the machine's load drifts; alternating
# spreads it over both), printing per run and then the medians of the step time and of the
# exposed communication per group (blocked time per step, as the profile measures it). A
# benchmark, not a test: run it on an otherwise idle machine.
# usage: scripts/bench-overlap.sh RANKS OPTIONS CONFIG [--set ...]
#   OPTIONS  the key switched between false and true, e.g. parallel.overlap_param_gather, or
#            KEY=OFF,ON for other values, as --set reads them, e.g. parallel.grad_reduce_dtype='"f32","bf16"';
#            several, separated by ';', switch together
#   env: LLMTRAIN (build/llmtrain), MPIEXEC (mpirun), ROUNDS (5), STEPS (3), WARMUP (1)
# e.g.  scripts/bench-overlap.sh 4 parallel.overlap_param_gather configs/tiny.toml \
#         --set model.n_layers=16 --set model.d_model=512 --set model.n_heads=8 --set model.max_seq_len=64 \
#         --set train.seq_len=64 --set train.batch_size=1 --set train.threads=1
set -eu
[ $# -ge 3 ] || { sed -n 's/^# \{0,1\}//p' "$0" | sed -n '2,14p' >&2; exit 2; }
ranks=$1
off_sets=() on_sets=() labels=()
IFS=';' read -r -a specs <<< "$2"
for spec in "${specs[@]}"; do
    key=${spec%%=*} values=false,true
    case $spec in *=*) values=${spec#*=} ;; esac
    off_sets+=(--set "$key=${values%%,*}")
    on_sets+=(--set "$key=${values#*,}")
    labels+=("${key##*.}")
done
option=$(IFS=+; echo "${labels[*]}") off=${off_sets[1]#*=} on=${on_sets[1]#*=}
[ "${#specs[@]}" -gt 1 ] && off=off on=on
shift 2
cd "$(dirname "$0")/.."
bin=${LLMTRAIN:-build/llmtrain} mpiexec=${MPIEXEC:-mpirun} rounds=${ROUNDS:-5}
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
round=1
while [ "$round" -le "$rounds" ]; do
    for side in off on; do
        if [ "$side" = off ]; then sets=("${off_sets[@]}"); else sets=("${on_sets[@]}"); fi
        "$mpiexec" --oversubscribe -np "$ranks" "$bin" bench "$@" "${sets[@]}" --warmup "${WARMUP:-1}" --steps "${STEPS:-3}" --json \
            > "$dir/${side}_$round.json" < /dev/null
    done
    round=$((round + 1))
done
python3 - "$dir" "$option" "$rounds" "$off" "$on" "${off_sets[*]}" "${on_sets[*]}" <<'PY'
import json, statistics, sys
dir, option, rounds, off, on = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
print(f"off: {sys.argv[6]}")
print(f"on:  {sys.argv[7]}")
runs = {v: [json.load(open(f"{dir}/{side}_{r}.json")) for r in range(1, rounds + 1)] for side, v in (("off", off), ("on", on))}
groups = sorted({g for v in runs.values() for r in v for g in r["exposed_comm_seconds_per_step"]})
print(f"{'':22} {'ms/step':>9}" + "".join(f" {g + ' ms':>9}" for g in groups))
for value, rows in runs.items():
    for i, r in enumerate(rows, 1):
        print(f"{option.split('.')[-1] + '=' + value:>18} #{i} {1e3 * r['step_seconds']:9.1f}" +
              "".join(f" {1e3 * r['exposed_comm_seconds_per_step'].get(g, 0):9.1f}" for g in groups))
for value, rows in runs.items():
    print(f"{'median ' + value:>21}  {1e3 * statistics.median(r['step_seconds'] for r in rows):9.1f}" +
          "".join(f" {1e3 * statistics.median(r['exposed_comm_seconds_per_step'].get(g, 0) for r in rows):9.1f}" for g in groups))
PY
