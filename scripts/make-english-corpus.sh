#!/usr/bin/env bash
# Builds data/english-mix.txt, the mixed English text of the tokenizer benchmark
# (scripts/bench-tokenizer.sh): Debian's licence texts, the fortunes corpus
# (scripts/make-tiny-corpus.sh), then package changelogs and NEWS files from /usr/share/doc,
# decompressed, in sorted order, until the text reaches TARGET_BYTES (default 6,500,000).
# Only files that are valid UTF-8 are taken, so every tokenizer sees the same characters.
# The result depends on the packages installed; the script prints its size and line count.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${TARGET_BYTES:-6500000}
out=data/english-mix.txt
[ -f data/fortunes.txt ] || scripts/make-tiny-corpus.sh >/dev/null
mkdir -p data
tmp=$(mktemp data/.english-mix.XXXXXX)
trap 'rm -f "$tmp"' EXIT
append_if_utf8() {  # reads a file's text on stdin
    local text
    text=$(cat; printf x) && text=${text%x}
    if printf '%s' "$text" | iconv -f UTF-8 -t UTF-8 >/dev/null 2>&1; then printf '%s\n' "$text" >>"$tmp"; fi
}
for f in /usr/share/common-licenses/*; do [ -f "$f" ] && append_if_utf8 <"$f"; done
append_if_utf8 <data/fortunes.txt
while IFS= read -r -d '' f; do
    [ "$(stat -c %s "$tmp")" -ge "$target" ] && break
    gzip -dc "$f" 2>/dev/null | append_if_utf8 || true
done < <(find /usr/share/doc -maxdepth 2 \( -name 'changelog*.gz' -o -name 'NEWS*.gz' \) -print0 | sort -z)
mv "$tmp" "$out"
trap - EXIT
echo "make-english-corpus: $out ($(wc -c <"$out") bytes, $(wc -l <"$out") lines)"
