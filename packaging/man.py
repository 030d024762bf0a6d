#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Writes stash's manual pages from the sources of truth: stash(1) and one
page per subcommand from what `stash --help` and `stash CMD --help` print,
stash.h(3) and one page per function from the comments of include/stash.h.

    man.py STASH_BINARY include/stash.h OUTDIR VERSION [--bindir DIR]
           [--sysconfdir DIR] [--datadir DIR] [--unitdir DIR]

Pages go to OUTDIR/man1 and OUTDIR/man3. Their date is the release's:
$SOURCE_DATE_EPOCH when set (reproducible builds), else the date of the
source tree's last commit, else the header's modification time.
"""

import argparse
import datetime
import os
import re
import subprocess
import sys

# ---- roff ------------------------------------------------------------------


def roff(text):
    """Text as roff: backslashes and dashes escaped (a dash is a minus, so
    that an option copied from the page is one), no line taken for a
    request."""
    out = []
    for line in text.split("\n"):
        line = line.replace("\\", "\\e").replace("-", "\\-")
        if line.startswith((".", "'")):
            line = "\\&" + line
        out.append(line)
    return "\n".join(out)


def paragraphs(text):
    """Prose as roff paragraphs: runs of lines joined (filled by the
    formatter), lines indented by two or more spaces kept as they are."""
    out, run, literal = [], [], []

    def flush():
        if run:
            out.append(roff(" ".join(run)))
            run.clear()
        if literal:
            out.extend([".PP", ".nf", ".RS 4", roff("\n".join(literal)), ".RE", ".fi", ".PP"])
            literal.clear()

    for line in text.split("\n"):
        if not line.strip():
            flush()
            if out and out[-1] != ".PP":
                out.append(".PP")
        elif line.startswith("  "):
            if run:
                flush()
            literal.append(line)
        else:
            if literal:
                flush()
            run.append(line.strip())
    flush()
    while out and out[-1] == ".PP":
        out.pop()
    return "\n".join(out)


def literal(text):
    return "\n".join([".nf", roff(text), ".fi"])


def tagged(items):
    """(tag, text) pairs as an indented list; tags in bold."""
    out = []
    for tag, text in items:
        out += [".TP", "\\fB" + roff(tag) + "\\fR", paragraphs(text)]
    return "\n".join(out)


class Page:
    """A manual page: .TH, NAME, then its sections in order."""

    def __init__(self, name, section, title, date, version, names, summary):
        self.name, self.section = name, section
        self.lines = [
            f'.TH "{name.upper()}" "{section}" "{date}" "stash {version}" "{title}"',
            ".SH NAME", f"{roff(', '.join(names))} \\- {roff(summary)}"]

    def add(self, heading, body):
        if body:
            self.lines += [f".SH {heading}", body]

    def write(self, outdir):
        path = os.path.join(outdir, f"man{self.section}", f"{self.name}.{self.section}")
        with open(path, "w") as f:
            f.write("\n".join(self.lines) + "\n")


def release_date(header):
    """YYYY-MM-DD of the release (see the module's comment)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not epoch:
        try:
            r = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(header)), "log",
                                "-1", "--format=%ct"], capture_output=True, text=True)
            epoch = r.stdout.strip() if r.returncode == 0 else ""
        except OSError:  # no git: a tree from a tarball on a machine without it
            epoch = ""
    if not epoch:
        epoch = os.stat(header).st_mtime
    when = datetime.datetime.fromtimestamp(int(float(epoch)), datetime.timezone.utc)
    return when.strftime("%Y-%m-%d")


# ---- what --help does not say: per command -----------------------------------
# Each entry is checked against the code it describes: the exit codes are
# those of tools/*.c, the paths those of the library and the unit. Paths
# written {bindir}, {conf}, {data} and {unitdir} are where this build
# installs them.

ARENA = "/dev/shm/stash.NAME"
EXIT_USAGE = ("2", "a bad or missing argument (the error and the usage are printed).")
EXIT_FAIL = ("1", "the operation failed; the reason is printed on standard error.")

COMMON_OPTIONS = {
    "--help": "Print the usage and what the command does, and exit 0.",
    "--version": "Print stash's version, as `stash --version` does, and exit 0.",
    "--path": "The arena's backing file instead of " + ARENA + " (a file on "
              "hugetlbfs, for one).",
    "--json": "Print JSON instead of text.",
}

