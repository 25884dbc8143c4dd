#!/usr/bin/env bash
# corrupt_block.sh MODE SCRATCH LLMTRAIN MPIEXEC: a tiny dataset (3 shards of 256-token blocks,
# prepared from the fortunes corpus with the quick start's tokenizer) with one byte flipped
# inside the payload of block 5 of train-00001.ltshard (the middle of its zstd frame).
#   verify  `data verify` exits 0 on the clean dataset and 2 on the corrupt one, naming the shard
#           and the block, alone and on 2 ranks; `doctor --data` fails on it (data.blocks FAIL,
#           exit 2) and passes on the clean one
#   train   data.on_corrupt_block = "skip": a run finishes on 1 rank and on 2 ranks (dp 2, tp 2,
#           pp 2; the same global batch), each logging the same corrupt_block record and
#           replacing samples at the same steps; a run resumed from a checkpoint before the block was met logs
#           it again at the same step; "abort" exits 2 naming the shard and the block
set -u
mode=$1 scratch=$2 bin=$3 mpiexec=$4
rm -rf "$scratch"
mkdir -p "$scratch"
fail() { echo "FAIL: $*"; exit 1; }
mpi=("$mpiexec" --oversubscribe -np 2 "$bin")

head -c 30000 data/fortunes.txt >"$scratch/corpus.txt"
"$bin" prepare --tokenizer data/fortunes-bpe/tokenizer.json --input "$scratch/corpus.txt" --separator '\n%\n' --output "$scratch/clean" \
    --block-tokens 256 --unit-mb 0.01 --threads 1 >"$scratch/prepare.out" 2>&1 || fail "prepare: $(tail -3 "$scratch/prepare.out")"
