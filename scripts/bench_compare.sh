#!/usr/bin/env bash
# Runs benches of two revisions interleaved and prints their SUMMARY lines
# side by side, so that a change is judged against the code before it on
# the same machine at the same time (a noisy machine hits both alike).
#
#   bash scripts/bench_compare.sh [-n ROUNDS] BASE [NEW] [BENCH ...]
#
# BASE and NEW are git revisions; NEW defaults to the working tree ("."),
# uncommitted changes included. BENCH defaults to "lock watchdog family
# handoff".
# Each revision is built once (release, `cargo bench --no-run`) in a
# worktree under target/bench-compare/; then ROUNDS rounds (default 2) run
# every bench of both revisions, alternating which goes first. The output
# of every run is kept in target/bench-compare/out/. Run it before and after
# changing a Lua script, the watchdog, the acquire/release path or the
# subscriber, and quote the ratios (each bench prints its own ratio against
# a limit measured in the same run).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

rounds=2
if [ "${1:-}" = "-n" ]; then
    rounds=$2
    shift 2
fi
if [ $# -lt 1 ]; then
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
base=$1
shift
new=.
if [ $# -gt 0 ] && { [ "$1" = "." ] || git rev-parse --verify -q "$1^{commit}" >/dev/null; }; then
    new=$1
    shift
fi
benches=("$@")
[ ${#benches[@]} -gt 0 ] || benches=(lock watchdog family handoff)

work=$root/target/bench-compare
out=$work/out
mkdir -p "$work" "$out"

# build REV LABEL: bench binaries of REV copied to $work/bin/LABEL-<bench>.
build() {
    local rev=$1 label=$2 src
    if [ "$rev" = "." ]; then
        src=$root
    else
        src=$work/tree-$label
        rm -rf "$src"
        git worktree prune
        git worktree add -f --detach "$src" "$rev" >/dev/null
    fi
    echo "== building $label ($rev)" >&2
    local args=()
    for b in "${benches[@]}"; do args+=(--bench "$b"); done
    local listing
    listing=$(cd "$src" && CARGO_TARGET_DIR=$work/target-$label cargo bench --no-run "${args[@]}" 2>&1) || {
        echo "$listing" >&2
        exit 1
    }
    mkdir -p "$work/bin"
    for b in "${benches[@]}"; do
        local exe
        exe=$(echo "$listing" | sed -n "s|.*Executable benches/$b.rs (\(.*\))|\1|p" | head -n 1)
        [ -n "$exe" ] || { echo "no executable for bench $b in $label" >&2; exit 1; }
        case $exe in /*) ;; *) exe=$src/$exe ;; esac
        cp "$exe" "$work/bin/$label-$b"
    done
    if [ "$rev" != "." ]; then
        git worktree remove --force "$src"
    fi
}

build "$base" base
build "$new" new

for round in $(seq 1 "$rounds"); do
    for b in "${benches[@]}"; do
        if [ $((round % 2)) = 1 ]; then order="base new"; else order="new base"; fi
        for label in $order; do
            echo "== round $round: $b $label ($(date +%T))" >&2
            # The benches start their own redis-server; run from the repo
            # root like `cargo bench`.
            "$work/bin/$label-$b" --bench >"$out/$b-$label-$round.txt" 2>&1 ||
                echo "   (exit $?, see $out/$b-$label-$round.txt)" >&2
        done
    done
done

for b in "${benches[@]}"; do
    echo
    echo "######## bench $b: base = $base, new = $new"
    for round in $(seq 1 "$rounds"); do
        for label in base new; do
            echo "---- $label, round $round"
            grep '^SUMMARY' "$out/$b-$label-$round.txt" || echo "(no SUMMARY: see $out/$b-$label-$round.txt)"
        done
    done
done
