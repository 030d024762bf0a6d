#!/bin/sh
# SPDX-License-Identifier: MIT
# A single-node Ceph cluster for the tests: one monitor, one OSD and a
# manager (which tells the monitor how full the OSD and the pools are) on
# 127.0.0.1 (or on the address CEPH_ADDR names), everything
# under DIR, with a disk of CEPH_DISK_BYTES (4 GiB by default: size it from
# what the run writes). Its full ratio is 80% and its failsafe 90% (past
# which it drops writes), long before BlueStore runs out of space and the
# OSD aborts.
#   cluster.sh start DIR [PORT] [memstore|bluestore]   prints DIR/ceph.conf once a write works
#   cluster.sh stop DIR                                stops every daemon
#   cluster.sh destroy DIR                             kills them and removes DIR
#   cluster.sh osd-stop DIR | osd-start DIR            the OSD alone
#   cluster.sh mon-stop DIR | mon-start DIR            the monitor alone
#   cluster.sh rgw-start DIR [PORT]                    the S3 gateway (radosgw) on PORT
#                                                      (7480), once a request works; the
#                                                      first start makes a user and bucket
#                                                      stash, prints DIR/s3.env (AWS_*)
#   cluster.sh rgw-stop DIR | rgw-kill DIR             the gateway alone (kill: SIGKILL)
#   cluster.sh pool DIR NAME | pool-rm DIR NAME        another pool, once a write to it works
#   cluster.sh bucket DIR NAME | bucket-rm DIR NAME    another bucket of user stash
#   cluster.sh shared-start DIR | shared-rgw-start DIR the cluster the suites share and its
#                                                      gateway (ctest's fixtures:
#                                                      tests/CMakeLists.txt)
# The client's keyring is DIR/client.keyring ([client] in the conf, so that
# the daemons keep their own); pools of one replica are allowed. With
# CEPH_OWNER=PID, start also leaves a reaper that kills the daemons and
# removes DIR once that process is gone (a test killed at its timeout),
# unless DIR has been stopped and started again since for another owner.
set -eu
cmd=$1 dir=$2
port=${3:-6789}
store=${4:-memstore}
addr=${CEPH_ADDR:-127.0.0.1}
disk=${CEPH_DISK_BYTES:-4294967296}
conf=$dir/ceph.conf

t() { timeout 20 "$@"; } # the ceph CLI waits forever for a monitor that is gone

osd_start() {
    ceph-osd -c "$conf" -i 0 --pid-file "$dir/osd.pid" >>"$dir/osd.out" 2>&1
}

mon_start() {
    ceph-mon -c "$conf" -i a --pid-file "$dir/mon.pid" >>"$dir/mon.out" 2>&1
}

rgw_start() {
    radosgw -c "$conf" -n client.rgw.x --pid-file "$dir/rgw.pid" >>"$dir/rgw.out" 2>&1
}

# An S3 request signed with the user's keys (AWS Signature Version 4).
s3() {
    . "$dir/s3.env"
    curl -sf --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
        -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$@"
}

# Pool $1, ready when a write to it is (health warns of the one replica).
pool_create() {
    t ceph -c "$conf" osd pool create "$1" 8 >/dev/null 2>&1 || fail "no pool $1 could be made" mon.a.log
    i=0
    until echo ok | t rados -c "$conf" -p "$1" put ready - 2>/dev/null; do
        i=$((i + 1))
        [ $i -lt 60 ] || { echo "ceph: the cluster in $dir never took a write to $1" >&2; exit 1; }
        sleep 0.5
    done
}

# The gateway's first calls on a bucket load it (seconds): made here, not
# by the caller's first call, bounded by its own timeout.
bucket_warm() {
    . "$dir/s3.env"
    s3 -X PUT --data-binary warm -o /dev/null "$AWS_ENDPOINT_URL/$1/.warm" ||
        fail "no object could be written to $1" rgw.log
    s3 -o /dev/null "$AWS_ENDPOINT_URL/$1/.warm" && s3 -X DELETE -o /dev/null "$AWS_ENDPOINT_URL/$1/.warm" ||
        fail "no object could be read from $1" rgw.log
}

mgr_start() {
    ceph-mgr -c "$conf" -i x --pid-file "$dir/mgr.pid" >>"$dir/mgr.out" 2>&1
}

fail() {
    echo "ceph: $1 (see $dir/$2)" >&2
    exit 1
}

# The pid in pid file $1 if that process is a daemon of DIR still (not
# one the pid was given to since a daemon died), else nothing.
daemon_pid() {
    [ -f "$1" ] || return 0
    pid=$(cat "$1")
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir/" && echo "$pid" || true
}

