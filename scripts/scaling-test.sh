#!/usr/bin/env bash
# scripts/scaling-test.sh CONFIG --sizes 1,2,4,...: the same config benchmarked at each size
# (`llmtrain bench --json`), one table row per size: tokens/s, tokens/s per device, efficiency
# against the smallest size, the exposed communication of each group, data wait, pipeline
# bubble, MFU, and `llmtrain plan`'s predicted tokens/s for that size beside the measurement.
# A step that scales below 80% (a doubling below 1.6x) is flagged with its largest cost: the
# part of the step that grew the most beyond perfect scaling.
#
# Weak scaling by default: the global batch grows with dp, so every rank has the same work
# at every size; --strong keeps the smallest size's global batch (the micro-batches per rank
# shrink). tp and pp stay as configured; dp = ranks / (tp x pp) at each size.
#
# Launchers: mpirun (Open MPI; $MPIEXEC names another binary), or srun inside one Slurm
# allocation: outside one, the script runs itself under `salloc` for the largest size, so
# every size runs on the same nodes. The default is srun inside an allocation, else mpirun.
#
# Exit status: 0 when every size ran (flags are reported, not failures); 2 for bad
# arguments, a missing launcher or a size the config cannot be laid out at (checked with
# `plan` before anything runs); 1 when a benchmark failed.
set -u
script_dir=$(cd "$(dirname "$0")" && pwd)
repo_dir=$(dirname "$script_dir")
original_args=("$@")

usage() {
    cat <<'EOF'
usage: scripts/scaling-test.sh CONFIG --sizes 1,2,4,... [options]
  --sizes LIST          ranks at each size, ascending (1,2,4,8 or 8,16,32,...)
  --launcher L          mpirun or srun (default: srun inside a Slurm allocation, else mpirun)
  --per-node N          ranks per node (default: all on one node; under Slurm SLURM_NTASKS_PER_NODE)
  --strong              keep the smallest size's global batch (default: weak scaling, batch x dp)
  --json                print one JSON object with a row per size instead of the table
  --warmup N            untimed steps per size (default 3)
  --steps N             timed steps per size (default 10)
  --cluster FILE        cluster description for plan's prediction and the MFU peak
                        (default: configs/clusters/this-cpu.toml, used for CPU runs only)
  --calibration FILE    calibration file for plan (bench --calibration-out, bench comm --calibration-out)
  --peak-tflops P       dense peak per device for MFU (default: the cluster's or the GPU's data sheet)
  --set KEY=VALUE       config override, passed to bench and plan (repeatable)
  --launcher-args ARGS  extra arguments for mpirun or srun (e.g. "--oversubscribe", "--overcommit")
  --alloc-args ARGS     extra arguments for salloc when srun runs outside an allocation
  --llmtrain PATH       the binary (default: $LLMTRAIN_BIN, build/llmtrain, or llmtrain on PATH)
  --logs DIR            keep every size's bench and plan output here (default: a temporary directory)
EOF
}
die() { echo "scaling-test: $*" >&2; exit 2; }

config="" sizes_text="" launcher="" per_node="" strong=0 json=0 warmup=3 steps=10 cluster="" calibration="" peak=""
launcher_args="" alloc_args="" bin=${LLMTRAIN_BIN:-} logs=""
sets=()
need_value() { [ $# -ge 2 ] || die "$1 needs a value (--help for usage)"; }
while [ $# -gt 0 ]; do
    case $1 in
        --sizes) need_value "$@"; sizes_text=$2; shift 2 ;;
        --launcher) need_value "$@"; launcher=$2; shift 2 ;;
        --per-node) need_value "$@"; per_node=$2; shift 2 ;;
        --strong) strong=1; shift ;;
        --json) json=1; shift ;;
        --warmup) need_value "$@"; warmup=$2; shift 2 ;;
        --steps) need_value "$@"; steps=$2; shift 2 ;;
        --cluster) need_value "$@"; cluster=$2; shift 2 ;;
        --calibration) need_value "$@"; calibration=$2; shift 2 ;;
        --peak-tflops) need_value "$@"; peak=$2; shift 2 ;;
        --set) need_value "$@"; sets+=(--set "$2"); shift 2 ;;
        --launcher-args) need_value "$@"; launcher_args=$2; shift 2 ;;
        --alloc-args) need_value "$@"; alloc_args=$2; shift 2 ;;
        --llmtrain) need_value "$@"; bin=$2; shift 2 ;;
        --logs) need_value "$@"; logs=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        -*) die "unknown option '$1' (--help for usage)" ;;
        *) [ -z "$config" ] || die "one CONFIG expected, got '$config' and '$1'"; config=$1; shift ;;
    esac
done