EXIT = {
    "stash": [("0", "--help or --version."),
              ("2", "no command or an unknown one."),
              ("other", "a command's own exit status, see its page.")],
    "serve": [("0", "the service stopped on SIGTERM, SIGINT or `stash stop`."),
              ("1", "it could not start (the arena, the checkpoint directory, a restore, "
               "the metrics address; the reason is printed) or the engine stopped on a "
               "failure (its log says which)."),
              ("2", "a bad or missing argument, or a config file refused (the file and "
               "the line are named).")],
    "checkpoint": [("0", "the checkpoint (or savepoint) is complete; its id and directory "
                    "are printed."),
                   ("1", "it failed (the reason is printed), no service serves the arena, or "
                    "--timeout ran out."), EXIT_USAGE],
    "stop": [("0", "the service stopped (after the savepoint, with --savepoint)."),
             ("1", "no service serves the arena, --timeout ran out, or the savepoint failed "
              "and the service goes on."), EXIT_USAGE],
    "create": [("0", "the arena was created."), EXIT_FAIL, EXIT_USAGE],
    "status": [("0", "the status was printed."), EXIT_FAIL, EXIT_USAGE],
    "destroy": [("0", "the arena was removed."), EXIT_FAIL, EXIT_USAGE],
    "get": [("0", "the entry was found and printed."),
            ("1", "the key has no entry in that state and namespace."),
            ("2", "an error: a bad argument, an arena or checkpoint that cannot be read, a "
             "state that is not keyed state.")],
    "scan": [("0", "every entry was listed."),
             ("2", "an error: a bad argument, an arena or checkpoint that cannot be read, a "
              "state that is not keyed state.")],
    "snapshot": [("0", "done; verify: every byte intact; diff: the two hold the same state."),
                 ("1", "verify: the checkpoint is damaged; diff: the two differ; the other "
                  "subcommands: the operation failed (the reason is printed)."),
                 ("2", "a bad argument, or a directory or object that cannot be read.")],
    "bench": [("0", "every bench asked for ran."), EXIT_FAIL, EXIT_USAGE],
    "demo": [("0", "every count and every window ended exactly right."),
             ("1", "a count or window was wrong, or a step failed (the output says which)."),
             EXIT_USAGE],
}

FILES_ARENA = [(ARENA, "The arena, unless --path names another file.")]
FILES_STATE = [
    ("/var/lib/stash", "The private state directory of root, and of a service whose systemd "
     "unit sets StateDirectory= ($STATE_DIRECTORY, as stash@.service does): lmdb "
     "environments (NAME.lmdb) not given a --lmdb-dir, and the unit's checkpoint "
     "directories."),
    ("/var/tmp/stash-UID", "The same for other users."),
]
FILES = {
    "stash": FILES_ARENA + FILES_STATE + [
        ("{bindir}/stash-bench", "The benchmark program `stash bench` runs."),
        ("{unitdir}/stash@.service", "The systemd unit of `stash serve`."),
        ("{conf}/NAME.conf", "The options of stash@NAME.service."),
    ],
    "serve": FILES_ARENA + FILES_STATE + [
        ("{conf}/NAME.conf", "The options stash@NAME.service gives with --config."),
        ("{conf}/example.conf", "A config file to start from."),
        ("{unitdir}/stash@.service", "The systemd unit that runs `stash serve NAME`."),
        ("/run/stash", "Checkpoints of --storage memory, for root and for the unit "
         "($RUNTIME_DIRECTORY); $XDG_RUNTIME_DIR/stash or /dev/shm/stash-UID for other "
         "users."),
        ("DIR/chk-ID, DIR/savepoint-ID", "A checkpoint and a savepoint in the checkpoint "
         "directory (docs/format.md)."),
        ("/etc/ceph/ceph.conf", "The Ceph cluster of --storage rados without --ceph-conf."),
        ("~/.aws/credentials", "The S3 keys of --storage s3:// without the environment's or "
         "--s3-credentials ($AWS_SHARED_CREDENTIALS_FILE names another)."),
    ],
    "checkpoint": FILES_ARENA + [("DIR/chk-ID, DIR/savepoint-ID",
                                  "What the command prints: the checkpoint or savepoint made "
                                  "in the service's checkpoint directory.")],
    "stop": FILES_ARENA,
    "create": FILES_ARENA + FILES_STATE,
    "status": FILES_ARENA,
    "destroy": FILES_ARENA + [("/var/lib/stash/NAME.lmdb, /var/tmp/stash-UID/NAME.lmdb",
                               "An lmdb arena's environments, removed with it.")],
    "get": FILES_ARENA,
    "scan": FILES_ARENA,
    "snapshot": [("DIR/chk-ID", "A checkpoint; DIR/savepoint-ID a savepoint (docs/format.md)."),
                 ("DIR/chk-ID/_metadata", "What a checkpoint holds and the CRC32C of each "
                  "block."),
                 ("/etc/ceph/ceph.conf", "The Ceph cluster of rados:// paths, unless "
                  "$CEPH_CONF names another."),
                 ("~/.aws/credentials", "The S3 keys of s3:// paths without "
                  "$AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY.")],
    "bench": [("{bindir}/stash-bench", "The benchmark program this command runs."),
              ("/var/tmp", "Where the benches that write files write them, unless "
               "$STASH_BENCH_DIR names another directory.")],
    "demo": [("$TMPDIR/stash-demo-*", "The demonstration's checkpoints and output, kept "
              "(/tmp without $TMPDIR); the last line names the directory."),
             ("/dev/shm/stash.demo-PID", "The demonstration's arena, removed at the end."),
             ("{data}/stash/ceph-cluster.sh", "The single-node Ceph cluster of --hosts "
              "without --ceph-conf.")],
}

