#!/usr/bin/env bash
# The README's test command: installs what the test suites need when it is
# missing (redis-server, from Debian's or Ubuntu's packages; the Sentinel and
# TLS suites use the same binary), then runs `cargo test` with any arguments
# given. Safe to run again: it installs nothing that is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "== installing redis-server and redis-cli (Debian package redis-server)"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
    # The package starts a system service on 6379; the tests never use it.
fi
redis-server --version

RUST_BACKTRACE=1 exec cargo test "$@"