# --- arguments -------------------------------------------------------------------------
[ -n "$config" ] || die "no CONFIG given (usage: scripts/scaling-test.sh CONFIG --sizes 1,2,4)"
[ -f "$config" ] || die "config '$config' does not exist"
[ -n "$sizes_text" ] || die "--sizes is required: the ranks at each size, ascending, e.g. --sizes 1,2,4"
[[ $sizes_text =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--sizes '$sizes_text': expected positive integers separated by commas, e.g. 1,2,4"
IFS=, read -r -a sizes <<<"$sizes_text"
for i in "${!sizes[@]}"; do sizes[i]=$((10#${sizes[i]})); done
previous=0
for r in "${sizes[@]}"; do
    [ "$r" -ge 1 ] || die "--sizes '$sizes_text': a size of 0 ranks"
    [ "$r" -gt "$previous" ] || die "--sizes '$sizes_text': sizes must be ascending without repeats ($r after $previous)"
    previous=$r
done
largest=${sizes[${#sizes[@]} - 1]}
for pair in "warmup:$warmup" "steps:$steps"; do
    [[ ${pair#*:} =~ ^[0-9]+$ ]] || die "--${pair%%:*} '${pair#*:}': expected a whole number"
done
[ "$steps" -ge 1 ] || die "--steps must be at least 1"
[ -z "$peak" ] || [[ $peak =~ ^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$ ]] || die "--peak-tflops '$peak': expected a positive number"

if [ -z "$launcher" ]; then
    if [ -n "${SLURM_JOB_ID:-}" ]; then launcher=srun; else launcher=mpirun; fi
fi
case $launcher in mpirun | srun) ;; *) die "--launcher '$launcher': expected mpirun or srun" ;; esac
if [ -z "$per_node" ] && [ "$launcher" = srun ] && [[ ${SLURM_NTASKS_PER_NODE:-} =~ ^([0-9]+) ]]; then per_node=${BASH_REMATCH[1]}; fi
[ -z "$per_node" ] || { [[ $per_node =~ ^[0-9]+$ ]] && [ "$per_node" -ge 1 ]; } || die "--per-node '$per_node': expected a positive integer"
nodes_of() { if [ -n "$per_node" ]; then echo $((($1 + per_node - 1) / per_node)); else echo 1; fi; }

if [ -z "$bin" ]; then
    if [ -x "$repo_dir/build/llmtrain" ]; then bin=$repo_dir/build/llmtrain; else bin=$(command -v llmtrain || true); fi
fi
[ -n "$bin" ] && [ -x "$bin" ] || die "llmtrain binary not found${bin:+ at '$bin'} (build it, or pass --llmtrain PATH)"
command -v python3 >/dev/null || die "python3 is needed to read bench's and plan's JSON and is not installed"
[ -z "$cluster" ] || [ -f "$cluster" ] || die "--cluster '$cluster' does not exist"
[ -z "$calibration" ] || [ -f "$calibration" ] || die "--calibration '$calibration' does not exist"
cluster_given=1
[ -n "$cluster" ] || { cluster=$repo_dir/configs/clusters/this-cpu.toml cluster_given=0; }

# --- the launcher ----------------------------------------------------------------------
# shellcheck disable=SC2206  # the extra arguments are words, as a shell would split them
extra=($launcher_args)
if [ "$launcher" = mpirun ]; then
    mpiexec=${MPIEXEC:-mpirun}
    command -v "$mpiexec" >/dev/null || die "launcher mpirun: '$mpiexec' is not installed or not on PATH (set MPIEXEC to its path)"
    launch() { # RANKS NODES
        local map=()
        [ -z "$per_node" ] || map=(--map-by "ppr:$per_node:node")
        "$mpiexec" -np "$1" "${map[@]}" "${extra[@]}" "${@:3}"
    }
else
    command -v srun >/dev/null || die "launcher srun: srun is not installed or not on PATH"
    if [ -z "${SLURM_JOB_ID:-}" ]; then
        # One allocation for every size: the largest's nodes and tasks.
        command -v salloc >/dev/null || die "launcher srun outside a Slurm allocation: salloc is not installed or not on PATH"
        # shellcheck disable=SC2206
        alloc=($alloc_args)
        exec salloc --nodes="$(nodes_of "$largest")" --ntasks="$largest" "${alloc[@]}" "$0" "${original_args[@]}" --launcher srun
    fi
    launch() { # RANKS NODES
        local spread=()
        [ -z "$per_node" ] || spread=(--ntasks-per-node="$per_node")
        srun --nodes="$2" --ntasks="$1" "${spread[@]}" "${extra[@]}" "${@:3}"
    }
fi

if [ -n "$logs" ]; then mkdir -p "$logs" || die "--logs '$logs': cannot create it"; else
    logs=$(mktemp -d) && trap 'rm -rf "$logs"' EXIT
fi

# --- layouts, checked by plan before anything runs -------------------------------------
json_field() { python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): v = v[k]
print(v)' "$1" "$2"; }
plan_size() { # RANKS OUT_JSON SETS...
    local ranks=$1 out=$2 calib=() nodes=()
    shift 2
    [ -z "$calibration" ] || calib=(--calibration "$calibration")
    # With --per-node the cluster is the size's nodes; without it, the cluster file's.
    [ -z "$per_node" ] || nodes=(--nodes "$(nodes_of "$ranks")")
    "$bin" plan "$config" "${sets[@]}" "$@" --cluster "$cluster" "${calib[@]}" --gpus "$ranks" "${nodes[@]}" --json \
        >"$out" 2>"$out.err" </dev/null
}
smallest=${sizes[0]}
layout_sets=(--set parallel.dp=0 --set train.grad_accum=0)
plan_size "$smallest" "$logs/plan_base.json" "${layout_sets[@]}" ||
    die "size $smallest: the config cannot be laid out on $smallest ranks: $(sed 's/^llmtrain: //' "$logs/plan_base.json.err" | tail -n 1)"
tp=$(json_field "$logs/plan_base.json" layout.tp) pp=$(json_field "$logs/plan_base.json" layout.pp)
dp0=$(json_field "$logs/plan_base.json" layout.dp)
batch0=$(($(json_field "$logs/plan_base.json" layout.micro_batch) * $(json_field "$logs/plan_base.json" layout.micro_batches) * dp0))
for r in "${sizes[@]}"; do
    [ $((r % (tp * pp))) -eq 0 ] || die "size $r: tp x pp = $tp x $pp = $((tp * pp)) ranks does not divide $r ranks"
    dp=$((r / (tp * pp)))
    if [ "$strong" = 1 ]; then batch=$batch0; else
        [ $((batch0 * dp % dp0)) -eq 0 ] || die "size $r: the global batch of $batch0 sequences at dp $dp0 does not scale to dp $dp in whole sequences"
        batch=$((batch0 * dp / dp0))
    fi
    echo "$batch" >"$logs/batch_$r"
    plan_size "$r" "$logs/plan_$r.json" "${layout_sets[@]}" --set "train.global_batch_size=$batch" ||
        die "size $r: the config cannot be laid out on $r ranks (global batch $batch sequences, dp $dp): $(sed 's/^llmtrain: //' "$logs/plan_$r.json.err" | tail -n 1)"
done

# --- the measurements ------------------------------------------------------------------
bench_flags=(--json --warmup "$warmup" --steps "$steps" --cluster "$cluster")
[ -z "$peak" ] || bench_flags+=(--peak-tflops "$peak")
for r in "${sizes[@]}"; do
    nodes=$(nodes_of "$r")
    [ "$json" = 1 ] || echo "scaling-test: $r ranks on $nodes node(s), global batch $(cat "$logs/batch_$r") sequences ..." >&2
    launch "$r" "$nodes" "$bin" bench "$config" "${sets[@]}" "${layout_sets[@]}" --set "train.global_batch_size=$(cat "$logs/batch_$r")" \
        "${bench_flags[@]}" >"$logs/bench_$r.json" 2>"$logs/bench_$r.err" </dev/null
    status=$?
    if [ "$status" -ne 0 ]; then
        echo "scaling-test: the benchmark of $r ranks failed (exit $status; $launcher); its last lines:" >&2
        tail -n 5 "$logs/bench_$r.err" >&2
        exit 1
    fi
done

# --- the table -------------------------------------------------------------------------
python3 - "$logs" "$json" "$strong" "$cluster_given" "$cluster" "$config" "$launcher" "${sizes[@]}" <<'EOF'
import json, math, sys

logs, as_json, strong, cluster_given, cluster, config, launcher = sys.argv[1:8]
sizes = [int(s) for s in sys.argv[8:]]
strong = strong == "1"
TARGET = 0.8  # per step between sizes: a doubling should give at least 1.6x

def load(path):
    with open(path) as f:
        return json.load(f)

rows = []
for r in sizes:
    b, p = load(f"{logs}/bench_{r}.json"), load(f"{logs}/plan_{r}.json")
    # plan's default cluster describes this CPU machine: its prediction says nothing of a GPU run.
    predicted = None
    if cluster_given == "1" or b["device"] == "cpu":
        predicted = p["time"]["tokens_per_second_per_device"] * b["ranks"]
    rows.append({
        "ranks": b["ranks"], "nodes": b["nodes"], "tp": b["tp"], "dp": b["dp"], "pp": b["pp"],
        "global_batch_sequences": b["global_batch_sequences"], "micro_batches": b["micro_batches"],
        "step_seconds": b["step_seconds"],
        "tokens_per_second": b["tokens_per_second"],
        "tokens_per_second_per_device": b["tokens_per_second_per_device"],
        "exposed_comm_share": b["exposed_comm_share"],
        "data_wait_share": b["data_wait_share"], "bubble_share": b["bubble_share"],
        "mfu": b["mfu"],
        "predicted_tokens_per_second": predicted,
        "predicted_step": {k: p["time"][k] for k in ("step_seconds", "compute_seconds", "tp_comm_seconds", "pp_comm_seconds",
                                                      "bubble_seconds", "dp_exposed_seconds", "optimizer_seconds")},
    })

def step_parts(row):
    """Seconds per step: each group's exposed communication, the data wait, and the rest (compute)."""
    step = row["step_seconds"]
    parts = {f"{g} communication": share * step for g, share in row["exposed_comm_share"].items()}
    parts["data wait"] = row["data_wait_share"] * step
    parts["compute"] = max(0.0, step - sum(parts.values()))
    return parts

first = rows[0]
for i, row in enumerate(rows):
    row["efficiency"] = (row["tokens_per_second_per_device"] / first["tokens_per_second_per_device"])
    row["speedup"] = None if i == 0 else row["tokens_per_second"] / rows[i - 1]["tokens_per_second"]
    row["flag"] = None
    if i == 0:
        continue
    prev = rows[i - 1]
    factor = row["ranks"] / prev["ranks"]
    if row["speedup"] >= TARGET * factor:
        continue
    # Perfect scaling keeps each part of a weak-scaling step as it was; a strong-scaling step's
    # parts shrink with the ranks. The part that grew most beyond that is the cost named.
    ideal = 1 / factor if strong else 1.0
    now, before = step_parts(row), step_parts(prev)
    excess = {k: now[k] - before.get(k, 0.0) * ideal for k in now}
    cost = max(excess, key=excess.get)
    row["flag"] = {"from_ranks": prev["ranks"], "speedup": row["speedup"], "expected_speedup": TARGET * factor,
                   "largest_cost": cost, "largest_cost_seconds_per_step": excess[cost],
                   "largest_cost_share": now[cost] / row["step_seconds"]}

if as_json == "1":
    print(json.dumps({"config": config, "scaling": "strong" if strong else "weak", "launcher": launcher,
                      "cluster": cluster, "rows": rows}, indent=2))
    sys.exit(0)

def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"

def comm_text(shares):
    return ", ".join(f"{g} {pct(s)}" for g, s in shares.items()) or "-"

print(f"scaling test: {config}, {'strong' if strong else 'weak'} scaling "
      f"(global batch {first['global_batch_sequences']} sequences at {first['ranks']} rank(s)"
      f"{'' if strong else ', x dp'}), {launcher}, tp {first['tp']} x pp {first['pp']}")
header = f"{'ranks':>6} {'nodes':>5} {'tokens/s':>11} {'per device':>11} {'efficiency':>10} {'speedup':>8}  " \
         f"{'exposed communication':<28} {'data wait':>9} {'bubble':>7} {'MFU':>6} {'predicted tokens/s':>24}"
print(header)
for row in rows:
    speedup = "-" if row["speedup"] is None else f"{row['speedup']:.2f}x"
    predicted = "n/a (no --cluster)"
    if row["predicted_tokens_per_second"] is not None:
        error = row["predicted_tokens_per_second"] / row["tokens_per_second"] - 1
        predicted = f"{row['predicted_tokens_per_second']:.0f} ({100 * error:+.0f}%)"
    print(f"{row['ranks']:>6} {row['nodes']:>5} {row['tokens_per_second']:>11.0f} {row['tokens_per_second_per_device']:>11.0f} "
          f"{pct(row['efficiency']):>10} {speedup:>8}  {comm_text(row['exposed_comm_share']):<28} {pct(row['data_wait_share']):>9} "
          f"{pct(row['bubble_share']):>7} {pct(row['mfu']):>6} {predicted:>24}")
flags = [r for r in rows if r["flag"]]
for row in flags:
    f = row["flag"]
    print(f"FLAG {f['from_ranks']} -> {row['ranks']} ranks: {f['speedup']:.2f}x, below {f['expected_speedup']:.2f}x (80% per step); "
          f"largest cost: {f['largest_cost']}, +{1e3 * f['largest_cost_seconds_per_step']:.1f} ms per step beyond perfect scaling "
          f"({pct(f['largest_cost_share'])} of the step)")
if not flags and len(rows) > 1:
    print("every step between sizes scaled at 80% or better")
print("exposed communication: time ranks were blocked in each group's collectives, over all ranks (pp includes the "
      "bubble's waits); bubble: the schedule's idle slots; predicted: llmtrain plan on " + cluster)
EOF
