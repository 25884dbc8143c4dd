#!/usr/bin/env bash
# training_health.sh SCENARIO SCRATCH LLMTRAIN MPIEXEC: the training-health acceptance runs on
# tiny models (seconds each). Faults come from LLMTRAIN_INJECT_FAULT (spike, lr, nan, bitflip).
#   no_false_alarms  the bundled tiny and tiny-bpe runs (500 steps), default thresholds: 0 events
#   spikes_skip      3 spikes in 300 steps, default thresholds: 3 events, each skipped
#   spikes_rollback  the same on the BPE shards with rollback: the run rolls back, skips the
#                    data (anomalies.jsonl names the samples, files and documents) and ends
#                    within 2% of the clean run's validation loss
#   divergence       the learning rate x30 from step 100: lower_lr recovers; abort exits 3
#                    after saving the state before the offending step
#   rollback_kill    a rollback, SIGKILL before the next checkpoint, --resume auto: bitwise
#                    the run that was not killed
#   nan_8_ranks      a NaN on rank 5 of tp 2 x pp 2 x dp 2: every rank skips the step (the
#                    run is bitwise the one with the NaN on rank 0) and the weights stay finite
#   rerun_4_ranks    a bit flip on rank 2 is a transient fault naming rank 2 (exit 76); a
#                    spike that a re-run meets again is real and skipped
set -u
scenario=$1 scratch=$2 bin=$3 mpiexec=$4
rm -rf "$scratch"
mkdir -p "$scratch"
fail() { echo "FAIL: $*"; exit 1; }
small=(--set model.n_layers=2 --set model.d_model=64 --set train.batch_size=4 --set train.seq_len=32 --set train.eval_sequences=16
       --set train.threads=1 --set optimizer.warmup_steps=10 --set train.sample_tokens=0 --set train.log_every=50)
tiny=(configs/tiny.toml "${small[@]}")
bpe=(configs/tiny-bpe.toml "${small[@]}")

# train NAME [--set ...]: a run into $scratch/NAME (checkpoints in $scratch/NAME-checkpoints); its exit status.
train() {
    local name=$1
    shift
    "$bin" train "$@" --set checkpoint.dir=\""$scratch/$name-checkpoints"\" --run-dir "$scratch/$name" >"$scratch/$name.out" 2>&1
}
events() { grep -c '"event":"anomaly"' "$scratch/$1/anomalies.jsonl"; }
final_val_loss() { grep '"event":"eval"' "$scratch/$1/log.jsonl" | tail -1 | sed -E 's/.*"val_loss":([^,}]*).*/\1/'; }
# "step loss grad_norm" of every step record (full precision), sorted by step.
figures() { grep '"event":"step"' "$1" | sed -E 's/.*"grad_norm":([^,]*).*"loss":([^,]*).*"step":([0-9]+),.*/\3 \2 \1/' | sort -n; }
within() { awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= tol * b) }'; }

case $scenario in
no_false_alarms)
    # The bundled configs as they are, default thresholds.
    for config in tiny tiny-bpe; do
        train "$config" "configs/$config.toml" --set train.threads=1 --set train.sample_tokens=0 &
    done
    wait
    for config in tiny tiny-bpe; do
        grep -q '"event":"end"' "$scratch/$config/log.jsonl" || fail "$config did not finish: $(tail -3 "$scratch/$config.out")"
        [ "$(events "$config")" = 0 ] || fail "$config: false alarms: $(cat "$scratch/$config/anomalies.jsonl")"
    done
    echo "ok: tiny and tiny-bpe, 500 steps each, 0 events"
    ;;
spikes_skip)
    LLMTRAIN_INJECT_FAULT=spike:120:30,spike:180:30,spike:240:30 train skip "${tiny[@]}" --set train.steps=300 || fail "the run failed: $(tail -3 "$scratch/skip.out")"
    [ "$(events skip)" = 3 ] || fail "expected 3 events, got: $(cat "$scratch/skip/anomalies.jsonl")"
    for s in 120 180 240; do
        grep "\"step\":$s," "$scratch/skip/anomalies.jsonl" | grep -q '"action":"skip".*"kind":"\(loss\|grad\)_spike"' || fail "no skipped spike at step $s"
        grep '"event":"step"' "$scratch/skip/log.jsonl" | grep "\"step\":$s," | grep -q '"skipped":true' || fail "step $s is not recorded as skipped"
    done
    grep -q "health: step 120: loss_spike .* -> skip" "$scratch/skip.out" || fail "no log line for the event at step 120"
    echo "ok: 3 spikes, 3 events, each skipped"
    ;;
