#!/usr/bin/env bash
# checkpoint_readers.sh SCENARIO SCRATCH LLMTRAIN CONFIG [--set ...]: what reads a checkpoint.
#   verify_first    one byte flipped outside the tensor chunks (the rank file's header, where
#                   HDF5 still reads it) and, apart, a manifest whose `step` was edited: eval,
#                   generate, checkpoint inspect, checkpoint export, train.init_from and
#                   --resume each refuse them (exit 2, naming the checksum) before reading.
#   export_hf       export writes a Hugging Face directory: model.safetensors, config.json,
#                   the run's tokenizer.json (the dataset's own, the same ids) and
#                   tokenizer_config.json; a non-empty output is refused without --force,
#                   --force replaces an earlier export but never a directory of other files;
#                   train.init_from reads the export back and refuses it once a byte of its
#                   data is flipped.
#   eval_other_format eval of a shards run on --data in another format (nanoGPT's .bin, the same
#                   tokenizer's ids) gives bits per byte through the run's own tokenizer.
#   eval_repeats    a validation split of a few hundred tokens: the run and eval warn when
#                   asked more sequences than it holds distinct, say how many it holds, and
#                   eval reports the count (text and --json); asked no more, neither warns.
#   generate_document_start generate puts the prompt after the end-of-text token (a new
#                   document) and says so; --no-document-start gives the prompt alone (one
#                   token fewer), and an empty prompt with it is refused; --help tells both.
#   resume_summary  the end-of-run val loss line: first -> last for a fresh run; a resumed run
#                   with one evaluation gives it once, with several its first and last, each
#                   saying where it resumed.
set -u
scenario=$1 scratch=$2 bin=$3
shift 3
rm -rf "$scratch"
mkdir -p "$scratch"
# Runs that are not meant to save save nothing (the config's own checkpoint.dir stays untouched).
config=("$@" --set train.sample_tokens=0 --set train.log_every=1000 --set checkpoint.every_steps=0)
fail() { echo "FAIL: $*"; exit 1; }

# A run of 4 steps saving at 4 into $scratch/ck (more --set after the config's).
saved_run() {
    "$bin" train "${config[@]}" "$@" --set train.steps=4 --set checkpoint.every_steps=4 --set checkpoint.dir=\""$scratch/ck"\" --run-dir "$scratch/saved" \
        >"$scratch/saved.out" 2>&1 || fail "the saving run failed: $(tail -3 "$scratch/saved.out")"
}

# expect_ok WHAT COMMAND...: exit 0, stdout in reader.out, stderr in reader.err.
expect_ok() {
    local what=$1
    shift
    "$@" >"$scratch/reader.out" 2>"$scratch/reader.err" || fail "$what: exit $?: $(tail -3 "$scratch/reader.err")"
}

# expect_refused WHAT PATTERN COMMAND...: exit 2 and PATTERN on stderr.
expect_refused() {
    local what=$1 pattern=$2
    shift 2
    "$@" >"$scratch/reader.out" 2>&1
    local status=$?
    [ "$status" -eq 2 ] && grep -q -- "$pattern" "$scratch/reader.out" || fail "$what: exit $status: $(tail -3 "$scratch/reader.out")"
}

readers_refuse() {  # CHECKPOINT PATTERN
    local checkpoint=$1 pattern=$2
    expect_refused "eval" "$pattern" "$bin" eval "$checkpoint"
    expect_refused "generate" "$pattern" "$bin" generate "$checkpoint" --max-tokens 4
    expect_refused "checkpoint inspect" "$pattern" "$bin" checkpoint inspect "$checkpoint"
    expect_refused "checkpoint export" "$pattern" "$bin" checkpoint export "$checkpoint" "$scratch/export-$RANDOM"
    expect_refused "train.init_from" "$pattern" "$bin" train "${config[@]}" --set train.steps=1 --set train.init_from=\""$checkpoint"\" --run-dir "$scratch/init-$RANDOM"
    expect_refused "--resume" "$pattern" "$bin" train "${config[@]}" --set train.steps=8 --set checkpoint.dir=\""$scratch/ck-$RANDOM"\" --resume "$checkpoint" \
        --run-dir "$scratch/resume-$RANDOM"
}

