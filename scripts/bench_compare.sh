#!/usr/bin/env bash
# Runs benches of two revisions interleaved and prints their SUMMARY lines
# side by side, so that a change is judged against the code before it on
# the same machine at the same time (a noisy machine hits both alike).
#
#   bash scripts/bench_compare.sh [-n ROUNDS] BASE [NEW] [BENCH ...]
#
# BASE and NEW are git revisions; NEW defaults to the working tree ("."),
# uncommitted changes included. BENCH defaults to "lock watchdog family
# handoff". The pseudo-bench "watchdog-instructions" runs the watchdog
# bench's --instructions mode under valgrind's callgrind (needs valgrind):
# instructions and simulated cache misses per renewal of 20,000 watched
# locks, counted over 5 s, which do not move with the machine's load (one
# round is enough; it takes about a minute per revision); "lock-instructions"
# the lock bench's the same way: the client's instructions (all threads)
# per `lock_with_lease()` + drop, over 5,000 pairs. The pseudo-benches
# "redis-instructions-lock" and "redis-instructions-watchdog" run Redis
# itself under callgrind (needs valgrind): the instructions Redis runs per
# acquire + release (beside the peer and Redisson's current scripts) and per
# renewal (beside the bare PEXPIRE loop), within a few per cent from run
# to run (about 15 s and 45 s per revision).
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
    sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'
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

# target BENCH: the bench target that BENCH runs.
target() {
    case $1 in
    watchdog-instructions | redis-instructions-watchdog) echo watchdog ;;
    lock-instructions | redis-instructions-lock) echo lock ;;
    *) echo "$1" ;;
    esac
}

# instructions BIN OUT: BIN's --instructions mode under callgrind, the
# window counted only (instrumentation switched on and off around it); a
# SUMMARY line of counts per renewal (the watchdog bench) or per acquire +
# release (the lock bench) into OUT. Cache sizes are fixed, so the counts
# compare across machines.
instructions() {
    local bin=$1 out=$2 go=$work/go.$$
    command -v valgrind >/dev/null || { echo "SUMMARY: valgrind is not installed" >"$out"; return 1; }
    rm -f "$go"
    REDLEASE_BENCH_GO=$go valgrind --tool=callgrind --cache-sim=yes --D1=32768,8,64 \
        --LL=8388608,16,64 --instr-atstart=no --callgrind-out-file="$out.callgrind" \
        "$bin" --instructions >"$out.stdout" 2>"$out.stderr" &
    local pid=$! i
    for i in $(seq 1 600); do grep -q READY "$out.stdout" && break; sleep 0.5; done
    callgrind_control -i on "$pid" >/dev/null 2>&1
    touch "$go"
    for i in $(seq 1 600); do grep -qE "RENEWALS|PAIRS" "$out.stdout" && break; sleep 0.1; done
    callgrind_control -i off "$pid" >/dev/null 2>&1
    rm -f "$go"
    wait "$pid" || true
    python3 - "$out" <<'PY'
import re, sys
out = sys.argv[1]
err, std = open(out + ".stderr").read(), open(out + ".stdout").read()
def count(label):
    m = re.search(label + r":\s+([\d,]+)", err)
    return int(m.group(1).replace(",", "")) if m else None
m = re.search(r"RENEWALS: (\d+)(.*)", std)
pairs = re.search(r"PAIRS: (\d+)", std)
ir, d1, ll = count("I   refs"), count("D1  misses"), count("LLd misses")
with open(out, "w") as f:
    if pairs and None not in (ir, d1, ll):
        n = int(pairs.group(1))
        f.write("SUMMARY: lock_with_lease() + drop, client per pair (all threads, callgrind): "
                "%.0f instructions | %.2f D1 misses (32 KB) | %.3f LL misses (8 MB) | %d pairs\n"
                % (ir / n, d1 / n, ll / n, n))
    elif not m or not int(m.group(1)) or None in (ir, d1, ll):
        f.write("SUMMARY: no count (see %s.stdout and .stderr)\n" % out)
    else:
        n = int(m.group(1))
        f.write("SUMMARY: watchdog, per renewal (all threads, callgrind): %.0f instructions | "
                "%.2f D1 misses (32 KB) | %.3f LL misses (8 MB) | %d renewals%s\n"
                % (ir / n, d1 / n, ll / n, n, m.group(2)))
PY
}

# redis_instructions BIN OUT: BIN's --redis-instructions mode, its Redis
# started under callgrind through a wrapper (REDIS_SERVER_BIN); BIN prints
# its SUMMARY lines into OUT.
redis_instructions() {
    local bin=$1 out=$2
    command -v valgrind >/dev/null || { echo "SUMMARY: valgrind is not installed" >"$out"; return 1; }
    local server
    server=$(command -v redis-server) || { echo "SUMMARY: redis-server is not installed" >"$out"; return 1; }
    local wrap=$work/redis-under-callgrind.sh
    printf '#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file="$REDLEASE_CALLGRIND_OUT" %s "$@"\n' \
        "$server" >"$wrap"
    chmod +x "$wrap"
    rm -f "$out".callgrind*
    grep -qa "redis instructions per" "$bin" ||
        { echo "SUMMARY: this revision has no --redis-instructions mode" >"$out"; return 0; }
    REDIS_SERVER_BIN=$wrap REDLEASE_CALLGRIND_OUT=$out.callgrind "$bin" --redis-instructions >"$out" 2>&1
}

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
    for b in "${benches[@]}"; do args+=(--bench "$(target "$b")"); done
    local listing
    listing=$(cd "$src" && CARGO_TARGET_DIR=$work/target-$label cargo bench --no-run "${args[@]}" 2>&1) || {
        echo "$listing" >&2
        exit 1
    }
    mkdir -p "$work/bin"
    for b in "${benches[@]}"; do
        local exe
        exe=$(echo "$listing" | sed -n "s|.*Executable benches/$(target "$b").rs (\(.*\))|\1|p" | head -n 1)
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
            if [ "$b" = lock-instructions ] && ! grep -qa "PAIRS: " "$work/bin/$label-$b"; then
                echo "SUMMARY: this revision has no --instructions mode in its lock bench" \
                    >"$out/$b-$label-$round.txt"
            elif [ "$b" = watchdog-instructions ] || [ "$b" = lock-instructions ]; then
                instructions "$work/bin/$label-$b" "$out/$b-$label-$round.txt" ||
                    echo "   (see $out/$b-$label-$round.txt)" >&2
            elif [ "${b#redis-instructions-}" != "$b" ]; then
                redis_instructions "$work/bin/$label-$b" "$out/$b-$label-$round.txt" ||
                    echo "   (exit $?, see $out/$b-$label-$round.txt)" >&2
            else
                "$work/bin/$label-$b" --bench >"$out/$b-$label-$round.txt" 2>&1 ||
                    echo "   (exit $?, see $out/$b-$label-$round.txt)" >&2
            fi
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