spikes_rollback)
    common=("${bpe[@]}" --set train.steps=300 --set checkpoint.every_steps=25 --set checkpoint.keep_last=20)
    train clean "${common[@]}" || fail "the clean run failed: $(tail -3 "$scratch/clean.out")"
    LLMTRAIN_INJECT_FAULT=spike:120:30,spike:180:30,spike:240:30 train rollback "${common[@]}" --set monitor.on_spike=\"rollback\" --set monitor.skip_batches=5 ||
        fail "the run failed: $(tail -3 "$scratch/rollback.out")"
    [ "$(events rollback)" = 3 ] || fail "expected 3 events, got: $(cat "$scratch/rollback/anomalies.jsonl")"
    # Spikes are bad batches: after a rollback that skipped data, the batch of data step 180 is
    # met at an earlier training step. Each event rolls back to the newest checkpoint (every 25
    # steps) and skips the data up to its bad batch and 5 batches more (global batch 4).
    n=0
    for bad in 120 180 240; do
        n=$((n + 1))
        line=$(sed -n "${n}p" "$scratch/rollback/anomalies.jsonl")
        step=$(echo "$line" | sed -E 's/.*"step":([0-9]+),.*/\1/')
        echo "$line" | grep -q '"action":"rollback"' || fail "event $n was not rolled back: $line"
        echo "$line" | grep -q "\"rollback_to\":$(((step - 1) / 25 * 25))," || fail "event $n did not roll back to the newest checkpoint: $line"
        echo "$line" | grep -q "\"skipped_samples\":\[[0-9]*,$(((bad + 5) * 4))\]" || fail "event $n: the skipped samples do not end after batch $bad + 5: $line"
        echo "$line" | grep -q "\"skipped_data\":\"[0-9]*: '[^']*train-[0-9]*.ltshard' documents [0-9]*-[0-9]*" || fail "event $n: the skipped data names no file and documents: $line"
    done
    clean=$(final_val_loss clean) rolled=$(final_val_loss rollback)
    within "$rolled" "$clean" 0.02 || fail "final validation loss $rolled is not within 2% of the clean run's $clean"
    echo "ok: 3 rollbacks, data skipped and named; final validation loss $rolled against $clean clean"
    ;;
divergence)
    # Learning rate 1e-2, constant, no clipping, x30 from step 100 (the drill); windows of 10
    # steps and a factor of 1.25 (this small model's loss can rise only so far: it knows little
    # more than byte frequencies by step 100). The spike detectors are out of reach: the
    # divergence detector alone judges.
    common=("${tiny[@]}" --set train.steps=300 --set train.eval_every=50 --set checkpoint.every_steps=50 --set optimizer.lr=1e-2
            --set optimizer.decay=\"constant\" --set optimizer.grad_clip=0 --set monitor.window=10 --set monitor.warmup_steps=20
            --set monitor.divergence_factor=1.25 --set monitor.loss_zscore=1e6 --set monitor.grad_zscore=1e6)
    export LLMTRAIN_INJECT_FAULT=lr:100:30
    train unchecked "${common[@]}" --set monitor.divergence_factor=1e6 || fail "the run without a monitor failed: $(tail -3 "$scratch/unchecked.out")"
    [ "$(events unchecked)" = 0 ] || fail "events without a detector: $(cat "$scratch/unchecked/anomalies.jsonl")"
    train lower_lr "${common[@]}" --set monitor.on_divergence=\"lower_lr\" --set monitor.lr_factor=0.1 || fail "the lower_lr run failed: $(tail -3 "$scratch/lower_lr.out")"
    grep -q '"action":"lower_lr".*"kind":"divergence"' "$scratch/lower_lr/anomalies.jsonl" || fail "no divergence detected: $(tail -3 "$scratch/lower_lr.out")"
    grep -q '"kind":"divergence".*"step":\(9[0-9]\|[1-8][0-9]\|[0-9]\),' "$scratch/lower_lr/anomalies.jsonl" && fail "a divergence before the drill"
    unchecked=$(final_val_loss unchecked) recovered=$(final_val_loss lower_lr)
    before=$(grep '"event":"eval"' "$scratch/lower_lr/log.jsonl" | grep '"step":50,' | sed -E 's/.*"val_loss":([^,}]*).*/\1/')
    awk -v r="$recovered" -v u="$unchecked" -v b="$before" 'BEGIN { exit !(r < u && r < 1.02 * b) }' ||
        fail "lower_lr did not recover: final validation loss $recovered, without the monitor $unchecked, before the drill $before"
    train abort "${common[@]}" --set monitor.on_divergence=\"abort\"
    status=$?
    [ "$status" = 3 ] || fail "abort exited $status, expected 3: $(tail -3 "$scratch/abort.out")"
    at=$(sed -nE 's/.*"action":"abort".*"kind":"divergence".*"step":([0-9]+),.*/\1/p' "$scratch/abort/anomalies.jsonl")
    [ -n "$at" ] || fail "no divergence abort in anomalies.jsonl"
    [ "$(cat "$scratch/abort-checkpoints/latest")" = "$(printf 'step_%08d' $((at - 1)))" ] || fail "the checkpoint at the abort is not step $((at - 1))"
    "$bin" checkpoint verify "$scratch/abort-checkpoints/$(printf 'step_%08d' $((at - 1)))" >/dev/null || fail "the checkpoint at the abort does not verify"
    grep -q '"event":"error".*"exit_code":3' "$scratch/abort/log.jsonl" || fail "log.jsonl has no error record with exit code 3"
    echo "ok: divergence at step $at; lower_lr ends at $recovered (no monitor: $unchecked, before the drill: $before); abort exit 3 after a checkpoint"
    ;;
