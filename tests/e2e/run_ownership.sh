#!/usr/bin/env bash
# run_ownership.sh SCENARIO SCRATCH LLMTRAIN [SUPERVISOR] CONFIG [--set ...]: a checkpoint
# chain and a run directory belong to their run.
#   fresh_run_refused   run A leaves steps 5, 10, 15 in ck/; run B, fresh, into the same
#                       checkpoint.dir is refused before it writes anything (exit 2, naming the
#                       directory, run A and the flags), ck/ and `latest` are as A left them;
#                       A continued with --resume auto extends its own chain and its retention
#                       deletes only its own oldest.
#   run_dir_own         a run that saved no checkpoint shares checkpoint.dir with one that did:
#                       generate, eval and export on its run directory refuse (exit 2, saying it
#                       saved none) instead of loading the other run's model; on the other run's
#                       directory they load that run's own checkpoint.
#   same_command        a run started with --resume auto --run-dir R crashes at step 12; the
#                       same command line again continues in R from step 10: log.jsonl gets one
#                       `resume` record and the rest of the steps, console.log both attempts,
#                       config.toml stays as written; a third time it has nothing to do.
#   supervisor          llmtrain-supervise with one --run-dir: the attempt that crashes and
#                       the one that finishes write the same run directory.
set -u
scenario=$1 scratch=$2 bin=$3
shift 3
supervisor=""
if [ "$scenario" = supervisor ]; then supervisor=$1; shift; fi
rm -rf "$scratch"
mkdir -p "$scratch"
config=("$@" --set train.sample_tokens=0 --set train.log_every=1000)
fail() { echo "FAIL: $*"; exit 1; }
listing() { (cd "$1" && ls | tr '\n' ' '); }
run_id_of() { sed -n 's/.*"run_id":"\([0-9a-f]*\)".*/\1/p' "$1/log.jsonl" | head -1; }

case $scenario in
fresh_run_refused)
    ck=$scratch/ck
    "$bin" train "${config[@]}" --set train.steps=15 --set checkpoint.every_steps=5 --set checkpoint.dir=\""$ck"\" --run-dir "$scratch/a" \
        >"$scratch/a.out" 2>&1 || fail "run A failed: $(tail -2 "$scratch/a.out")"
    before=$(listing "$ck") latest=$(cat "$ck/latest") run_a=$(run_id_of "$scratch/a")
    "$bin" train "${config[@]}" --set train.steps=15 --set checkpoint.every_steps=2 --set checkpoint.dir=\""$ck"\" --run-dir "$scratch/b" \
        >"$scratch/b.out" 2>&1
    status=$?
    [ "$status" -eq 2 ] || fail "run B into run A's checkpoint.dir: exit $status, expected 2: $(tail -3 "$scratch/b.out")"
    [ -n "$run_a" ] || fail "run A's log.jsonl records no run id"
    grep -q "^llmtrain: config error: checkpoint.dir '$ck' holds the checkpoints of another run (run $run_a: steps 5 to 15 .*--resume auto.*--set checkpoint.dir=DIR" \
        "$scratch/b.out" || fail "the refusal does not name the directory, run A and the flags: $(cat "$scratch/b.out")"
    [ "$(listing "$ck")" = "$before" ] && [ "$(cat "$ck/latest")" = "$latest" ] || fail "run B changed ck/: $(listing "$ck"), latest $(cat "$ck/latest")"
    [ ! -e "$scratch/b" ] || fail "run B left a run directory"
    echo "ok   a fresh run into run A's checkpoint.dir: exit 2, ck/ untouched ($before)"
    "$bin" train "${config[@]}" --set train.steps=25 --set checkpoint.every_steps=5 --set checkpoint.dir=\""$ck"\" --run-dir "$scratch/a2" --resume auto \
        >"$scratch/a2.out" 2>&1 || fail "run A continued failed: $(tail -2 "$scratch/a2.out")"
    [ "$(listing "$ck")" = "latest step_00000015 step_00000020 step_00000025 " ] || fail "A's retention kept $(listing "$ck")"
    [ "$(cat "$ck/latest")" = step_00000025 ] || fail "latest names $(cat "$ck/latest")"
    for m in "$ck"/step_*/manifest.json; do grep -q "\"run_id\": \"$run_a\"" "$m" || fail "$m is not run A's"; done
    [ "$(run_id_of "$scratch/a2")" = "$run_a" ] || fail "the continued run has another id"
    echo "ok   run A continued with --resume auto: its chain is $(listing "$ck")(run $run_a throughout)"
    ;;