# Options whose words in --help are spread over sentences about others,
# or given by their argument's name alone (DIR, SIZE).
BACKEND = ("Where a new arena keeps keyed state: in its own memory (heap, the default) or in "
           "LMDB environments on disk, one per key group (lmdb), which may hold more than "
           "memory.")
SIZE = ("A new arena's size in bytes, fixed for its life (64M); K, M and G multiply by "
        "1024, 1024^2 and 1024^3.")
KEY_GROUPS = "A new arena's number of key groups (128, at most 32768)."
FORMAT = ("How keys, namespaces and values are given and shown: text (control bytes and "
          "backslashes escaped; the default), hex or base64.")
OPTION_TEXT = {
    "serve": {
        "--storage": "Where checkpoints go: files in --dir (fs, the default, or file:DIR); "
                     "NAME.checkpoints in the user's private directory in memory (memory, or "
                     "memory:: /run/stash for root and for the unit); objects in the RADOS "
                     "pool --pool of a Ceph cluster (rados, or rados://POOL/JOB) or in an S3 "
                     "bucket (s3://BUCKET/PREFIX), with a copy of the retained ones in --dir.",
        "--dir": "The checkpoint directory (fs and rados: required), created if missing (its "
                 "parent must exist): a directory of this user that no other user may write, "
                 "reached through directories of root or this user. Checked at the start, "
                 "which fails naming it and why.",
        "--interval": "A checkpoint every DURATION, one at a time; without it, only on "
                      "`stash checkpoint`. From the third failure in a row the interval "
                      "doubles with each failure (at most 64 intervals) until one completes.",
        "--min-pause": "At least DURATION between the end of one checkpoint and the start of "
                       "the next.",
        "--timeout": "A checkpoint that a worker does not cut within DURATION fails (60s); "
                     "with --host, the leader aborts a job checkpoint whose parts are not all "
                     "in by then.",
        "--retain": "The newest K complete checkpoints are kept (3), the older ones removed "
                    "before a checkpoint is announced complete. Savepoints are never removed.",
        "--full-every": "With --incremental, a full checkpoint every M (10).",
        "--lz4": "Compress each key group's block with LZ4.",
        "--memory-cap": "--storage memory: the most bytes one checkpoint may take (5M).",
        "--backend": BACKEND,
        "--lmdb-dir": "--backend lmdb: the directory of a new arena's environments; "
                      "NAME.lmdb in the user's private state directory by default "
                      "(/var/lib/stash for root and for the unit).",
        "--size": SIZE,
        "--max-parallelism": KEY_GROUPS,
        "--restore": "A new arena is restored from this checkpoint or savepoint directory (or "
                     "rados://POOL/JOB/job-ID, a job checkpoint) instead of the newest "
                     "complete checkpoint of --dir.",
        "--start-empty": "Start an empty arena even when --dir holds checkpoints none of "
                         "which can be used; without it the start fails, naming each one.",
        "--log-format": "text (the default): one line per event, with the local date, the "
                        "time with milliseconds, the level, the subject and the message; "
                        "json: one object a line (time in UTC, level, subject, message).",
        "--pool": "--storage rados: the RADOS pool the checkpoints go to (required).",
        "--ceph-conf": "--storage rados: the cluster's ceph.conf (Ceph's own search without "
                       "it).",
        "--ceph-id": "--storage rados: the Ceph client's id (admin without it).",
        "--job": "--storage rados: the objects' prefix, JOB/chk-ID/... (the arena's name "
                 "without it).",
        "--storage-timeout": "A remote storage: each call fails after DURATION (10s; rados: "
                             "whole seconds; s3: without a byte moved, retried with backoff "
                             "within it).",
        "--s3-endpoint": "--storage s3://: the service's URL, http[s]://HOST[:PORT] "
                         "($AWS_ENDPOINT_URL_S3 or $AWS_ENDPOINT_URL without it; AWS itself "
                         "without those).",
        "--s3-region": "--storage s3://: the region signed for ($AWS_REGION, "
                       "$AWS_DEFAULT_REGION, else us-east-1).",
        "--s3-credentials": "--storage s3://: a credentials file of the AWS form, which no one "
                            "but its owner or root may write (without it: $AWS_ACCESS_KEY_ID "
                            "and $AWS_SECRET_ACCESS_KEY, else $AWS_SHARED_CREDENTIALS_FILE, "
                            "else ~/.aws/credentials).",
        "--s3-profile": "--storage s3://: the credentials file's section ($AWS_PROFILE, else "
                        "default).",
        "--s3-part-size": "--storage s3://: files above SIZE go up as multipart uploads of "
                          "parts of SIZE, 8 at once (8M; at least 5M).",
        "--ceph-timeout": "--storage rados: each call to the cluster fails after DURATION "
                          "(10s, whole seconds).",
        "--workers": "With --host: the indices of the job's workers this host serves "
                     "(\"0-1,4-5\").",
        "--job-parallelism": "With --host: the job's number of workers.",
        "--lease": "With --host: the lease of the leader and of each host (10s); a host "
                   "whose lease lapses is lost and a live one takes its workers over from "
                   "the newest job checkpoint.",
    },
    "checkpoint": {
        "--timeout": "Wait at most DURATION (no limit by default); exit 1 when it runs out.",
    },
    "stop": {
        "--timeout": "Wait at most DURATION for the stop (no limit by default).",
        "--json": "With --savepoint: print the savepoint as JSON.",
    },
    "create": {
        "--size": "Bytes, fixed for the arena's life (64M); K, M and G multiply by 1024, "
                  "1024^2 and 1024^3.",
        "--max-parallelism": "Key groups (128, at most 32768).",
        "--group": "Mode 0660 instead of 0600: the arena's group may map it too.",
        "--backend": BACKEND,
        "--lmdb-dir": "--backend lmdb: the environments' directory, made if missing and "
                      "emptied if it held any; NAME.lmdb in the user's private state "
                      "directory by default.",
        "--replace": "Replace an existing arena of this user's of that name.",
    },
    "status": {
        "--json": "Print one JSON object.",
    },
    "get": {
        "--state": "The keyed state's name.",
        "--key": "The key.",
        "--ns": "The namespace (the empty one by default).",
        "--map-key": "A map state: the value of map key M alone.",
        "--format": FORMAT,
        "--at-checkpoint": "Read as of the arena's newest complete checkpoint.",
    },
    "scan": {
        "--state": "The keyed state's name.",
        "--key-group": "Key group G alone.",
        "--ns": "Namespace N alone.",
        "--format": FORMAT,
        "--json": "One JSON object a line.",
        "--at-checkpoint": "Read the arena's newest complete checkpoint: one consistent "
                           "version.",
        "--checkpoint": "Read a checkpoint or savepoint directory, with no arena (NAME may "
                        "then be left out).",
    },
    "snapshot": {
        "--json": "ls and info: JSON instead of text.",
        "--verify": "ls: check every byte of each checkpoint, as verify does.",
        "--format": "dump, diff and load: bytes as hex (the default), text (a JSON string "
                    "where the bytes are UTF-8, else {\"hex\": ...}) or base64.",
        "--max-parallelism": "load and rewrite: the savepoint's number of key groups, every "
                             "key in its key group of them.",
        "--size": "load: the bytes of the heap the savepoint is built in (256M).",
        "--drop-state": "rewrite: state S is left out; may be given again.",
        "--rename-state": "rewrite: state A is called B; may be given again.",
        "--ttl": "rewrite: state S's time to live set to DURATION, or removed (none); may be "
                 "given again.",
    },
    "bench": {
        "--json": "Print the results as JSON.",
        "--csv": "Print the results as CSV.",
        "--quick": "Smaller runs, at most 3 repetitions (each bench's --help gives its "
                   "sizes).",
        "--reps": "Repeat each measurement N times (5, 1 to 1000): each figure is the median, "
                  "shown with the lowest and the highest.",
        "--case": "Only the cases whose name starts with PREFIX.",
        "--plot": "PNGs drawn by gnuplot in DIR, with their data.",
        "--backend": "keyed, checkpoint and timers: stash's heap backend (the default) or "
                     "its lmdb backend.",
        "--memory-budget": "keyed with --backend lmdb: once loaded, the data's cached pages "
                           "are held to a quarter of its payload (auto) or BYTES, in a memory "
                           "cgroup of the bench's own.",
        "--storage": "checkpoint: checkpoints to files (fs, the default) or into the RADOS "
                     "pool --pool.",
        "--pool": "checkpoint --storage rados: the pool.",
        "--dir": "io: where the file goes (/var/tmp); it is removed afterwards.",
        "--size": "io: the file's size (2G, 256M with --quick).",
    },
    "demo": {
        "--ceph-conf": "With --hosts: this Ceph cluster instead of a single-node one the demo "
                       "starts and stops.",
        "--pool": "With --hosts: the RADOS pool (stash).",
    },
}