case $scenario in
verify_first)
    saved_run
    flipped=$scratch/flipped/step_00000004
    mkdir -p "$scratch/flipped" && cp -r "$scratch/ck/step_00000004" "$flipped"
    # Byte 1000: the HDF5 header's attribute area, outside every tensor chunk (HDF5 reads on).
    printf '\x5a' | dd of="$flipped/rank_00000.h5" bs=1 seek=1000 conv=notrunc status=none
    readers_refuse "$flipped" "rank_00000.h5' fails its XXH64 checksum"
    echo "ok   a byte flipped outside the tensor chunks: eval, generate, inspect, export, init_from and --resume refuse it"
    edited=$scratch/edited/step_00000004
    mkdir -p "$scratch/edited" && cp -r "$scratch/ck/step_00000004" "$edited"
    sed -i 's/"step": 4,/"step": 3,/' "$edited/manifest.json"
    grep -q '"step": 3,' "$edited/manifest.json" || fail "the manifest's step was not edited"
    readers_refuse "$edited" "manifest.json' fails its own checksum"
    echo "ok   a manifest whose step was edited: every reader refuses it (its own checksum)"
    "$bin" eval "$scratch/ck/step_00000004" >/dev/null 2>&1 || fail "eval of the intact checkpoint failed"
    ;;
export_hf)
    saved_run
    dataset_tokenizer=$(sed -n 's/^train_path = "\(.*\)\/dataset.json".*/\1/p' "$scratch/saved/config.toml")/tokenizer.json
    [ -f "$dataset_tokenizer" ] || fail "the run's dataset has no tokenizer.json ($dataset_tokenizer)"
    out=$scratch/hf checkpoint=$scratch/ck/step_00000004
    mkdir -p "$out" && echo "my notes" >"$out/notes.txt"
    expect_refused "export into a non-empty directory" "output directory '$out' is not empty .*--force" "$bin" checkpoint export "$checkpoint" "$out"
    expect_refused "--force over a directory that is not an export" "holds no model.safetensors or config.json" "$bin" checkpoint export "$checkpoint" "$out" --force
    [ "$(ls "$out")" = notes.txt ] || fail "the refused exports touched $out: $(ls "$out")"
    echo "ok   a non-empty output is refused without --force, and --force does not replace a directory of other files"
    rm -r "$out"
    "$bin" checkpoint export "$checkpoint" "$out" >"$scratch/export.out" 2>&1 || fail "export failed: $(cat "$scratch/export.out")"
    for file in model.safetensors config.json tokenizer.json tokenizer_config.json; do [ -s "$out/$file" ] || fail "the export has no $file"; done
    grep -q '"tokenizer_class": "PreTrainedTokenizerFast"' "$out/tokenizer_config.json" || fail "tokenizer_config.json: $(cat "$out/tokenizer_config.json")"
    grep -q '"eos_token_id"' "$out/config.json" || fail "config.json names no eos_token_id"
    text="Fortune favours the bold; a fool and his money are soon parted."
    [ "$("$bin" tokenizer encode --tokenizer "$out" --text "$text")" = "$("$bin" tokenizer encode --tokenizer "$dataset_tokenizer" --text "$text")" ] ||
        fail "the exported tokenizer.json encodes otherwise than the dataset's"
    echo "ok   the export holds $(ls "$out" | tr '\n' ' ')and its tokenizer encodes as the dataset's"
    expect_refused "export over an earlier export without --force" "is not empty" "$bin" checkpoint export "$checkpoint" "$out"
    # A run directory names its own newest checkpoint, here the same.
    "$bin" checkpoint export "$scratch/saved" "$out" --force >"$scratch/export2.out" 2>&1 || fail "export --force over the earlier export: $(cat "$scratch/export2.out")"
    ls "$out"/*.llmtrain-staging >/dev/null 2>&1 && fail "a staging directory was left"
    echo "ok   --force replaces the earlier export"
    "$bin" train "${config[@]}" --set train.steps=1 --set train.init_from=\""$out"\" --run-dir "$scratch/from-export" >"$scratch/from-export.out" 2>&1 ||
        fail "init_from the export failed: $(tail -2 "$scratch/from-export.out")"
    size=$(stat -c %s "$out/model.safetensors")
    printf '\x5a' | dd of="$out/model.safetensors" bs=1 seek=$((size - 100)) conv=notrunc status=none
    expect_refused "init_from a damaged export" "model.safetensors' fails its data checksum" \
        "$bin" train "${config[@]}" --set train.steps=1 --set train.init_from=\""$out"\" --run-dir "$scratch/from-damaged"
    echo "ok   train.init_from reads the export, and refuses it once a byte of its data is flipped"
    ;;
eval_other_format)
    saved_run
    tokenizer=$(sed -n 's/^train_path = "\(.*\)\/dataset.json".*/\1/p' "$scratch/saved/config.toml")/tokenizer.json
    head -c 200000 data/fortunes.txt >"$scratch/slice.txt"
    "$bin" prepare --tokenizer "$tokenizer" --input "$scratch/slice.txt" --separator '\n%\n' --output-format nanogpt --output "$scratch/nano" \
        >"$scratch/prepare.out" 2>&1 || fail "prepare --output-format nanogpt failed: $(tail -2 "$scratch/prepare.out")"
    "$bin" eval "$scratch/saved" --data "$scratch/nano/train.bin" --format nanogpt --sequences 4 >"$scratch/eval.out" 2>&1 ||
        fail "eval --format nanogpt failed: $(cat "$scratch/eval.out")"
    grep -Eq "bits per byte [0-9.]+$" "$scratch/eval.out" || fail "no bits per byte: $(tail -1 "$scratch/eval.out")"
    echo "ok   eval --format nanogpt of a shards run: $(tail -1 "$scratch/eval.out")"
    ;;
