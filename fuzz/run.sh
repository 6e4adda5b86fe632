#!/usr/bin/env bash
# Runs every fuzz target for SECONDS seconds each (default 60), one after the other, with
# AddressSanitizer and debug assertions (overflow checks included), then prints each target's
# executions and whether it found a crash.
#
#   fuzz/run.sh 120
#
# Needs nightly Rust and cargo-fuzz (`cargo install cargo-fuzz`). New inputs go to
# fuzz/corpus/<target>, seeded from fuzz/seeds/<target>; crashes go to fuzz/artifacts/<target>
# (reproduce one with `cargo +nightly fuzz run <target> <file>`). Extra arguments after
# SECONDS go to libFuzzer, e.g. `fuzz/run.sh 60 -jobs=2`.
#
#   fuzz/run.sh --replay
#
# builds the targets with plain cargo (a debug build: overflow checks on, no sanitizer or
# coverage) and runs each one once on every input of fuzz/seeds/<target>, the reproducers of
# the crashes found so far; this is also what runs when cargo-fuzz is not installed.
set -euo pipefail
cd "$(dirname "$0")"

# Every seed of every target, run once by the target built without cargo-fuzz (libFuzzer's
# main runs the files it is given and stops at the first crash).
replay() {
    cargo build --bins
    local status=0 target seeds
    for source in fuzz_targets/*.rs; do
        target=$(basename "$source" .rs)
        seeds=(seeds/"$target"/*)
        [[ -e ${seeds[0]} ]] || continue
        if "target/debug/$target" "${seeds[@]}" >/dev/null 2>&1; then
            printf '%-20s %4d seeds, no crash\n' "$target" "${#seeds[@]}"
        else
            printf '%-20s CRASH on a seed (rerun: fuzz/target/debug/%s fuzz/seeds/%s/*)\n' \
                "$target" "$target" "$target"
            status=1
        fi
    done
    return $status
}

if [[ ${1:-} == --replay ]]; then
    replay
    exit
fi
if ! cargo +nightly fuzz --help >/dev/null 2>&1; then
    echo "cargo-fuzz (on nightly) is not installed: replaying the seeds instead" >&2
    replay
    exit
fi

# Threads of the layer API leave a thread-local destructor node that LeakSanitizer can catch
# in flight; see lsan.supp.
export LSAN_OPTIONS="suppressions=$PWD/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

seconds=${1:-60}
shift || true
targets=$(cargo +nightly fuzz list)
summary=""
status=0
for target in $targets; do
    mkdir -p "corpus/$target" "seeds/$target"
    log=$(mktemp)
    echo "== $target: ${seconds}s"
    # safetensors.dict holds the tokens of safetensors headers, config.dict those of
    # config.json files; the layer API target takes neither.
    dict=(-dict=safetensors.dict)
    if [[ $target == config_load ]]; then dict=(-dict=config.dict); fi
    if [[ $target == layer_api ]]; then dict=(); fi
    if cargo +nightly fuzz run --debug-assertions "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" "${dict[@]}" -print_final_stats=1 "$@" 2>&1 | tee "$log" | grep -E "^#[0-9]+.*(DONE|pulse)|ERROR|panicked"; then :; fi
    runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo "?")
    if grep -qE 'ERROR: libFuzzer|panicked at|==ERROR: AddressSanitizer' "$log"; then
        found="CRASH (see fuzz/artifacts/$target)"
        status=1
    else
        found="no crash"
    fi
    summary+=$(printf '%-20s %12s executions in %ss, %s' "$target" "$runs" "$seconds" "$found")$'\n'
    rm -f "$log"
done
printf '\n%s' "$summary"
exit $status
