#!/usr/bin/env bash
# Builds data/fortunes.txt, the corpus of configs/tiny.toml, from Debian's `fortunes`
# package (public-domain quotations; entries separated by '%' lines). The files are
# concatenated in sorted order, so the corpus is the same on every machine with the
# same package version.
set -euo pipefail
cd "$(dirname "$0")/.."
source_dir=/usr/share/games/fortunes
out=data/fortunes.txt
if [ ! -d "$source_dir" ]; then
  echo "make-tiny-corpus: $source_dir not found; install the 'fortunes' package (scripts/install-deps.sh)" >&2
  exit 1
fi
mkdir -p data
tmp=$(mktemp data/.fortunes.XXXXXX)
find "$source_dir" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z |
  while IFS= read -r -d '' file; do cat "$file"; printf '%%\n'; done >"$tmp"
mv "$tmp" "$out"
echo "make-tiny-corpus: $out ($(wc -c <"$out") bytes)"