eval_repeats)
    # About 500 validation tokens: a few dozen windows of train.seq_len tokens.
    saved_run --set data.val_fraction=0.0002 --set train.eval_sequences=48
    distinct=$(sed -n 's/.*validation: 48 sequences of 16 tokens asked, but the validation data holds \([0-9]*\) distinct ones: the other [0-9]* wrap around.*/\1/p' \
        "$scratch/saved.out")
    [ -n "$distinct" ] && [ "$distinct" -lt 48 ] || fail "the run does not warn that 48 validation sequences repeat: $(grep -i validation "$scratch/saved.out")"
    echo "ok   the run warns: $(grep 'validation: 48' "$scratch/saved.out")"
    expect_ok "eval --sequences 48 --json" "$bin" eval "$scratch/ck" --sequences 48 --json
    grep -q "eval: validation: 48 sequences of 16 tokens asked, but the validation data holds $distinct distinct ones: the other $((48 - distinct)) wrap around" \
        "$scratch/reader.err" || fail "eval --sequences 48 does not warn: $(cat "$scratch/reader.err")"
    grep -q "\"distinct_sequences\":$distinct," "$scratch/reader.out" && grep -q '"sequences":48,' "$scratch/reader.out" ||
        fail "eval --json lacks distinct_sequences $distinct: $(cat "$scratch/reader.out")"
    expect_ok "eval --sequences 48" "$bin" eval "$scratch/ck" --sequences 48
    grep -Eq "^48 sequences \($distinct distinct, repeated\) x 16 tokens \| loss [0-9.]+" "$scratch/reader.out" || fail "eval's text: $(tail -1 "$scratch/reader.out")"
    echo "ok   eval --sequences 48 warns and reports $distinct distinct: $(tail -1 "$scratch/reader.out")"
    expect_ok "eval --sequences $distinct --json" "$bin" eval "$scratch/ck" --sequences "$distinct" --json
    grep -q "wrap around" "$scratch/reader.err" && fail "eval --sequences $distinct warns: $(cat "$scratch/reader.err")"
    grep -q "\"distinct_sequences\":$distinct," "$scratch/reader.out" && grep -q "\"sequences\":$distinct," "$scratch/reader.out" ||
        fail "eval --sequences $distinct --json: $(cat "$scratch/reader.out")"
    expect_ok "eval --sequences $((distinct + 1))" "$bin" eval "$scratch/ck" --sequences $((distinct + 1))
    grep -q "holds $distinct distinct ones: the other 1 wrap around" "$scratch/reader.err" || fail "eval --sequences $((distinct + 1)) does not warn"
    echo "ok   $distinct sequences: no warning; $((distinct + 1)): warned"
    ;;