ENVIRONMENT = {
    "serve": [
        ("STASH_IO", "threads: the thread-pool I/O engine instead of io_uring, without the "
         "line that says so when io_uring is refused."),
        ("STATE_DIRECTORY, RUNTIME_DIRECTORY", "The private directories systemd gives the "
         "service (StateDirectory=, RuntimeDirectory=), used instead of the defaults above."),
        ("JOURNAL_STREAM", "Set by systemd when standard output goes to the journal: each "
         "text log line then starts with its syslog priority (<6> INFO, <4> WARN, <3> "
         "ERROR), which journald takes and removes."),
        ("NOTIFY_SOCKET", "Set by systemd for Type=notify: READY=1 once the engine serves, "
         "STOPPING=1 when it stops."),
    ],
    "snapshot": [("CEPH_CONF", "The Ceph cluster's configuration for rados:// paths."),
                 ("STASH_CEPH_ID", "The Ceph client's id (admin by default).")],
    "bench": [("STASH_BENCH_DIR", "Where the benches write their files (/var/tmp).")],
    "demo": [("TMPDIR", "Where the demonstration makes its directory (/tmp).")],
}

EXAMPLES = {
    "stash": ["stash create clicks --size 1G",
              "stash serve clicks --dir /var/lib/stash/clicks --interval 10s &",
              "stash status clicks",
              "stash checkpoint clicks --savepoint",
              "stash stop clicks"],
    "serve": ["# checkpoints every 10 s into a directory of this user's, the newest 3 kept",
              "stash serve clicks --dir /var/lib/stash/clicks --interval 10s --retain 3",
              "# a 4 GiB arena on the lmdb backend, metrics for Prometheus on this host",
              "stash serve clicks --dir ckpt --size 4G --backend lmdb --metrics 127.0.0.1:9187",
              "# the same options from a file, as stash@clicks.service runs it",
              "stash serve clicks --config {conf}/clicks.conf",
              "systemctl enable --now stash@clicks"],
    "checkpoint": ["stash checkpoint clicks",
                   "stash checkpoint clicks --savepoint --timeout 1m --json"],
    "stop": ["stash stop clicks --timeout 5m",
             "stash stop clicks --savepoint   # prints the savepoint's directory"],
    "create": ["stash create clicks --size 1G --max-parallelism 256",
               "stash create clicks --group --backend lmdb --lmdb-dir /var/lib/stash/clicks.lmdb"],
    "status": ["stash status clicks",
               "stash status clicks --json | jq .service",
               "stash status clicks --prom > /var/lib/node_exporter/stash-clicks.prom"],
    "destroy": ["stash stop clicks && stash destroy clicks"],
    "get": ["stash get clicks --state counts --key alice",
            "stash get clicks --state sessions --key alice --map-key last --json",
            "stash get --checkpoint /var/lib/stash/clicks/chk-12 --state counts --key alice"],
    "scan": ["stash scan clicks --state counts --key-group 7",
             "stash scan clicks --state counts --at-checkpoint --json | jq -r .key"],
    "snapshot": ["stash snapshot ls /var/lib/stash/clicks --verify",
                 "stash snapshot verify /var/lib/stash/clicks/chk-12",
                 "stash snapshot diff /var/lib/stash/clicks/chk-11 /var/lib/stash/clicks/chk-12",
                 "stash snapshot dump savepoint-13 --format text > entries.jsonl",
                 "stash snapshot load savepoint-edited --format text < entries.jsonl",
                 "stash snapshot rewrite savepoint-13 savepoint-14 --drop-state old "
                 "--max-parallelism 256"],
    "bench": ["stash bench keyed --quick",
              "stash bench checkpoint --backend lmdb --json > checkpoint.json",
              "stash bench all --plot plots"],
    "demo": ["stash demo",
             "stash demo --hosts 3"],
}


