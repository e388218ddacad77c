"""Fails when a package in Cargo.lock declares a rust-version above ours.

Usage: cargo metadata --format-version 1 --locked | python3 scripts/check_msrv.py
"""
import json
import sys


def version(v):
    parts = [int(x) for x in v.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


meta = json.load(sys.stdin)
ours = next(p for p in meta["packages"] if p["id"] in meta["workspace_members"])
msrv = ours["rust_version"]
locked = {n["id"] for n in meta["resolve"]["nodes"]}
bad = [
    "  {} {} needs Rust {}".format(p["name"], p["version"], p["rust_version"])
    for p in meta["packages"]
    if p["id"] in locked
    and p.get("rust_version")
    and version(p["rust_version"]) > version(msrv)
]
if bad:
    print("rust-version = {} is false for the lockfile:".format(msrv))
    print("\n".join(bad))
    print("pin those packages lower (cargo update -p NAME --precise VERSION) or raise rust-version")
    sys.exit(1)
print("ok: every locked package supports Rust {}".format(msrv))