generate_document_start)
    saved_run
    greedy=(--prompt "The " --max-tokens 8 --temperature 0)
    expect_ok "generate" "$bin" generate "$scratch/ck" "${greedy[@]}"
    grep -q "prompt: 5 tokens, after <|eos|> (a new document; --no-document-start continues it mid-document)" "$scratch/reader.err" ||
        fail "generate does not say the prompt follows the end-of-text token: $(cat "$scratch/reader.err")"
    expect_ok "generate --no-document-start" "$bin" generate "$scratch/ck" "${greedy[@]}" --no-document-start
    grep -q "| prompt: 4 tokens$" "$scratch/reader.err" || fail "generate --no-document-start: $(cat "$scratch/reader.err")"
    echo "ok   the prompt 'The ' is 5 tokens after <|eos|>, 4 with --no-document-start"
    expect_ok "generate with an empty prompt" "$bin" generate "$scratch/ck" --max-tokens 4
    grep -q "prompt: 1 token, after <|eos|>" "$scratch/reader.err" || fail "generate with no prompt: $(cat "$scratch/reader.err")"
    expect_refused "an empty prompt with --no-document-start" "--prompt: no tokens to start from (--no-document-start: give a prompt)" \
        "$bin" generate "$scratch/ck" --max-tokens 4 --no-document-start
    expect_ok "generate --help" "$bin" generate --help
    grep -q "end-of-text token" "$scratch/reader.out" && grep -q -- "--no-document-start" "$scratch/reader.out" || fail "generate --help: $(cat "$scratch/reader.out")"
    echo "ok   an empty prompt starts from <|eos|> alone, and is refused with --no-document-start; --help tells both"
    ;;
resume_summary)
    saved_run
    grep -Eq "val loss: [0-9.]+ at step 0 -> [0-9.]+ at step 4$" "$scratch/saved.out" || fail "the fresh run's summary: $(grep 'val loss: ' "$scratch/saved.out")"
    from=$scratch/ck/step_00000004
    expect_ok "the resume evaluated once" "$bin" train "${config[@]}" --set train.steps=6 --resume "$from" --set checkpoint.dir=\""$scratch/ck-once"\" \
        --run-dir "$scratch/resumed-once"
    line=$(grep "val loss: " "$scratch/reader.out")
    echo "$line" | grep -Eq "val loss: [0-9.]+ at step 6 \(this run's one evaluation; it resumed at step 4\)$" || fail "one evaluation after a resume: $line"
    expect_ok "the resume evaluated twice" "$bin" train "${config[@]}" --set train.steps=6 --set train.eval_every=1 --resume "$from" \
        --set checkpoint.dir=\""$scratch/ck-twice"\" --run-dir "$scratch/resumed-twice"
    line=$(grep "val loss: " "$scratch/reader.out")
    echo "$line" | grep -Eq "val loss: [0-9.]+ at step 5 -> [0-9.]+ at step 6 \(this run's first and last evaluations; it resumed at step 4\)$" ||
        fail "two evaluations after a resume: $line"
    echo "ok   fresh: $(grep 'val loss: ' "$scratch/saved.out" | sed 's/.*val loss: //'); resumed twice: ${line#*val loss: }"
    ;;
*) fail "unknown scenario '$scenario'" ;;
esac
