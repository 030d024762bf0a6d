#!/bin/sh
# SPDX-License-Identifier: MIT
# The library's ABI, as a program built against an earlier release sees it:
#   - libstash.so.0 exports stash_* only, each under a STASH_ version node;
#   - the installed libstash.a defines no global symbol but stash_*;
#   - abi-compliance-checker finds no binary incompatibility between the
#     ABI of each release in tests/abi/ (abi-dumper's dumps, xz'd) and this
#     library's.
#   abi_check.sh LIBSTASH_SO LIBSTASH_A INCLUDE_DIR ABI_DIR
set -eu
so=$1 archive=$2 include=$3 abidir=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
    echo "abi_check: $*" >&2
    exit 1
}

soname=$(readelf -d "$so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = libstash.so.0 ] || fail "$so: soname '$soname', not libstash.so.0"

# Defined dynamic symbols other than the version nodes themselves.
readelf -W --dyn-syms "$so" | awk '$7 != "UND" && $7 != "ABS" && ($5 == "GLOBAL" || $5 == "WEAK") &&
    ($4 == "FUNC" || $4 == "OBJECT") { print $8 }' > "$work/exported"
[ -s "$work/exported" ] || fail "$so exports nothing"
if grep -v '^stash_[a-z0-9_]*@@STASH_[0-9.]*$' "$work/exported" > "$work/stray"; then
    fail "$so exports symbols outside stash_* or without a STASH_ version: $(head -5 "$work/stray" | tr '\n' ' ')"
fi

nm -g --defined-only "$archive" | awk 'NF == 3 { print $3 }' > "$work/archived"
[ -s "$work/archived" ] || fail "$archive defines nothing"
if grep -v '^stash_' "$work/archived" > "$work/stray"; then
    fail "$archive defines $(wc -l < "$work/stray") global symbols outside stash_*: $(head -5 "$work/stray" | tr '\n' ' ')"
fi

version=$(sed -n 's/^#define STASH_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' \
    "$include/stash.h" | paste -sd.)
abi-dumper "$so" -o "$work/new.dump" -lver "$version" -public-headers "$include" \
    > "$work/dumper.log" 2>&1 || { cat "$work/dumper.log" >&2; fail "abi-dumper failed on $so"; }
checked=0
for old in "$abidir"/libstash-*.dump.xz; do
    release=$(basename "$old" .dump.xz)
    xz -dc "$old" > "$work/old.dump"
    if ! abi-compliance-checker -l stash -old "$work/old.dump" -new "$work/new.dump" -binary \
        -report-path "$work/$release.html" > "$work/checker.log" 2>&1; then
        cat "$work/checker.log" >&2
        fail "$release -> $version: binary incompatible (abi-compliance-checker above)"
    fi
    grep -q "Total binary compatibility problems: 0" "$work/checker.log" ||
        { cat "$work/checker.log" >&2; fail "$release -> $version: problems found"; }
    checked=$((checked + 1))
done
[ "$checked" -gt 0 ] || fail "no release's ABI dump in $abidir"
echo "abi_check: $soname exports $(wc -l < "$work/exported") stash_* symbols, libstash.a" \
    "$(wc -l < "$work/archived"); compatible with $checked release(s)"