def fill(text, paths):
    for key, value in paths.items():
        text = text.replace("{" + key + "}", value)
    return text


# ---- section 1 from --help ---------------------------------------------------------


def run(binary, *args):
    """What the command prints; a --help that fails or says nothing stops
    the pages being written rather than leaving one empty."""
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        sys.exit(f"man.py: {binary} {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def commands(binary):
    """(name, summary) of each subcommand `stash --help` lists."""
    found = []
    for line in run(binary, "--help").splitlines():
        m = re.match(r"^  (\w+)\s+(.*)$", line)
        if m:
            found.append((m.group(1), m.group(2)))
    return found


def split_help(text):
    """A command's --help as (usage lines, the rest): the usage is its first
    line and those indented under it."""
    lines = text.rstrip("\n").split("\n")
    n = 1
    while n < len(lines) and lines[n].startswith(" ") and lines[n].strip():
        n += 1
    usage = [re.sub(r"^usage: ", "", lines[0])] + [line.strip() for line in lines[1:n]]
    # A wrapped synopsis reads as one: its continuation lines joined to the
    # line they continue (a line of its own starts "stash ").
    synopsis = []
    for line in usage:
        if synopsis and not line.startswith("stash "):
            synopsis[-1] += " " + line
        else:
            synopsis.append(line)
    return synopsis, "\n".join(lines[n:])


OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)"
                    r"(?:[ =](\[[A-Z]+\][A-Za-z0-9_|:=.'-]*|[A-Za-z0-9_][A-Za-z0-9_|:=.'-]*))?")