# Stops the daemons whose pid files are named: each asked at once (a
# daemon takes about 2 s), then waited for, 10 s at most, and killed past
# that.
stop_pids() {
    pids=
    for f in "$@"; do
        pid=$(daemon_pid "$f")
        [ -n "$pid" ] || continue
        kill "$pid" 2>/dev/null || true
        pids="$pids $pid"
    done
    for pid in $pids; do
        i=0
        while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
        kill -9 "$pid" 2>/dev/null || true
    done
    rm -f "$@"
}

case $cmd in
start)
    rm -rf "$dir"
    mkdir -p "$dir/mon" "$dir/osd" "$dir/mgr" "$dir/run"
    if [ -n "${CEPH_OWNER:-}" ]; then
        # A session of its own: a kill of the owner's process group spares
        # it. The owner's name in DIR keeps it from killing a cluster
        # started there since (the shared cluster of a build's tests is in
        # the same directory at every run).
        echo "$CEPH_OWNER" >"$dir/owner"
        setsid sh -c 'tail --pid="$1" -f /dev/null
            [ "$(cat "$3/owner" 2>/dev/null)" = "$1" ] || exit 0
            sh "$2" destroy "$3"' reaper \
            "$CEPH_OWNER" "$0" "$dir" </dev/null >/dev/null 2>&1 &
    fi
    fsid=$(cat /proc/sys/kernel/random/uuid)
    cat >"$conf" <<CONF
[global]
fsid = $fsid
mon host = $addr:$port
public addr = $addr
cluster addr = $addr
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon allow pool delete = true
mon data avail warn = 2
mon data avail crit = 1
mon osd nearfull ratio = .70
mon osd backfillfull ratio = .75
mon osd full ratio = .80
osd failsafe full ratio = .90
osd objectstore = $store
osd data = $dir/osd
mon data = $dir/mon
run dir = $dir/run
log file = $dir/\$name.log
admin socket = $dir/run/\$name.asok
memstore device bytes = $disk
bluestore block path = $dir/osd.block
bluestore block size = $disk
bluestore block create = true
bluestore cache autotune = false
bluestore cache size = 67108864
osd memory target = 536870912
osd max object name len = 256
osd max object namespace len = 64
osd crush chooseleaf type = 0
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon max pg per osd = 1000
CONF
    cat >>"$conf" <<CONF
[client]
keyring = $dir/client.keyring
admin socket = $dir/run/\$name.\$pid.asok
rados osd op timeout = 10
client mount timeout = 10
[mon]
keyring = $dir/mon.keyring
[osd]
keyring = $dir/osd.keyring
[mgr]
keyring = $dir/mgr.keyring
mgr data = $dir/mgr
CONF
    ceph-authtool --create-keyring "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph-authtool --create-keyring "$dir/client.keyring" --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
    ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/client.keyring" >/dev/null
    monmaptool --create --add a "$addr:$port" --fsid "$fsid" "$dir/monmap" >/dev/null
    ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon.keyring" \
        >>"$dir/mon.out" 2>&1 || fail "the monitor's mkfs failed" mon.out
    mon_start || fail "the monitor did not start" mon.out
    ceph-authtool --create-keyring "$dir/osd.keyring" --gen-key -n osd.0 >/dev/null
    t ceph -c "$conf" auth add osd.0 osd 'allow *' mon 'allow profile osd' -i "$dir/osd.keyring" >/dev/null 2>&1
    t ceph -c "$conf" osd create >/dev/null
    ceph-osd -c "$conf" -i 0 --mkfs --no-mon-config >>"$dir/osd.out" 2>&1 ||
        fail "the OSD's mkfs failed" osd.out
    t ceph -c "$conf" osd crush add osd.0 1.0 host=localhost root=default >/dev/null 2>&1 || true
    osd_start || fail "the OSD did not start" osd.out
    t ceph -c "$conf" auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' \
        >"$dir/mgr.keyring" 2>/dev/null || fail "no key for the manager" mon.a.log
    mgr_start || fail "the manager did not start" mgr.out
    pool_create stash
    echo "$conf"
    ;;
stop)
    # The monitor last: an OSD stopping tells it so, and waits 5 s for a
    # monitor that is gone.
    stop_pids "$dir/rgw.pid" "$dir/mgr.pid" "$dir/osd.pid"
    stop_pids "$dir/mon.pid"
    ;;
destroy)
    # Its data goes with it (a test's cluster, the suites'): every daemon
    # killed at once, none waited for.
    for daemon in rgw mgr osd mon; do
        pid=$(daemon_pid "$dir/$daemon.pid")
        [ -z "$pid" ] || kill -9 "$pid" 2>/dev/null || true
    done
    rm -rf "$dir"
    ;;