rollback_kill)
    common=("${tiny[@]}" --set train.steps=200 --set checkpoint.every_steps=25 --set checkpoint.keep_last=20
            --set monitor.on_spike=\"rollback\" --set monitor.skip_batches=3)
    export LLMTRAIN_INJECT_FAULT=spike:140:30
    train reference "${common[@]}" || fail "the reference run failed: $(tail -3 "$scratch/reference.out")"
    [ "$(events reference)" = 1 ] && grep -q '"action":"rollback".*"rollback_to":125' "$scratch/reference/anomalies.jsonl" ||
        fail "the reference run did not roll back once to step 125: $(cat "$scratch/reference/anomalies.jsonl")"
    # The kill lands after the rollback and before the next checkpoint (step 150): the run
    # hangs at step 145, which only the steps after the rollback reach (139 steps before it,
    # 126 to 144 after).
    LLMTRAIN_INJECT_FAULT=spike:140:30,hang:0:145 train killed "${common[@]}" &
    for _ in $(seq 2400); do
        [ "$(grep -c '"event":"step"' "$scratch/killed/log.jsonl" 2>/dev/null)" -ge 158 ] && break
        sleep 0.05
    done
    sleep 0.5
    pkill -KILL -f -- "--run-dir $scratch/killed"
    wait
    [ -e "$scratch/killed-checkpoints/step_00000150" ] && fail "the kill came after the next checkpoint"
    "$bin" train "${common[@]}" --set checkpoint.dir=\""$scratch/killed-checkpoints"\" --run-dir "$scratch/resumed" --resume auto >"$scratch/resumed.out" 2>&1 ||
        fail "the resumed run failed: $(tail -3 "$scratch/resumed.out")"
    grep -q "resumed from '[^']*step_00000125' at step 125" "$scratch/resumed.out" || fail "not resumed from step 125: $(grep resumed "$scratch/resumed.out")"
    grep -q "health: in force from before the checkpoint: 1 rollback(s), of step 140" "$scratch/resumed.out" || fail "the resumed run does not say a rollback is counted"
    [ "$(events resumed)" = 0 ] || fail "the resumed run met the skipped data again: $(cat "$scratch/resumed/anomalies.jsonl")"
    figures "$scratch/reference/log.jsonl" >"$scratch/reference.figures"
    figures "$scratch/resumed/log.jsonl" >"$scratch/resumed.figures"
    grep -Fxf "$scratch/resumed.figures" "$scratch/reference.figures" | sort -n | uniq | cmp -s - "$scratch/resumed.figures" ||
        fail "the resumed steps differ from the run that was not killed"
    for file in "$scratch/reference-checkpoints/step_00000200"/rank_*.h5; do
        h5diff -q "$file" "$scratch/killed-checkpoints/step_00000200/$(basename "$file")" || fail "final weights or moments differ"
    done
    # The rest of the state: tokens seen, AdamW's step count, the data cursor, the monitor's windows
    # (not the resume count, nor the run's identity and the manifest's checksum over it, which
    # tell the two runs apart by design).
    state() { grep -v '"created"\|"xxh64"\|"bytes"\|"config"\|"resumes"\|"run_id"\|"run_directory"\|"sequence"\|"manifest_xxh64"' "$1/step_00000200/manifest.json"; }
    cmp -s <(state "$scratch/reference-checkpoints") <(state "$scratch/killed-checkpoints") ||
        fail "the final manifests differ: $(diff <(state "$scratch/reference-checkpoints") <(state "$scratch/killed-checkpoints") | head -5)"
    echo "ok: killed after the rollback, resumed at step 125 with the data skipped; $(wc -l <"$scratch/resumed.figures") steps and the final state bitwise the reference's"
    ;;
nan_8_ranks)
    common=("${tiny[@]}" --set train.steps=12 --set train.global_batch_size=16 --set parallel.tp=2 --set parallel.pp=2 --set monitor.on_nonfinite=\"skip\"
            --set checkpoint.every_steps=12)
    for rank in 5 0; do
        LLMTRAIN_INJECT_FAULT=nan:$rank:6 "$mpiexec" --oversubscribe -np 8 "$bin" train "${common[@]}" --set checkpoint.dir=\""$scratch/nan$rank-checkpoints"\" \
            --run-dir "$scratch/nan$rank" >"$scratch/nan$rank.out" 2>&1 || fail "the run with a NaN on rank $rank failed: $(tail -5 "$scratch/nan$rank.out")"
        [ "$(events nan$rank)" = 1 ] && grep -q '"action":"skip".*"kind":"nonfinite".*"step":6,' "$scratch/nan$rank/anomalies.jsonl" ||
            fail "rank $rank's NaN: not one nonfinite event skipped at step 6: $(cat "$scratch/nan$rank/anomalies.jsonl")"
        grep '"event":"step"' "$scratch/nan$rank/log.jsonl" | grep '"step":\(1[0-2]\|[7-9]\),' | grep -q '"loss":null\|"grad_norm":null' && fail "non-finite figures after the skip"
    done
    figures "$scratch/nan5/log.jsonl" >"$scratch/nan5.figures"
    figures "$scratch/nan0/log.jsonl" >"$scratch/nan0.figures"
    cmp -s "$scratch/nan5.figures" "$scratch/nan0.figures" || fail "a NaN on rank 5 and on rank 0 gave other runs: some rank did not skip"
    for file in "$scratch/nan0-checkpoints/step_00000012"/rank_*.h5; do
        h5diff -q "$file" "$scratch/nan5-checkpoints/step_00000012/$(basename "$file")" || fail "final weights of $(basename "$file") differ"
    done
    final=$(final_val_loss nan5)
    awk -v v="$final" 'BEGIN { exit !(v + 0 == v && v < 100) }' || fail "final validation loss $final is not finite"
    echo "ok: the NaN on rank 5 was skipped at step 6 by every rank; final weights those of the NaN on rank 0, validation loss $final"
    ;;
