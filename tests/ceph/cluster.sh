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
#   cluster.sh stop DIR                                stops both daemons
#   cluster.sh osd-stop DIR | osd-start DIR            the OSD alone
#   cluster.sh mon-stop DIR | mon-start DIR            the monitor alone
#   cluster.sh rgw-start DIR [PORT]                    the S3 gateway (radosgw) on PORT
#                                                      (7480), once a request works; the
#                                                      first start makes a user and bucket
#                                                      stash, prints DIR/s3.env (AWS_*)
#   cluster.sh rgw-stop DIR                            the gateway alone
# The client's keyring is DIR/client.keyring ([client] in the conf, so that
# the daemons keep their own); pools of one replica are allowed. With
# CEPH_OWNER=PID, start also leaves a reaper that stops the daemons and
# removes DIR once that process is gone (a test killed at its timeout).
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

mgr_start() {
    ceph-mgr -c "$conf" -i x --pid-file "$dir/mgr.pid" >>"$dir/mgr.out" 2>&1
}

fail() {
    echo "ceph: $1 (see $dir/$2)" >&2
    exit 1
}

stop_pid() {
    [ -f "$1" ] || return 0
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || true
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$1"
}

case $cmd in
start)
    rm -rf "$dir"
    mkdir -p "$dir/mon" "$dir/osd" "$dir/mgr" "$dir/run"
    if [ -n "${CEPH_OWNER:-}" ]; then
        # A session of its own: a kill of the owner's process group spares it.
        setsid sh -c 'tail --pid="$1" -f /dev/null; sh "$2" stop "$3"; rm -rf "$3"' reaper \
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
    t ceph -c "$conf" osd pool create stash 8 >/dev/null 2>&1 || fail "no pool could be made" mon.a.log
    # Ready when a write is (health warns of the one replica).
    i=0
    until echo ok | t rados -c "$conf" -p stash put ready - 2>/dev/null; do
        i=$((i + 1))
        [ $i -lt 60 ] || { echo "ceph: the cluster in $dir never took a write" >&2; exit 1; }
        sleep 0.5
    done
    echo "$conf"
    ;;
stop)
    stop_pid "$dir/rgw.pid"
    stop_pid "$dir/mgr.pid"
    stop_pid "$dir/osd.pid"
    stop_pid "$dir/mon.pid"
    ;;
osd-stop) stop_pid "$dir/osd.pid" ;;
osd-start) osd_start ;;
mon-stop) stop_pid "$dir/mon.pid" ;;
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
    # The gateway's first calls on a bucket load it (seconds): made here,
    # not by the caller's first call, bounded by its own timeout.
    s3 -X PUT --data-binary warm -o /dev/null "$endpoint/stash/.warm" ||
        fail "no object could be written" rgw.log
    s3 -o /dev/null "$endpoint/stash/.warm" && s3 -X DELETE -o /dev/null "$endpoint/stash/.warm" ||
        fail "no object could be read" rgw.log
    echo "$dir/s3.env"
    ;;
rgw-stop) stop_pid "$dir/rgw.pid" ;;
*)
    echo "usage: cluster.sh start|stop|osd-stop|osd-start|mon-stop|mon-start|rgw-start|rgw-stop DIR [PORT] [memstore|bluestore]" >&2
    exit 2
    ;;
esac