osd-stop) stop_pids "$dir/osd.pid" ;;
osd-start) osd_start ;;
mon-stop) stop_pids "$dir/mon.pid" ;;
mon-start) mon_start ;;
rgw-start)
    if ! grep -q '^\[client.rgw.x\]' "$conf"; then
        t ceph -c "$conf" auth get-or-create client.rgw.x mon 'allow rw' osd 'allow rwx' \
            mgr 'allow rw' >"$dir/rgw.keyring" 2>/dev/null || fail "no key for the gateway" mon.a.log
        mkdir -p "$dir/rgw"
        cat >>"$conf" <<CONF
[client.rgw.x]
keyring = $dir/rgw.keyring
rgw frontends = beast endpoint=$addr:${3:-7480}
rgw data = $dir/rgw
log file = $dir/rgw.log
admin socket = $dir/run/rgw.asok
CONF
    fi
    rgw_start || fail "the gateway did not start" rgw.out
    endpoint=http://$(sed -n 's/^rgw frontends = beast endpoint=//p' "$conf")
    i=0
    until curl -sf -o /dev/null "$endpoint/"; do
        i=$((i + 1))
        [ $i -lt 120 ] || fail "the gateway never answered at $endpoint" rgw.log
        sleep 0.5
    done
    if [ ! -f "$dir/s3.env" ]; then
        key=$(od -An -N10 -tx1 /dev/urandom | tr -d ' \n')
        secret=$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')
        timeout 60 radosgw-admin -c "$conf" -n client.rgw.x user create --uid=stash \
            --display-name=stash --access-key="$key" --secret-key="$secret" >/dev/null 2>&1 ||
            fail "no user could be made" rgw.log
        (umask 077 && cat >"$dir/s3.env" <<ENV
AWS_ACCESS_KEY_ID=$key
AWS_SECRET_ACCESS_KEY=$secret
AWS_ENDPOINT_URL=$endpoint
AWS_REGION=us-east-1
ENV
        )
        s3 -X PUT -o /dev/null "$endpoint/stash" || fail "no bucket could be made" rgw.log
    fi
    bucket_warm stash
    echo "$dir/s3.env"
    ;;
rgw-stop) stop_pids "$dir/rgw.pid" ;;
rgw-kill)
    pid=$(daemon_pid "$dir/rgw.pid")
    [ -n "$pid" ] || fail "no gateway to kill" rgw.log
    kill -9 "$pid"
    rm -f "$dir/rgw.pid"
    ;;
pool) pool_create "$3" ;;
pool-rm)
    t ceph -c "$conf" osd pool rm "$3" "$3" --yes-i-really-really-mean-it >/dev/null 2>&1 ||
        fail "pool $3 could not be removed" mon.a.log
    ;;
bucket)
    . "$dir/s3.env"
    s3 -X PUT -o /dev/null "$AWS_ENDPOINT_URL/$3" || fail "no bucket $3 could be made" rgw.log
    bucket_warm "$3"
    ;;
bucket-rm)
    timeout 60 radosgw-admin -c "$conf" -n client.rgw.x bucket rm --bucket="$3" --purge-objects \
        >/dev/null 2>&1 || fail "bucket $3 could not be removed" rgw.log
    ;;
shared-start)
    # Once a run (ctest --repeat runs a fixture again), owned by ctest (the
    # caller's parent): its reaper ends it if the run ends before the
    # fixture's cleanup does. None where Ceph is not installed: each test
    # skips.
    [ -x /usr/bin/ceph-osd ] || { rm -rf "$dir"; exit 0; }
    [ "$(cat "$dir/owner" 2>/dev/null)" != "$PPID" ] || exit 0
    sh "$0" destroy "$dir"
    CEPH_OWNER=$PPID exec sh "$0" start "$dir" $((10000 + $$ % 20000)) bluestore
    ;;
shared-rgw-start)
    [ -f "$conf" ] && [ -x /usr/bin/radosgw ] || exit 0
    [ -z "$(daemon_pid "$dir/rgw.pid")" ] || exit 0
    exec sh "$0" rgw-start "$dir" $((30000 + $$ % 2768))
    ;;
*)
    echo "usage: cluster.sh start|stop|destroy|osd-stop|osd-start|mon-stop|mon-start|rgw-start|rgw-stop|rgw-kill DIR [PORT] [memstore|bluestore]" >&2
    echo "       cluster.sh pool|pool-rm|bucket|bucket-rm DIR NAME" >&2
    echo "       cluster.sh shared-start|shared-rgw-start DIR" >&2
    exit 2
    ;;
esac
