#!/usr/bin/env bash
# Compares the output bits of this checkout's mha with another revision's, call by call.
#
#   bash dev/bitcompare/run.sh REV [old-api]
#
# Builds dev/bitcompare against this checkout and against REV (checked out into a temporary
# worktree), runs both for every supported instruction set (MHA_ISA=portable, avx2, avx512) and
# diffs the hashes: forward (both maskings, with and without biases, key lengths, padding,
# boolean and additive masks, attention weights), decode token by token and in chunks of 3,
# cross-attention with options, attention() over heads and mha_forward, on odd shapes (96-row
# blocks crossed, GQA, MQA), each on 1, 2 and 3 threads. Pass `old-api` when REV predates the
# Tokens/Output entry points. Exits non-zero on any difference.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
rev="${1:?usage: run.sh REV [old-api]}"
work="$(mktemp -d)"
trap 'git -C "$root" worktree remove --force "$work/rev" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add --detach "$work/rev" "$rev" >/dev/null
if [ "${2:-}" = old-api ]; then
    cp -r "$here/old-api" "$work/dump"
    sed -i "s#MHA_PATH#$work/rev#" "$work/dump/Cargo.toml"
else
    cp -r "$here" "$work/dump"
    sed -i "s#path = \"../..\"#path = \"$work/rev\"#" "$work/dump/Cargo.toml"
fi
export CARGO_TARGET_DIR="$work/target"
cargo build -q --release --manifest-path "$here/Cargo.toml" --target-dir "$work/target-this"
cargo build -q --release --manifest-path "$work/dump/Cargo.toml"
status=0
for isa in portable avx2 avx512; do
    this="$(MHA_ISA=$isa "$work/target-this/release/mha-bitcompare")"
    other="$(MHA_ISA=$isa "$work/target/release/"mha-bitcompare*)"
    [ "$(echo "$this" | head -1)" = "isa $(echo "$isa" | sed 's/portable/Portable/;s/avx2/Avx2/;s/avx512/Avx512/')" ] || { echo "$isa: not supported here"; continue; }
    if [ "$this" = "$other" ]; then
        echo "$isa: $(echo "$this" | wc -l) calls, identical"
    else
        echo "$isa: DIFFERENT"; diff <(echo "$other") <(echo "$this") | head -20; status=1
    fi
done
exit $status
