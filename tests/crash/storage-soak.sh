#!/bin/sh
# SPDX-License-Identifier: MIT
# The crash campaign with its checkpoints in S3 as well: the radosgw of a
# single-node Ceph cluster this script starts (and stops, also when it is
# killed), for MINUTES minutes (SEED replays a sequence of events).
#   storage-soak.sh BUILD MINUTES [SEED]
set -eu
build=$1 minutes=$2 seed=${3:-}
here=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d /tmp/stash-soak-ceph.XXXXXX)
trap 'sh "$here/ceph/cluster.sh" stop "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT INT TERM
CEPH_OWNER=$$ CEPH_DISK_BYTES=$((8 << 30)) sh "$here/ceph/cluster.sh" start "$dir" 6899 bluestore >/dev/null
sh "$here/ceph/cluster.sh" rgw-start "$dir" 7499 >/dev/null
set -a
. "$dir/s3.env"
set +a
CEPH_CONF=$dir/ceph.conf "$build/tests/crash/stash-crash" --minutes "$minutes" \
    --storage s3://stash/soak ${seed:+--seed "$seed"}