[ -f "$scratch/clean/train-00002.ltshard" ] || fail "expected 3 training shards: $(ls "$scratch/clean")"
cp -r "$scratch/clean" "$scratch/corrupt"
shard=$scratch/corrupt/train-00001.ltshard
# The header's block and document counts locate the payload; the byte flipped lies halfway
# through block 5's frame, away from its frame header.
python3 - "$shard" 5 <<'EOF' || fail "could not flip a byte of $shard"
import struct, sys
path, block = sys.argv[1], int(sys.argv[2])
data = bytearray(open(path, 'rb').read())
documents, = struct.unpack_from('<Q', data, 32)
blocks, = struct.unpack_from('<I', data, 44)
offsets = struct.unpack_from('<%dQ' % (blocks + 1), data, 64)
payload = 64 + 8 * (blocks + 1) + 8 * (documents + 1)
data[payload + (offsets[block] + offsets[block + 1]) // 2] ^= 0x10
open(path, 'wb').write(data)
EOF
named="shard '$shard': block 5 at byte offset [0-9]* (tokens \[1280, 1536))"

# run NAME COMMAND...: its output into $scratch/NAME.out; its exit status.
run() {
    local name=$1
    shift
    "$@" >"$scratch/$name.out" 2>&1
}
expect_status() {  # NAME WANTED STATUS
    [ "$3" = "$2" ] || fail "$1 exited $3, expected $2: $(tail -5 "$scratch/$1.out")"
}

case $mode in
verify)
    run verify_clean "$bin" data verify "$scratch/clean"
    expect_status verify_clean 0 $?
    grep -q "3 shard(s), .* every block checks" "$scratch/verify_clean.out" || fail "no clean summary: $(cat "$scratch/verify_clean.out")"
    run verify_corrupt "$bin" data verify "$scratch/corrupt/dataset.json" --threads 2
    expect_status verify_corrupt 2 $?
    grep -q "^corrupt: $named: zstd: " "$scratch/verify_corrupt.out" || fail "the corrupt block is not named: $(cat "$scratch/verify_corrupt.out")"
    [ "$(grep -c '^corrupt: ' "$scratch/verify_corrupt.out")" = 1 ] || fail "more than the flipped block reported: $(cat "$scratch/verify_corrupt.out")"
    grep -q "1 corrupt block(s) or shard(s)" "$scratch/verify_corrupt.out" || fail "no summary: $(cat "$scratch/verify_corrupt.out")"
    # Two ranks of one thread share the blocks; rank 0 prints the job's report, every rank exits 2.
    run verify_2_ranks "${mpi[@]}" data verify "$scratch/corrupt" --threads 1
    expect_status verify_2_ranks 2 $?
    grep -q "^corrupt: $named: zstd: " "$scratch/verify_2_ranks.out" || fail "2 ranks: the corrupt block is not named: $(cat "$scratch/verify_2_ranks.out")"
    grep -q "3 shard(s), 52 block(s), .* on 2 rank(s) x 1 thread(s): 1 corrupt" "$scratch/verify_2_ranks.out" ||
        fail "2 ranks: not every block counted once: $(grep 'data verify' "$scratch/verify_2_ranks.out")"
    doctor=("$bin" doctor configs/tiny-bpe.toml --set train.threads=1 --set checkpoint.dir=\""$scratch/doctor-checkpoints"\" --io-mb 4 --data)
    run doctor_corrupt "${doctor[@]}" --set data.train_path=\""$scratch/corrupt/dataset.json"\"
    expect_status doctor_corrupt 2 $?
    grep -q "^data.blocks  *FAIL  *$named" "$scratch/doctor_corrupt.out" || fail "doctor --data does not fail naming the block: $(grep data "$scratch/doctor_corrupt.out")"
    run doctor_clean "${doctor[@]}" --set data.train_path=\""$scratch/clean/dataset.json"\"
    grep -q "^data.blocks  *PASS  *every block checks: 3 shard(s), 52 block(s)" "$scratch/doctor_clean.out" ||
        fail "doctor --data does not pass the clean dataset: $(grep data "$scratch/doctor_clean.out")"
    echo "ok: data verify names shard and block (exit 2) alone and on 2 ranks, passes the clean dataset (exit 0); doctor --data fails on it"
    ;;
train)
    tiny=(train configs/tiny-bpe.toml --set model.n_layers=1 --set model.d_model=16 --set model.n_heads=2 --set model.max_seq_len=16
          --set train.seq_len=16 --set train.batch_size=4 --set train.global_batch_size=8 --set train.steps=40 --set train.eval_every=0
          --set train.eval_sequences=4 --set train.sample_tokens=0 --set train.threads=1 --set train.log_every=10 --set optimizer.warmup_steps=5
          --set data.train_path=\""$scratch/corrupt/dataset.json"\")
    skip=("${tiny[@]}" --set data.on_corrupt_block=\"skip\" --set checkpoint.every_steps=5 --set checkpoint.keep_last=10)
    # train NAME LAUNCH... ARGS...: a run into $scratch/NAME with its own checkpoint.dir.
    train() {
        local name=$1
        shift
        run "$name" "$@" --set checkpoint.dir=\""$scratch/$name-checkpoints"\" --run-dir "$scratch/$name"
    }
    # What a run logged of the corrupt data: its corrupt_block records and the steps that
    # replaced samples, without the times.
    skips() {
        grep '"event":"corrupt_block"' "$scratch/$1/log.jsonl" | sed -E 's/,?"time":"[^"]*"//'
        grep '"event":"step"' "$scratch/$1/log.jsonl" | grep -o '"samples_replaced":[0-9]*,.*"step":[0-9]*' | sed -E 's/"skipped":[a-z]*,//'
    }
    train abort "$bin" "${tiny[@]}"
    expect_status abort 2 $?
    grep -q "data error: corrupt training data (sample [0-9]*): $named: zstd: .*data.on_corrupt_block = \"abort\" stops here" "$scratch/abort.out" ||
        fail "abort: no error naming the shard and the block: $(tail -2 "$scratch/abort.out")"

    train one_rank "$bin" "${skip[@]}"
    expect_status one_rank 0 $?
    train two_ranks "${mpi[@]}" "${skip[@]}"
    expect_status two_ranks 0 $?
    skips one_rank >"$scratch/one_rank.skips"
    skips two_ranks >"$scratch/two_ranks.skips"
    [ "$(grep -c '"event":"corrupt_block"' "$scratch/one_rank.skips")" = 1 ] || fail "1 rank: expected one corrupt_block record: $(cat "$scratch/one_rank.skips")"
    grep -q "\"block\":5,\"event\":\"corrupt_block\",\"first_token\":1280,\"samples_replaced\":[0-9]*,\"shard\":\"$shard\",\"step\":[0-9]*,\"tokens_lost\":256" \
        "$scratch/one_rank.skips" || fail "1 rank: the record does not name the block: $(cat "$scratch/one_rank.skips")"
    cmp -s "$scratch/one_rank.skips" "$scratch/two_ranks.skips" ||
        fail "1 and 2 ranks skipped differently: $(diff "$scratch/one_rank.skips" "$scratch/two_ranks.skips")"
    # Ranks that read the same samples (tp ranks; the first and last pipeline stages) count them once.
    for layout in parallel.tp=2 parallel.pp=2; do
        train "$layout" "${mpi[@]}" "${skip[@]}" --set model.n_layers=2 --set "$layout"
        expect_status "$layout" 0 $?
        skips "$layout" >"$scratch/$layout.skips"
        cmp -s "$scratch/one_rank.skips" "$scratch/$layout.skips" ||
            fail "$layout skipped otherwise than 1 rank: $(diff "$scratch/one_rank.skips" "$scratch/$layout.skips")"
    done
    grep -q "data: step [0-9]*: block 5 of '$shard' (tokens \[1280, 1536)) is corrupt: its 256 tokens are skipped" "$scratch/one_rank.out" ||
        fail "1 rank: no log line for the block"

    # Resumed from the last checkpoint before the block was first met: the block is met at the
    # same step, logged and counted again.
    met=$(grep '"event":"corrupt_block"' "$scratch/one_rank/log.jsonl" | grep -o '"step":[0-9]*' | cut -d: -f2)
    from=$(( (met - 1) / 5 * 5 ))
    [ "$from" -ge 5 ] || fail "the block is met at step $met, before the first checkpoint: choose another block"
    train resumed "$bin" "${skip[@]}" --resume "$(printf '%s/step_%08d' "$scratch/one_rank-checkpoints" "$from")"
    expect_status resumed 0 $?
    grep -q "resumed from .* at step $from" "$scratch/resumed.out" || fail "the run did not resume at step $from: $(tail -3 "$scratch/resumed.out")"
    skips resumed >"$scratch/resumed.skips"
    # The uninterrupted run's records after the resume point.
    awk -v from="$from" 'match($0, /"step":[0-9]+/) { if (substr($0, RSTART + 7, RLENGTH - 7) + 0 > from) print }' "$scratch/one_rank.skips" >"$scratch/one_rank_after.skips"
    cmp -s "$scratch/one_rank_after.skips" "$scratch/resumed.skips" ||
        fail "the resumed run skipped differently: $(diff "$scratch/one_rank_after.skips" "$scratch/resumed.skips")"
    echo "ok: abort exits 2 naming the block; skip: 1 rank and 2 (dp, tp, pp) log block 5 at step $met and replace samples at the same $(grep -c samples_replaced "$scratch/one_rank.skips") steps;" \
         "resumed at step $from, the run logs it again at step $met"
    ;;
*) fail "unknown mode '$mode' (verify, train)" ;;
esac
