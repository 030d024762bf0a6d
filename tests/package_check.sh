#!/bin/sh
# SPDX-License-Identifier: MIT
# The Debian packages as a new machine meets them: installed with apt into
# a fresh Debian 12 root (their dependencies from Debian's archive), then,
# in that root, the unit verified and its sandbox scored, the user made,
# a program built against libstash-dev with pkg-config, the Python module
# imported, and the service run as its user with the example config while
# a Python worker writes and the command reads; then the root booted with
# systemd (systemd-nspawn) and stash@.service run there under its sandbox.
#   package_check.sh DEBDIR
# The root debootstrap makes is kept under $STASH_PACKAGE_CHECK_CACHE
# (/var/cache/stash-package-check) with the packages apt fetched, so a
# second run starts from it at once; each run works on a copy-on-write
# layer over it, thrown away at the end. Needs root and Debian's archive.
set -eu
debdir=$(cd "$1" && pwd)
cache=${STASH_PACKAGE_CHECK_CACHE:-/var/cache/stash-package-check}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# What the checks use beside the packages: the unit's tools, a compiler
# and pkg-config, man.
tools=systemd,gcc,libc6-dev,pkg-config,man-db
passed=0 failed=0

say() { echo "package-check: $*"; }
die() {
    say "$*" >&2
    exit 1
}
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot, mounts)"
ls "$debdir"/libstash0_*.deb "$debdir"/libstash-dev_*.deb "$debdir"/stash_*.deb \
    "$debdir"/python3-stash_*.deb >/dev/null || die "no packages in $debdir (make deb)"

# ---- the root ---------------------------------------------------------------
base=$cache/$suite
if [ "$(cat "$base.tools" 2>/dev/null)" != "$tools" ]; then
    say "making a $suite root in $base (once)"
    rm -rf "$base" "$base.new"
    mkdir -p "$cache"
    debootstrap --variant=minbase --include="$tools" "$suite" "$base.new" "$mirror" \
        >"$cache/debootstrap.log" 2>&1 || die "debootstrap failed: $cache/debootstrap.log"
    mv "$base.new" "$base"
    echo "$tools" >"$base.tools"
fi
mkdir -p "$cache/archives/partial"

work=$(mktemp -d /var/tmp/stash-package-check.XXXXXX)
root=$work/root
mounted=""
cleanup() {
    # Unmounted in the reverse order; lazily where something still holds one.
    for m in $mounted; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
    # Never removed through a mount (the bind of the cached archives).
    for m in $mounted; do
        if mountpoint -q "$m"; then
            say "$m is still mounted: $work left as it is" >&2
            return
        fi
    done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mount_at() { # mount_at DIR ARGS...: mounts and remembers it for cleanup
    dir=$1
    shift
    mount "$@" "$dir"
    mounted="$dir $mounted"
}
mkdir "$root" "$work/upper" "$work/work"
if ! mount_at "$root" -t overlay overlay \
    -o "lowerdir=$base,upperdir=$work/upper,workdir=$work/work" 2>/dev/null; then
    say "no overlayfs here: copying the root"
    cp -a "$base/." "$root/"
fi
mount_at "$root/proc" -t proc proc
mount_at "$root/dev/shm" -t tmpfs -o mode=1777,nosuid,nodev tmpfs
mount_at "$root/var/cache/apt/archives" --bind "$cache/archives"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }

check() { # check WHAT COMMAND...: runs it, counts and says the outcome
    what=$1
    shift
    if out=$("$@" 2>&1); then
        passed=$((passed + 1))
        say "ok: $what"
    else
        failed=$((failed + 1))
        say "FAILED: $what"
        printf '%s\n' "$out" | sed 's/^/    /'
    fi
}

# ---- installing -----------------------------------------------------------
mkdir "$root/debs"
cp "$debdir"/libstash0_*.deb "$debdir"/libstash-dev_*.deb "$debdir"/stash_*.deb \
    "$debdir"/python3-stash_*.deb "$root/debs/"
debs=$(cd "$root/debs" && for d in *.deb; do echo "/debs/$d"; done)
say "installing" $debs
# A Debian 12 machine as installed: the release with its updates.
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb ${mirror%/debian}/debian-security $suite-security main
EOF
in_root apt-get update -q >"$work/apt.log" 2>&1 || die "apt-get update failed: $(tail -5 "$work/apt.log")"
# shellcheck disable=SC2086 # one argument a package
in_root apt-get install -y -q --no-install-recommends $debs >>"$work/apt.log" 2>&1 ||
    die "apt-get install failed: $(tail -20 "$work/apt.log")"
check "the four packages are installed" in_root dpkg-query -W libstash0 libstash-dev stash \
    python3-stash

# ---- the unit and its user ---------------------------------------------------
check "the unit is where systemd looks" test -f "$root/lib/systemd/system/stash@.service"
check "systemd-analyze verify stash@pkgcheck.service" \
    in_root systemd-analyze verify --man=no stash@pkgcheck.service