rerun_4_ranks)
    common=("${tiny[@]}" --set train.steps=40 --set monitor.window=10 --set monitor.warmup_steps=10 --set monitor.rerun_on_anomaly=true)
    LLMTRAIN_INJECT_FAULT=bitflip:2:30 "$mpiexec" --oversubscribe -np 4 "$bin" train "${common[@]}" --run-dir "$scratch/bitflip" >"$scratch/bitflip.out" 2>&1
    status=$?
    [ "$status" = 76 ] || fail "the bit flip exited $status, expected 76: $(tail -5 "$scratch/bitflip.out")"
    grep -q "suspected silent data corruption on rank 2 (host [^,]*, cpu)" "$scratch/bitflip.out" || fail "rank 2 not named: $(tail -5 "$scratch/bitflip.out")"
    grep -q '"action":"exclude_node".*"kind":"transient_fault".*"step":30,' "$scratch/bitflip/anomalies.jsonl" || fail "no transient_fault record"
    LLMTRAIN_INJECT_FAULT=spike:30:30 "$mpiexec" --oversubscribe -np 4 "$bin" train "${common[@]}" --run-dir "$scratch/spike" >"$scratch/spike.out" 2>&1 ||
        fail "the run with a real spike failed: $(tail -5 "$scratch/spike.out")"
    grep -q '"action":"skip".*reproduced it bitwise.*"kind":"\(loss\|grad\)_spike".*"step":30,' "$scratch/spike/anomalies.jsonl" ||
        fail "the spike was not classified real: $(cat "$scratch/spike/anomalies.jsonl")"
    echo "ok: the bit flip named rank 2 (exit 76); the spike met again on the re-run was real and skipped"
    ;;
*) fail "unknown scenario $scenario" ;;
esac
