#!/usr/bin/env bash
# Side-by-side rounds against the peer kit: each round runs the peers (ONNX Runtime, PyTorch),
# then this checkout's bench example at the same shapes and thread counts, so both see the same
# state of a shared machine; at the end, per round and as the median over rounds, the ratio
# best peer / crate for the layer and for `mha_forward`, and the crate's share of the round's
# FMA peak.
#
#   bash dev/sidebyside/run.sh                          3 rounds, small,gpt2,batch,long, 1 and 2 threads
#   ROUNDS=5 SHAPES=small,gpt2 THREADS=2 bash dev/sidebyside/run.sh
#
# PEERS: the peer kit's folder (default ../shared/peers beside this repository). Threads = 1
# runs pinned to one CPU (taskset), as the peer kit does. Raw outputs stay in $OUT (a temporary
# folder unless set).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
peers="${PEERS:-$root/../shared/peers}"
rounds="${ROUNDS:-3}"
shapes="${SHAPES:-small,gpt2,batch,long}"
threads="${THREADS:-1 2}"
out="${OUT:-$(mktemp -d)}"
[ -x "$peers/run.sh" ] || { echo "error: no peer kit at $peers (set PEERS=...)" >&2; exit 2; }
cargo build -q --release --example bench --manifest-path "$root/Cargo.toml"
bench="$root/target/release/examples/bench"
first_cpu="$(taskset -pc $$ 2>/dev/null | sed -E 's/.*: *//; s/[-,].*//')"
for round in $(seq "$rounds"); do
    echo "== round $round of $rounds ($(date -u +%H:%M:%S))" >&2
    VERIFY=0 SHAPES="$shapes" THREADS="$threads" bash "$peers/run.sh" >"$out/peers-$round.txt" 2>&1
    run_dir="$(sed -n 's/^(raw files: \([^;]*\);.*/\1/p' "$out/peers-$round.txt")"
    cp "$run_dir/results.jsonl" "$out/peers-$round.jsonl"
    cp "$run_dir/peak.txt" "$out/peak-$round.txt"
    for t in $(echo "$threads" | tr ',' ' '); do
        pin=(); [ "$t" = 1 ] && pin=(taskset -c "${first_cpu:-0}")
        "${pin[@]}" "$bench" --threads "$t" --no-reference --modes none --shapes "$shapes" \
            >"$out/bench-$round-$t.txt"
    done
done
python3 "$here/ratios.py" "$out" "$rounds"
echo "(raw files: $out)"
