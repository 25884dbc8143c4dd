#!/usr/bin/env bash
# readme_commands.sh README LLMTRAIN SOURCE_DIR SCRATCH: the README's short path, run as it is
# written, so that the manual cannot drift from the binary. Every ```sh block the README marks
# with "<!-- tested: ... -->" is run verbatim by bash (set -e) in SCRATCH, in the README's
# order, after the quick start's own training command (the last line of
# scripts/quickstart.sh). SCRATCH holds links to the source's configs/ and the tiny corpora
# under data/, and corpus/ a slice of the fortunes corpus. `llmtrain` is LLMTRAIN; a `train`
# gets a few overrides so that it takes seconds (3 steps, a small validation set), and
# nothing else is changed.
set -u
readme=$1 bin=$2 source_dir=$3 scratch=$4
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$scratch"
mkdir -p "$scratch/bin" "$scratch/data" "$scratch/corpus"
ln -s "$bin" "$scratch/bin/llmtrain"
ln -s "$source_dir/configs" "$scratch/configs"
ln -s "$source_dir/data/fortunes.txt" "$scratch/data/fortunes.txt"
ln -s "$source_dir/data/fortunes-bpe" "$scratch/data/fortunes-bpe"
# The corpus of "your own data": about 600 KB of fortunes in two files, cut at an entry.
head -c 300000 "$source_dir/data/fortunes.txt" >"$scratch/corpus/a.txt"
tail -c +300001 "$source_dir/data/fortunes.txt" | head -c 300000 >"$scratch/corpus/b.txt"

# The marked blocks, each a script of its own.
awk -v out="$scratch/block" '
    /^<!-- tested:/ { armed = 1; next }
    armed && /^```sh$/ { n++; file = out "-" n ".sh"; inside = 1; armed = 0; next }
    inside && /^```$/ { inside = 0; close(file); next }
    inside { print > file }
' "$readme"
blocks=$(ls "$scratch"/block-*.sh 2>/dev/null | wc -l)
[ "$blocks" -ge 2 ] || fail "$readme marks $blocks tested block(s); expected the quick start's and your own data's"

preamble='set -e
export PATH='"$scratch/bin"':$PATH
# Seconds instead of minutes: a few steps of each training run.
llmtrain() {
    if [ "$1" = train ]; then command llmtrain "$@" --set train.steps=3 --set optimizer.warmup_steps=1 --set train.eval_sequences=8 \
        --set train.sample_tokens=8 --set train.threads=2
    else command llmtrain "$@"; fi
}'
quickstart_train=$(tail -n 1 "$source_dir/scripts/quickstart.sh" | sed 's|^build/llmtrain |llmtrain |; s| "\$@"$||')
[[ $quickstart_train == "llmtrain train "* ]] || fail "the last line of scripts/quickstart.sh is not its training command: $quickstart_train"
run_block() {  # NAME SCRIPT
    printf '%s\n%s\n' "$preamble" "$2" >"$scratch/$1.run.sh"
    (cd "$scratch" && bash "$scratch/$1.run.sh") >"$scratch/$1.out" 2>&1 || { tail -n 5 "$scratch/$1.out"; fail "README block '$1' failed:"$'\n'"$2"; }
    echo "ok   $1: $(grep -c . <<<"$2") line(s)"
}
run_block quickstart-training "$quickstart_train"
for block in "$scratch"/block-*.sh; do run_block "$(basename "$block" .sh)" "$(cat "$block")"; done
[ -s "$scratch/runs/quickstart/hf/tokenizer.json" ] || fail "the quick start's export holds no tokenizer.json"
echo "every tested README block ran ($blocks)"