def options_of(text):
    """Each option a text names, with its argument where it shows one, in
    order of first appearance."""
    found = {}
    for m in OPTION.finditer(text):
        name, arg = m.group(1), m.group(2)
        if arg and (arg.startswith("-") or arg in ("and", "or", "is", "the", "a")):
            arg = None
        if name not in found or (arg and not found[name]):
            found[name] = arg
    return found


SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\-\"])|(?<=[.!?])\)\s+")


def sentences(text):
    prose = " ".join(line.strip() for line in text.split("\n") if not line.startswith("  "))
    return [s.strip() for s in SENTENCE_END.split(prose) if s.strip()]


def clauses(sentence):
    return [c.strip() for c in re.split(r";\s+", sentence) if c.strip()]


def option_text(cmd, name, said):
    """What a page says of option name: the words written for it here, else
    the sentences of --help that start with it ("--lz4 compresses ...",
    "With --lazy-restore ..."), else the common options' words, else the
    clauses of --help that name it."""
    if name in OPTION_TEXT.get(cmd, {}):
        return OPTION_TEXT[cmd][name]
    mention = re.compile(re.escape(name) + r"(?![a-z0-9-])")
    lead = re.compile(r"^(?:With |\()?" + re.escape(name) + r"(?![a-z0-9-])")
    hits = [s for s in said if lead.search(s)]
    if hits:
        return " ".join(hits)
    if name in COMMON_OPTIONS:
        return COMMON_OPTIONS[name]
    hits = [c for s in said for c in clauses(s) if mention.search(c)]
    return " ".join(h if h.endswith(".") else h + "." for h in hits[:2]) or "See DESCRIPTION."


def synopsis_roff(lines):
    """Each form of the command as .SY/.YS: the command in bold, then its
    arguments, each bracketed group kept on one line."""
    out = []
    for line in lines:
        m = re.match(r"^(stash(?: [a-z]+)?(?: (?:ls|info|verify|dump|diff|load|rewrite))?)"
                     r"(?= |$)\s*(.*)$", line)
        head, rest = (m.group(1), m.group(2)) if m else (line, "")
        words, depth, word = [], 0, ""
        for ch in rest:
            depth += (ch == "[") - (ch == "]")
            if ch == " " and depth == 0:
                if word:
                    words.append(word)
                word = ""
            else:
                word += ch
        if word:
            words.append(word)
        out.append(f'.SY "{roff(head)}"')
        out += [roff(w).replace(" ", "\\ ") for w in words]
        out.append(".YS")
    return "\n".join(out)


def exit_roff(name):
    return tagged(EXIT[name]) if name in EXIT else ""


def files_roff(name, paths):
    return tagged([(fill(f, paths), fill(t, paths)) for f, t in FILES.get(name, [])])


def examples_roff(name, paths):
    if name not in EXAMPLES:
        return ""
    return "\n".join([".nf", ".RS 4", roff(fill("\n".join(EXAMPLES[name]), paths)), ".RE", ".fi"])