exposure() {
    in_root systemd-analyze security --offline=true stash@pkgcheck.service 2>&1 |
        sed -n 's/.*Overall exposure level for stash@pkgcheck.service: \([0-9.]*\).*/\1/p'
}
score=$(exposure)
say "systemd-analyze security: exposure $score"
check "the unit's exposure is at most 3.0 ($score)" \
    awk -v s="$score" 'BEGIN { exit !(s != "" && s <= 3.0) }'
check "systemd-sysusers makes the user and group stash" in_root sh -c \
    'systemd-sysusers && getent passwd stash && getent group stash &&
     [ "$(getent passwd stash | cut -d: -f6)" = /var/lib/stash ]'
check "the example config is a conffile" in_root sh -c \
    'dpkg-query -W -f="\${Conffiles}" stash | grep -q " /etc/stash/example.conf "'

# ---- the library from C and from Python ----------------------------------------
# The example the package documents, built with pkg-config alone, and
# statically from libstash.a.
cat >"$root/check-c.sh" <<'EOF'
set -eu
cd /tmp
example=/usr/share/doc/stash/example/hello.c
if [ -f $example ]; then cp $example hello.c; else zcat $example.gz >hello.c; fi
cc -std=c11 -Wall -Werror -o hello hello.c $(pkg-config --cflags --libs stash)
./hello | grep "worker 0 of 2 owns key groups 0..63"
ldd hello | grep -q "libstash.so.0 => /.*/libstash.so.0 "
cc -std=c11 -o hello-static hello.c $(pkg-config --cflags --static stash) \
    /usr/lib/*/libstash.a $(pkg-config --libs-only-l --static stash | sed 's/-lstash//')
./hello-static | grep "worker 0 of 2 owns key groups 0..63"
EOF
check "a C program built with pkg-config stash runs, shared and static" in_root sh /check-c.sh
check "the Python module imports with its C data path" in_root python3 -c \
    'import stash, stash._stash; assert stash.version() == "'"$(in_root stash --version |
        cut -d' ' -f2)"'", stash.version()'
check "man finds stash-serve(1) and stash_worker_open(3)" in_root sh -c \
    'man -w stash-serve && man -w 3 stash_worker_open && man -w stash.h'

# ---- the command --------------------------------------------------------------------
check "stash --version" in_root sh -c 'stash --version | grep -x "stash [0-9]*\.[0-9]*\.[0-9]*"'
check "stash create, status and destroy" in_root sh -c \
    'stash create pkgcheck-cli --size 16M && stash status pkgcheck-cli | grep -q pkgcheck-cli &&
     stash destroy pkgcheck-cli && ! stash status pkgcheck-cli 2>/dev/null'
check "stash snapshot ls of an empty directory" in_root sh -c \
    'mkdir -p /tmp/none && stash snapshot ls /tmp/none'

# The service as the unit runs it, without systemd: the user stash, the
# example config's options in /etc/stash/NAME.conf, a checkpoint directory
# under /var/lib/stash (which StateDirectory= makes under systemd).
cat >"$root/check-serve.sh" <<'EOF'
set -eu
as_stash() { setpriv --reuid=stash --regid=stash --init-groups -- "$@"; }
sed 's|^dir .*|dir /var/lib/stash/pkgcheck|; s|^interval .*|interval 1h|' \
    /etc/stash/example.conf >/etc/stash/pkgcheck.conf
install -d -o stash -g stash -m 0700 /var/lib/stash
as_stash stash serve pkgcheck --config /etc/stash/pkgcheck.conf </dev/null >/tmp/serve.log 2>&1 &
serve=$!
# A check that fails leaves no service behind.
trap 'kill $serve 2>/dev/null || true' EXIT
i=0
until as_stash stash status pkgcheck >/dev/null 2>&1; do
    i=$((i + 1))
    [ $i -lt 100 ] && kill -0 $serve || { cat /tmp/serve.log; exit 1; }
    sleep 0.1
done
as_stash python3 -c '
import stash
w = stash.Worker("pkgcheck", index=0, parallelism=1)
count = w.state("count")
count.write("alice", 41)
count.write("alice", stash.as_int(count.read("alice")) + 1)
w.close()'
as_stash stash checkpoint pkgcheck --timeout 30s | grep "/var/lib/stash/pkgcheck/chk-"
# The key and the value in hex: "alice", 42 as 8 bytes little-endian.
as_stash stash get pkgcheck --state count --key 616c696365 --format hex | grep -x 2a00000000000000
as_stash stash stop pkgcheck --timeout 30s
wait $serve
as_stash stash snapshot verify /var/lib/stash/pkgcheck
grep "INFO service: stopped" /tmp/serve.log
EOF
check "stash serve as stash with the example config, a Python worker, a checkpoint" \
    in_root sh /check-serve.sh

# ---- the unit under systemd -------------------------------------------------------
# The root booted with systemd as its init (systemd-nspawn), the unit
# enabled for an arena: it must come up as systemd starts it, sandbox and
# all, and serve a worker of the user stash outside it.
boot_root() {
    command -v systemd-nspawn >/dev/null || {
        echo "no systemd-nspawn (apt-get install systemd-container)"
        return 1
    }
    # systemd mounts /proc and /dev/shm of its own.
    for m in $root/proc $root/dev/shm $root/var/cache/apt/archives; do umount "$m"; done
    sed 's|^dir .*|dir /var/lib/stash/unit|; s|^interval .*|interval 1s|' \
        "$root/etc/stash/example.conf" >"$root/etc/stash/unit.conf"
    mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
    ln -s /lib/systemd/system/stash@.service \
        "$root/etc/systemd/system/multi-user.target.wants/stash@unit.service"
    systemd-nspawn -q -D "$root" -b --register=no --keep-unit -M stash-package-check \
        </dev/null >"$work/boot.log" 2>&1 &
    nspawn=$!
    i=0
    until init=$(pgrep -P $nspawn) && in_boot systemctl is-active -q stash@unit 2>/dev/null; do
        i=$((i + 1))
        if [ $i -gt 600 ] || ! kill -0 $nspawn 2>/dev/null; then
            tail -n 20 "$work/boot.log"
            in_boot systemctl status stash@unit 2>&1 || true
            return 1
        fi
        sleep 0.1
    done
    echo "booted; stash@unit.service active"
}
in_boot() { nsenter -t "$init" -a -- /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    LC_ALL=C.UTF-8 SYSTEMD_PAGER= "$@"; }
# Shuts the booted root down (at most 30 s, then the container is killed)
# before its file systems go.
poweroff_root() {
    [ -n "$nspawn" ] || return 0
    [ -z "${init:-}" ] || in_boot systemctl poweroff >/dev/null 2>&1 || true
    i=0
    while kill -0 $nspawn 2>/dev/null && [ $i -lt 300 ]; do
        i=$((i + 1))
        sleep 0.1
    done
    kill -KILL $nspawn 2>/dev/null || true
    wait $nspawn 2>/dev/null || true
    nspawn=""
}
nspawn=""
trap 'poweroff_root; cleanup' EXIT
cat >"$root/check-unit.sh" <<'EOF'
set -eu
as_stash() { setpriv --reuid=stash --regid=stash --init-groups -- "$@"; }
systemctl show -p StatusText stash@unit | grep -x StatusText=serving
systemd-analyze security stash@unit.service | tail -n 1
# A worker outside the service, as its user, on the arena the service made.
as_stash python3 -c '
import stash
w = stash.Worker("unit", index=0, parallelism=1)
w.state("count").write("bob", 7)
w.close()'
as_stash stash checkpoint unit --timeout 30s | grep "/var/lib/stash/unit/chk-"
# One that dies: the service's warning reaches the journal as one.
as_stash python3 -c '
import os, stash
w = stash.Worker("unit", index=0, parallelism=1)
os.kill(os.getpid(), 9)' || true
i=0
until journalctl -u stash@unit -p warning -o cat | grep -q "WARN worker 0: pid .* died"; do
    i=$((i + 1)); [ $i -lt 100 ] || { journalctl -u stash@unit -o cat; exit 1; }; sleep 0.1
done
# Each at its level's priority (warning 4, info 6), the prefix taken off.
journalctl -u stash@unit -p 4..4 -o cat | grep -q "WARN worker 0: pid .* died"
journalctl -u stash@unit -p 6..6 -o cat | grep -q "INFO service: serving"
! journalctl -u stash@unit -p 4..4 -o cat | grep INFO
! journalctl -u stash@unit -o cat | grep "^<"
# A checkpoint directory outside /var/lib/stash: refused until a drop-in allows it.
install -d -o stash -g stash -m 0700 /srv/checkpoints
sed 's|^dir .*|dir /srv/checkpoints/other|' /etc/stash/unit.conf >/etc/stash/other.conf
! systemctl start stash@other 2>/dev/null
journalctl -u stash@other -o cat | grep "Read-only file system"
systemctl stop stash@other
systemctl reset-failed stash@other 2>/dev/null || true
mkdir -p /etc/systemd/system/stash@other.service.d
printf '[Service]\nReadWritePaths=/srv/checkpoints\n' \
    >/etc/systemd/system/stash@other.service.d/checkpoints.conf
systemctl daemon-reload
systemctl start stash@other
as_stash stash checkpoint other --timeout 30s | grep "/srv/checkpoints/other/chk-"
# Stopped with stash stop; the arena stays for the workers (RemoveIPC=no).
systemctl stop stash@unit stash@other
journalctl -u stash@unit -o cat | grep "INFO service: stopped"
test -f /dev/shm/stash.unit
EOF
if boot_root >"$work/boot.out" 2>&1; then
    say "$(cat "$work/boot.out")"
    check "under systemd: the service ready, a worker of stash, journal priorities, a drop-in, a stop" \
        in_boot sh /check-unit.sh
    poweroff_root
else
    # Said, not passed: a machine where systemd cannot boot a container.
    say "SKIPPED: the unit under systemd: $(cat "$work/boot.out")"
fi

say "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
