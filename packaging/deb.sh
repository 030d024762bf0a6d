#!/bin/sh
# SPDX-License-Identifier: MIT
# Builds the Debian packages of this tree (debian/) into OUT and checks
# them with lintian: a copy of the tree, as git sees it (or, outside git,
# without its build directories), is built in OUT/stash-VERSION, so that
# the packages, .buildinfo and .changes land in OUT and nothing is written
# beside the tree.
#   deb.sh OUT [JOBS]
set -eu
out=$1 jobs=${2:-$(nproc)}
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

# The packages' version is the header's: a changelog that names another
# upstream version is refused rather than built under the wrong number.
version=$(for part in MAJOR MINOR PATCH; do
    sed -n "s/^#define STASH_VERSION_$part \([0-9]*\)$/\1/p" include/stash.h
done | paste -sd.)
changelog=$(dpkg-parsechangelog -l debian/changelog -S Version)
if [ "${changelog%-*}" != "$version" ]; then
    echo "deb.sh: debian/changelog is at $changelog, include/stash.h at $version:" \
        "add an entry for $version-1 (dch -v $version-1)" >&2
    exit 1
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
src="$out/stash-$version"
rm -rf "$src" "$out"/*.deb "$out"/*.ddeb "$out"/*.changes "$out"/*.buildinfo
mkdir "$src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # Tracked and new files alike (what the tree holds now), not what
    # .gitignore leaves out; a tracked file deleted in the tree is skipped.
    git ls-files -z --cached --others --exclude-standard |
        tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$src"
else
    tar --exclude=./.git --exclude='./build' --exclude='./build-*' -cf - . | tar -xf - -C "$src"
fi

cd "$src"
# -b: the binary packages only (no source package); unsigned.
DEB_BUILD_OPTIONS="parallel=$jobs ${DEB_BUILD_OPTIONS:-}" dpkg-buildpackage -b -us -uc \
    > "$out/build.log" 2>&1 || {
    tail -n 40 "$out/build.log" >&2
    echo "deb.sh: dpkg-buildpackage failed; its log is $out/build.log" >&2
    exit 1
}
cd "$out"
changes=$(ls stash_"$version"-*_*.changes)
# Any warning or error fails; each warning kept is overridden with its
# reason in debian/*.lintian-overrides.
echo "lintian $changes:"
lintian --fail-on error,warning --display-info "$changes"
echo "the packages are in $out:"
ls -1 "$out"/*.deb