def command_pages(binary, outdir, version, date, paths, api_pages):
    cmds = commands(binary)
    see = ", ".join(f"\\fBstash\\-{c}\\fR(1)" for c, _ in cmds) + ", \\fBstash.h\\fR(3)"
    p = Page("stash", 1, "stash manual", date, version, ["stash"],
             "a keyed-state service for worker processes on one machine")
    p.add("SYNOPSIS", synopsis_roff(["stash COMMAND [ARGS]", "stash --help",
                                     "stash --version"]))
    p.add("DESCRIPTION", paragraphs(
        "Worker processes on one machine map one shared-memory arena and keep Flink-style "
        "keyed and operator state in it (value, list, map, reducing and aggregating state per "
        "key and namespace) with plain loads and stores. A persistence engine, `stash serve`, "
        "checkpoints it asynchronously to files, to memory or to a Ceph cluster, and a new "
        "arena is restored from the newest complete checkpoint, at the same or another number "
        "of workers. Workers use the C library (stash.h(3), pkg-config stash) or the Python "
        "module stash. The commands below create, serve, inspect and remove arenas and read "
        "checkpoints; each takes --help."))
    p.add("COMMANDS", tagged([(f"stash {c}", s[0].upper() + s[1:] + ".") for c, s in cmds]))
    p.add("OPTIONS", tagged([("--help", "Print the commands and exit 0."),
                             ("--version", "Print the version (stash " + version + ") and "
                              "exit 0.")]))
    p.add("EXIT STATUS", exit_roff("stash"))
    p.add("FILES", files_roff("stash", paths))
    p.add("EXAMPLES", examples_roff("stash", paths))
    p.add("SEE ALSO", see)
    p.write(outdir)
    for c, summary in cmds:
        synopsis, rest = split_help(run(binary, c, "--help"))
        said = sentences(rest)
        opts = options_of("\n".join(synopsis))
        for name, arg in options_of(rest).items():
            # An option the description alone names (a bench's own) is one
            # only where it is listed on a line of its own.
            if name not in opts and re.search(r"^  .*" + re.escape(name), rest, re.M):
                opts[name] = arg
        opts.setdefault("--help", None)
        opts.setdefault("--version", None)
        items = [(f"{n} {a}" if a else n, option_text(c, n, said))
                 for n, a in opts.items()]
        p = Page(f"stash-{c}", 1, "stash manual", date, version, [f"stash-{c}"], summary)
        p.add("SYNOPSIS", synopsis_roff(synopsis))
        p.add("DESCRIPTION", paragraphs(rest))
        p.add("OPTIONS", tagged(items))
        p.add("EXIT STATUS", exit_roff(c))
        if c in ENVIRONMENT:
            p.add("ENVIRONMENT", tagged(ENVIRONMENT[c]))
        p.add("FILES", files_roff(c, paths))
        p.add("EXAMPLES", examples_roff(c, paths))
        also = ["\\fBstash\\fR(1)"] + [f"\\fBstash\\-{o}\\fR(1)" for o, _ in cmds
                                       if o != c and o in (SEE_ALSO.get(c, []))]
        if c == "serve":
            also += ["\\fBsystemd.exec\\fR(5)", "\\fBstash_service_start\\fR(3)"]
        p.add("SEE ALSO", ", ".join(also))
        p.write(outdir)


SEE_ALSO = {
    "serve": ["checkpoint", "stop", "status", "snapshot"],
    "checkpoint": ["serve", "snapshot"],
    "stop": ["serve", "checkpoint"],
    "create": ["serve", "destroy", "status"],
    "status": ["serve", "create"],
    "destroy": ["create", "stop"],
    "get": ["scan", "snapshot"],
    "scan": ["get", "snapshot"],
    "snapshot": ["serve", "checkpoint", "get"],
    "bench": ["demo"],
    "demo": ["serve", "bench"],
}

# ---- section 3 from the header -----------------------------------------------------


def comment_text(block):
    """A /* ... */ block's words, its leading stars gone, indentation past
    them kept."""
    lines = block.strip().split("\n")
    out = []
    for line in lines:
        line = line.strip()
        line = re.sub(r"^/\*+ ?", "", line)
        line = re.sub(r"\s*\*+/$", "", line)
        line = re.sub(r"^\* ?", "", line)
        out.append(line)
    while out and not out[0].strip():
        out.pop(0)
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out)


def api_functions(header):
    """[(names, prototypes, comment)], one per page: a declaration with a
    comment of its own starts a page, and the declarations right below it
    without one join it (they share that comment)."""
    text = open(header).read()
    decls = []
    prev_end = -1
    for m in re.finditer(r"^(/\*(?:(?!\*/).)*\*/\n)?(STASH_API\b[^;]*;)", text, re.S | re.M):
        comment, decl = m.group(1) or "", m.group(2)
        # Without a comment of its own, a declaration on the line right
        # below another shares that one's.
        joined = not comment and text[prev_end:m.start(2)] == "\n"
        decls.append((decl, comment, joined))
        prev_end = m.end(2)
    pages = []
    for decl, comment, joined in decls:
        proto = re.sub(r"^STASH_API\s+", "", decl)
        proto = re.sub(r"\n\s+", "\n    ", proto)
        name = re.search(r"(\w+)\s*\(", proto).group(1)
        if joined and pages:
            pages[-1][0].append(name)
            pages[-1][1].append(proto)
        else:
            pages.append(([name], [proto], comment_text(comment) if comment else ""))
    return pages, text


