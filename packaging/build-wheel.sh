#!/usr/bin/env bash
# Builds the mmrouter wheel (distribution `mmrouter-kv`, command `mmrouter`): the release binary, in a manylinux_2_34 x86_64 wheel (maturin, bin bindings).
#   packaging/build-wheel.sh [OUT_DIR]        # default target/wheels; prints the wheel's path last
# maturin (pinned) comes from PyPI into a venv under target/ ($MATURIN_VENV to use another). It builds
# with cargo's own release profile into the repository's target/, so a `cargo build --release` of the
# same tree is reused as is (maturin runs `cargo rustc --profile release --bin mmrouter`: same units).
# Why manylinux_2_34: built on Debian 12 (glibc 2.36), the binary's newest glibc symbol is GLIBC_2.34
# (__libc_start_main since glibc merged libpthread), and it links nothing beyond glibc, libm and libgcc_s;
# maturin's auditwheel check refuses the wheel if that ever stops being true. An older tag needs an
# older build host (a manylinux container), not available here.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$(mkdir -p "${1:-target/wheels}" && cd "${1:-target/wheels}" && pwd)
venv=${MATURIN_VENV:-$root/target/packaging/maturin-venv}
maturin_version=1.16.0

if [[ ! -x $venv/bin/maturin ]] || [[ $("$venv/bin/maturin" --version) != "maturin $maturin_version" ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "maturin==$maturin_version"
fi
# The sources' own lock file; the wheels from earlier builds of this version are replaced.
rm -f "$out"/mmrouter_kv-*.whl
(cd packaging && "$venv/bin/maturin" build --release --locked --compatibility manylinux_2_34 --out "$out" >&2)
ls "$out"/mmrouter_kv-*.whl
