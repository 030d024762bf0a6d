#!/bin/sh
# SPDX-License-Identifier: MIT
# Installs the Debian packages named on the command line that are missing:
# with apt-get when run as root, otherwise prints the apt-get line to run.
missing=""
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "stash: missing packages; run as root:" >&2
    echo "  apt-get install -y$missing" >&2
    exit 1
fi
echo "stash: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q $missing >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q $missing; }