def split_returns(comment):
    """(description, return value) of a function's comment: the sentences
    that start "Returns" say the second, where the first keeps words of its
    own; the rest of the comment, in its order, is the first."""
    said = sentences(comment)
    ret = [s for s in said if s.startswith("Returns")]
    if not ret or len(ret) == len(said):
        return comment, ""
    desc = [s for s in said if not s.startswith("Returns")]
    code = [line for line in comment.split("\n") if line.startswith("  ")]
    text = " ".join(desc)
    if code:
        text += "\n\n" + "\n".join(code)
    return text, " ".join(ret)


def summary_of(comment, name):
    """The page's one line: the comment's first sentence, or its first
    clause where that is long."""
    first = sentences(comment)[0] if comment.strip() else name
    if len(first) > 90:
        cut = re.split(r"[:;(]", first)[0].strip()
        first = cut if len(cut) >= 20 else first
    first = first.rstrip(".").replace("\n", " ")
    word = first.split(" ", 1)[0]
    if len(word) > 1 and word[0].isupper() and word[1:].islower():
        first = first[0].lower() + first[1:]
    return first


def types_used(protos, text):
    """The typedef'd structs of the header that the prototypes pass by
    pointer or by value (options, results, ranges), as the header writes them."""
    out = []
    for t in sorted(set(re.findall(r"\b(stash_\w+)\b", " ".join(protos)))):
        m = re.search(r"^typedef struct " + t + r" \{.*?^\} " + t + ";", text, re.S | re.M)
        if m:
            out.append(m.group(0))
    return out


def api_pages(header, outdir, version, date):
    pages, text = api_functions(header)
    every = []
    for names, protos, comment in pages:
        desc, ret = split_returns(comment) if comment else ("", "")
        p = Page(names[0], 3, "stash library", date, version, names,
                 summary_of(comment, names[0]))
        synopsis = "#include <stash.h>\n\n"
        types = types_used(protos, text)
        if types:
            synopsis += "\n\n".join(types) + "\n\n"
        synopsis += "\n".join(protos)
        p.add("SYNOPSIS", literal(synopsis) + "\n.PP\nLink with \\fIpkg\\-config \\-\\-cflags "
              "\\-\\-libs stash\\fR.")
        p.add("DESCRIPTION", paragraphs(desc) if desc else
              "See \\fBstash.h\\fR(3) for the conventions every function follows.")
        p.add("RETURN VALUE", paragraphs(ret))
        p.add("SEE ALSO", "\\fBstash.h\\fR(3), \\fBstash\\fR(1)")
        p.write(outdir)
        for other in names[1:]:
            with open(os.path.join(outdir, "man3", f"{other}.3"), "w") as f:
                f.write(f".so man3/{names[0]}.3\n")
        every += names
    return every


def overview_page(header, outdir, version, date, functions):
    """stash.h(3): the header's conventions, then every declaration with the
    comments above it, as the header has them."""
    text = open(header).read()
    body = text[text.index("#define STASH_API"):text.rindex("#ifdef __cplusplus")]
    body = body.split("\n", 1)[1].replace("STASH_API ", "")
    start = text.index("/*\n")
    intro = comment_text(text[start:text.index("*/", start) + 2])
    if intro.startswith("stash.h: "):
        intro = intro[len("stash.h: "):]
        intro = intro[0].upper() + intro[1:]
    p = Page("stash.h", 3, "stash library", date, version, ["stash.h"], "the C API of stash")
    p.add("SYNOPSIS", literal("#include <stash.h>\n\ncc prog.c $(pkg-config --cflags --libs "
                              "stash)\ncc -static prog.c $(pkg-config --static --cflags --libs "
                              "stash)"))
    p.add("DESCRIPTION", paragraphs(intro))
    p.add("DECLARATIONS", literal(body.strip("\n")))
    p.add("SEE ALSO", ", ".join(f"\\fB{roff(f)}\\fR(3)" for f in functions) +
          ", \\fBstash\\fR(1)")
    p.write(outdir)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("header")
    ap.add_argument("outdir")
    ap.add_argument("version")
    ap.add_argument("--bindir", default="/usr/bin")
    ap.add_argument("--sysconfdir", default="/etc")
    ap.add_argument("--datadir", default="/usr/share")
    ap.add_argument("--unitdir", default="/lib/systemd/system")
    a = ap.parse_args(argv[1:])
    paths = {"bindir": a.bindir, "conf": a.sysconfdir.rstrip("/") + "/stash",
             "data": a.datadir, "unitdir": a.unitdir}
    for sub in ("man1", "man3"):
        os.makedirs(os.path.join(a.outdir, sub), exist_ok=True)
        for old in os.listdir(os.path.join(a.outdir, sub)):
            os.remove(os.path.join(a.outdir, sub, old))
    date = release_date(a.header)
    functions = api_pages(a.header, a.outdir, a.version, date)
    command_pages(a.binary, a.outdir, a.version, date, paths, functions)
    overview_page(a.header, a.outdir, a.version, date, functions)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
