#!/bin/sh
# SPDX-License-Identifier: MIT
# Installs the build into a temporary prefix, then builds and runs an example
# program with nothing but `pkg-config --cflags --libs stash` and with
# find_package(stash), finds the manual pages and the documents, and imports
# the Python module it installed.
set -eu
build=$1 example=$2
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(ls -d "$prefix"/lib*/ | head -n 1)
export PKG_CONFIG_PATH="$libdir/pkgconfig"
test -f "$prefix/include/stash.h"
test -x "$prefix/bin/stash"
cc -std=c11 -Wall -Werror -o "$prefix/hello" "$example" $(pkg-config --cflags --libs stash)
LD_LIBRARY_PATH="$libdir" "$prefix/hello" | grep -q "worker 0 of 2 owns key groups 0..63"
cc -std=c11 -o "$prefix/hello-static" "$example" $(pkg-config --cflags --static stash) \
    "$libdir/libstash.a" $(pkg-config --libs-only-l --static stash | sed 's/-lstash//')
"$prefix/hello-static" | grep -q "worker 0 of 2 owns key groups 0..63"
# find_package(stash) in a CMake project of the user's.
mkdir "$prefix/user"
printf '%s\n' 'cmake_minimum_required(VERSION 3.18)' 'project(hello C)' \
    'find_package(stash 0.1 REQUIRED)' "add_executable(hello $example)" \
    'target_link_libraries(hello PRIVATE stash::stash)' > "$prefix/user/CMakeLists.txt"
cmake -S "$prefix/user" -B "$prefix/user/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/user/build" >/dev/null
LD_LIBRARY_PATH="$libdir" "$prefix/user/build/hello" | grep -q "worker 0 of 2 owns key groups 0..63"
# The manual pages and the documents.
for page in stash.1 stash-get.1 stash-serve.1 stash-snapshot.1; do
    grep -q '^\.SH NAME' "$prefix/share/man/man1/$page"
done
grep -q "stash_reader_open" "$prefix/share/man/man3/stash.h.3"
test -f "$prefix/share/doc/stash/architecture.md"
# The systemd unit, pointed at this prefix's stash, is one systemd accepts.
mkdir "$prefix/units"
sed "s|/[^ ]*/bin/stash |$prefix/bin/stash |g" "$prefix/lib/systemd/system/stash@.service" \
    > "$prefix/units/stash@orders.service"
grep -q '^Type=notify$' "$prefix/units/stash@orders.service"
systemd-analyze verify --man=no "$prefix/units/stash@orders.service"
# The Python module, with Debian's python3, finds the library it came with.
pydir=$(ls -d "$prefix"/lib/python3*/dist-packages | head -n 1)
PYTHONPATH="$pydir" /usr/bin/python3 -c 'import stash, sys; sys.exit(stash.version() != "0.2.0")'
echo "install_pkgconfig: 1 passed, 0 failed"
