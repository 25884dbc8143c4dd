#!/usr/bin/env bash
# bench_moe.sh LLMTRAIN [FLAGS...]: runs `llmtrain bench moe --device cpu FLAGS` and checks
# that it exits 0, that the forward and the backward each name the four parts (router,
# dispatch, experts, combine) with a time and a share, the experts with TFLOP/s, and that
# the parts add up to the pass's total (printed to 0.001 ms: within 4 roundings) and their
# shares to 100% (to 0.1%: within 4 roundings), and the two totals to the layer's (within 2 roundings).
set -u
bin=$1
shift
out=$("$bin" bench moe --device cpu "$@" 2>&1)
status=$?
echo "$out"
if [ "$status" -ne 0 ]; then echo "FAIL: exit status $status"; exit 1; fi
echo "$out" | awk '
  function fail(msg) { print "FAIL: " msg; failed = 1; exit 1 }
  /^(forward|backward):$/ { pass = $1; sub(":", "", pass); passes++; delete seen; named = 0; sum = 0; share = 0; next }
  pass != "" && $1 ~ /^(router|dispatch|experts|combine)$/ {
    if ($3 != "ms" || $4 !~ /%$/) fail(pass " " $1 ": expected NAME MS ms SHARE%")
    if ($1 == "experts" && $6 != "TFLOP/s") fail(pass " experts: no TFLOP/s")
    if (!($1 in seen)) named++; seen[$1] = 1; sum += $2; share += $4 + 0; next
  }
  pass != "" && $1 == "total" {
    if (named != 4) fail(pass ": " named " parts named, expected router, dispatch, experts, combine")
    if ($2 <= 0) fail(pass ": total " $2 " ms")
    if (sum - $2 > 0.002 || $2 - sum > 0.002) fail(pass ": the parts add to " sum " ms, the total is " $2)
    if (share - 100 > 0.2 || 100 - share > 0.2) fail(pass ": the shares add to " share "%")
    totals += $2; pass = ""; next
  }
  /^forward \+ backward: / { layer = $4 + 0; have_layer = 1 }
  END {
    if (failed) exit 1
    if (passes != 2) { print "FAIL: " passes " passes, expected forward and backward"; exit 1 }
    if (!have_layer) { print "FAIL: no forward + backward line"; exit 1 }
    if (totals - layer > 0.002 || layer - totals > 0.002) { print "FAIL: forward + backward " layer " ms, the passes add to " totals; exit 1 }
    print "ok: both passes name every part, and the parts add up to the totals"
  }'