run_dir_own)
    ck=$scratch/ck
    "$bin" train "${config[@]}" --set train.steps=6 --set checkpoint.every_steps=3 --set checkpoint.dir=\""$ck"\" --run-dir "$scratch/saved" \
        >"$scratch/saved.out" 2>&1 || fail "the saving run failed: $(tail -2 "$scratch/saved.out")"
    "$bin" train "${config[@]}" --set train.steps=2 --set checkpoint.dir=\""$ck"\" --run-dir "$scratch/m1" >"$scratch/m1.out" 2>&1 ||
        fail "the run without checkpoints failed: $(tail -2 "$scratch/m1.out")"
    for command in "generate $scratch/m1 --max-tokens 4" "eval $scratch/m1" "checkpoint export $scratch/m1 $scratch/m1-hf"; do
        # shellcheck disable=SC2086
        "$bin" $command >"$scratch/own.out" 2>&1
        status=$?
        [ "$status" -eq 2 ] && grep -q "run directory '$scratch/m1' (run [0-9a-f]*) saved no checkpoint (checkpoint.every_steps = 0)" "$scratch/own.out" ||
            fail "'llmtrain $command': exit $status: $(cat "$scratch/own.out")"
    done
    echo "ok   generate, eval and export on a run directory without checkpoints: exit 2, 'saved no checkpoint'"
    "$bin" generate "$scratch/saved" --max-tokens 4 2>"$scratch/saved-generate.err" >/dev/null || fail "generate on the saving run: $(cat "$scratch/saved-generate.err")"
    grep -q "checkpoint '$ck/step_00000006' (step 6)" "$scratch/saved-generate.err" || fail "generate took $(cat "$scratch/saved-generate.err")"
    echo "ok   generate on the saving run's directory loads its own $ck/step_00000006"
    ;;
same_command)
    run=$scratch/run
    # Synchronous saves: step 10's is committed when the crash comes at step 12.
    command=(train "${config[@]}" --set train.steps=30 --set checkpoint.every_steps=5 --set checkpoint.async=false --set checkpoint.dir=\""$scratch/ck"\"
             --run-dir "$run" --resume auto)
    LLMTRAIN_INJECT_FAULT=exit:0:12 "$bin" "${command[@]}" >"$scratch/first.out" 2>&1
    [ $? -eq 1 ] || fail "the first attempt did not crash at step 12: $(tail -2 "$scratch/first.out")"
    config_before=$(md5sum <"$run/config.toml")
    "$bin" "${command[@]}" >"$scratch/second.out" 2>&1 || fail "the same command again failed: $(tail -3 "$scratch/second.out")"
    grep -q "resumed from '$scratch/ck/step_00000010' at step 10" "$scratch/second.out" || fail "not resumed from step 10: $(grep -i resum "$scratch/second.out")"
    [ "$(grep -c '"event":"start"' "$run/log.jsonl")" = 1 ] && [ "$(grep -c '"event":"resume"' "$run/log.jsonl")" = 1 ] &&
        [ "$(grep -c '"event":"end"' "$run/log.jsonl")" = 1 ] || fail "log.jsonl records: $(grep -o '"event":"[a-z]*"' "$run/log.jsonl" | sort | uniq -c | tr '\n' ' ')"
    grep '"event":"resume"' "$run/log.jsonl" | grep -q '"step":10' || fail "the resume record does not say step 10"
    [ "$(grep -c '"event":"step"' "$run/log.jsonl")" -ge 30 ] || fail "the steps of both attempts are not all in log.jsonl"
    [ "$(grep -c "| run directory $run" "$run/console.log")" = 2 ] || fail "console.log does not hold both attempts"
    [ "$(md5sum <"$run/config.toml")" = "$config_before" ] || fail "config.toml was rewritten"
    echo "ok   the same command continued in $run: $(grep -o '"event":"[a-z]*"' "$run/log.jsonl" | grep -v step | tr '\n' ' ')"
    "$bin" "${command[@]}" >"$scratch/third.out" 2>&1 || fail "a third time: $(tail -2 "$scratch/third.out")"
    grep -q "is at step 30: train.steps = 30 is reached already" "$scratch/third.out" || fail "a third time: $(cat "$scratch/third.out")"
    grep -q "next: llmtrain generate $run " "$scratch/third.out" || fail "a finished run does not say how to use it: $(cat "$scratch/third.out")"
    echo "ok   a third time: nothing to train; it prints the generate / eval / export lines"
    ;;
supervisor)
    run=$scratch/run
    # The fault's step is "0{attempt}12": step 12 in attempt 0, step 112 (never) after.
    "$supervisor" --backoff 0 --max-restarts 2 -- env "LLMTRAIN_INJECT_FAULT=exit:0:{attempt}12" "$bin" train "${config[@]}" --set train.steps=30 \
        --set checkpoint.every_steps=5 --set checkpoint.async=false --set checkpoint.dir=\""$scratch/ck"\" --run-dir "$run" >"$scratch/supervise.out" 2>&1 ||
        fail "the supervised run failed: $(tail -3 "$scratch/supervise.out")"
    grep -q "attempt 1: .*--run-dir $run " "$scratch/supervise.out" || fail "no second attempt in $run: $(grep attempt "$scratch/supervise.out")"
    [ "$(grep -c '"event":"start"' "$run/log.jsonl")" = 1 ] && [ "$(grep -c '"event":"resume"' "$run/log.jsonl")" = 1 ] &&
        [ "$(grep -c '"event":"end"' "$run/log.jsonl")" = 1 ] || fail "log.jsonl records: $(grep -o '"event":"[a-z]*"' "$run/log.jsonl" | sort | uniq -c | tr '\n' ' ')"
    echo "ok   the supervisor's restart continued in $run: $(grep -o '"event":"[a-z]*"' "$run/log.jsonl" | grep -v step | tr '\n' ' ')"
    ;;
*) fail "unknown scenario '$scenario'" ;;
esac
