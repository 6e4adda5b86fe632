#!/usr/bin/env bash
# Compares the output bits of this checkout's mha with another revision's, call by call.
#
#   bash dev/bitcompare/run.sh REV [old-api]
#
# Builds dev/bitcompare against this checkout and against REV (checked out into a temporary
# worktree), runs both for every supported instruction set (MHA_ISA=portable, avx2, avx512) and
# diffs the hashes, one line per call (about 4,100), each on 1, 2 and 3 threads where the call
# takes a thread count:
# - the original calls of the typed API (src/legacy.rs, printed as before): forward (both
#   maskings, with and without biases, key lengths, padding, boolean and additive masks,
#   attention weights), decode token by token and in chunks of 3, cross-attention with options,
#   attention() over heads and mha_forward, on odd shapes (96-row blocks crossed, GQA, MQA);
# - the run-time Layer (src/cases.rs, src/calls.rs): every builder setting alone and together
#   (scale, RoPE of each layout and scaling, partial and explicit positions, QK-norm of each
#   span, sliding windows with rolling caches, ALiBi by index and by rank, soft cap, sinks),
#   every key x value KvFormat and WeightFormat, query width != model width, heads of 3, 5,
#   10, 24 and 80; forward_into with each AttendOptions field and the weights, cross_into,
#   decode_into by 1, 3, 5 and 7 tokens (with options and weights), ragged batches and
#   restarted sequences; the typed Mha over the same settings, a shared ThreadPool, an Executor;
# - Checkpoint directories of all 12 families written with the crate's writer (f32, bf16, some
#   f16 and sharded), their layers' calls, LayerWeights::from_safetensors, and the fixed
#   layouts of MhaParams::from_safetensors (src/checkpoint.rs);
# - gemm in every format, the rounding of weights and cached values over the whole f32 range,
#   exp, tanh, sin_cos, the bf16/f16 widenings, RoPE rotation, ALiBi slopes, attention(),
#   split/merge_heads, mha_forward and the reference (src/kernels.rs).
# REV must have this API; pass `old-api` when REV predates the Tokens/Output entry points
# (old-api/ keeps the original calls alone). Exits non-zero on any difference.
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
# The API features of a source tree: the head-count argument of MhaParams::from_safetensors.
features_of() { if grep -rqs "LoadError::Typed" "$1/src"; then echo "--features=heads-arg"; fi; }
cargo build -q --release --manifest-path "$here/Cargo.toml" --target-dir "$work/target-this" $(features_of "$root")
cargo build -q --release --manifest-path "$work/dump/Cargo.toml" $(features_of "$work/rev")
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
