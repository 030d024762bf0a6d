/* SPDX-License-Identifier: MIT */
/*
 * demo.c: `stash demo`: the service at work. `stash serve demo-PID`
 * checkpoints to a new temporary directory every second (it creates both and
 * touches nothing else) while three worker processes count the words of a
 * generated stream (demo_workers.c) and keep their input offset in operator
 * ListState. Then: a worker is killed with SIGKILL and replaced by one
 * that rolls its key groups and offset back to the last complete checkpoint; the service is killed
 * and restarted, reattaching; finally everything dies and the arena is removed, as a power loss
 * would, and a new service restores the newest checkpoint and new workers resume from their
 * offsets. The events carry timestamps: per word (a user), event-time windows of ten minutes are
 * counted and emitted when their timers fire, through a sink that commits with the checkpoints
 * (demo_windows.c). Every count and every window ends exactly right (exactly once), and each
 * recovery is timed.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/demo.h"
#include "tools/demo_windows.h"

/* The arena: the demo's own, made new. */
static char demo_name[32];

/* `stash serve demo` as a child process of this binary. */
static pid_t start_service(void)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        char *argv[] = {"stash", "serve",  demo_name, "--dir", demo_dir,        "--interval",
                        "1s",    "--size", "256M",    "--lz4", "--incremental", NULL};
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    return pid;
}

/* The service's view through the arena (pid 0 if no service runs). */
static stash_service_info service_info(void)
{
    stash_service_info info = {0};
    stash_arena *a;
    if (stash_arena_open(demo_name, NULL, &a) == 0) {
        stash_service_info_get(a, &info);
        stash_arena_close(a);
    }
    return info;
}

/* Waits, relaying reports, until a service with pid serves (pid 0: any). */
static int await_service(story *s, pid_t pid)
{
    for (uint64_t t0 = demo_now_ns(); demo_now_ns() - t0 < STEP_TIMEOUT_NS;) {
        stash_service_info i = service_info();
        if (i.pid && (pid == 0 || i.pid == pid)) return 0;
        demo_relay(s, 5);
    }
    demo_say("demo: the service never came up\n");
    return -1;
}

/* Waits, relaying reports, until checkpoint id or a later one is complete. */
static int await_checkpoint(story *s, uint64_t id)
{
    for (uint64_t t0 = demo_now_ns(); demo_now_ns() - t0 < STEP_TIMEOUT_NS;) {
        if (service_info().completed >= id) return 0;
        demo_relay(s, 20);
    }
    demo_say("demo: checkpoint %llu never completed\n", (unsigned long long)id);
    return -1;
}

int tool_demo(int argc, char **argv)
{
    if (tool_wants_help(argc, argv)) {
        printf("usage: stash demo [--hosts N [--ceph-conf FILE] [--pool P]]\n"
               "Runs the demonstration in a new directory under $TMPDIR (or /tmp) with a new\n"
               "arena demo-PID, touching nothing else: `stash serve` checkpoints every second\n"
               "while %u worker processes count words (ValueState, MapState), keep their\n"
               "input offsets in operator ListState, and count each word's events in windows\n"
               "of ten minutes of event time, emitted when their timers fire to the files\n"
               "windows-N.out, committed with the checkpoints; a worker is killed and replaced\n"
               "with a rollback, the service is killed and restarted, then everything dies\n"
               "with the arena and a new service restores it. Every count must end exactly\n"
               "right and every window be emitted once with its exact count. The arena is\n"
               "removed at the end; the checkpoints and the output stay, and the last line\n"
               "says where.\n"
               "--hosts N (2 to %u) runs the same job on N hosts, each a `stash serve --host`\n"
               "with an arena of its own, checkpointing into the RADOS pool P (stash) of a\n"
               "Ceph cluster (--ceph-conf; without it a single-node cluster that the demo\n"
               "starts and stops): a host is lost with its service, worker and arena and a\n"
               "live host takes its worker over from the newest job checkpoint, then the\n"
               "leader is lost and the lead moves; every count and window exactly right. With\n"
               "its own cluster and as root, each host is a machine of its own (network and\n"
               "mount namespaces, an address on a bridge of the demo's, a /dev/shm of its\n"
               "own) and the cluster listens on the bridge's uplink; otherwise the hosts share\n"
               "this machine, and the demo says why.\n",
               WORKERS, WORKERS);
        return 0;
    }
    unsigned nhosts = 0;
    const char *conf = NULL, *pool = NULL;
    /* Each option takes a value. */
    for (int i = 1; i < argc; i += 2) {
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n = 0;
        if (val && strcmp(argv[i], "--hosts") == 0 && tool_parse_size(val, &n) == 0 && n >= 2 &&
            n <= WORKERS)
            nhosts = (unsigned)n;
        else if (val && strcmp(argv[i], "--ceph-conf") == 0)
            conf = val;
        else if (val && strcmp(argv[i], "--pool") == 0)
            pool = val;
        else {
            fprintf(stderr, "stash demo: bad or incomplete argument '%s' (see stash demo --help)\n",
                    argv[i]);
            return 2;
        }
    }
    if (nhosts) return demo_hosts(nhosts, conf, pool);
    if (conf || pool) {
        fprintf(stderr, "stash demo: --ceph-conf and --pool go with --hosts N\n");
        return 2;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(demo_dir, sizeof demo_dir, "%s/stash-demo-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(demo_dir)) return tool_fail("demo: a directory for the checkpoints", -errno);
    snprintf(demo_name, sizeof demo_name, "demo-%d", (int)getpid());
    demo_say("== the demo's checkpoints go to %s, its arena is %s\n", demo_dir, demo_name);
    story s = {0};
    int pipefd[2];
    if (pipe(pipefd) < 0) return tool_fail("demo", -errno);
    s.fd = pipefd[0];
    int rc = 0;

    demo_say("== stash serve %s: checkpoints to %s every second\n", demo_name, demo_dir);
    pid_t svc = start_service();
    if (await_service(&s, svc) < 0) return 1;
    demo_say(
        "== %u workers count %u events over %u words (ValueState, MapState), offsets in "
        "operator ListState;\n   per word, windows of ten minutes of event time (timers) go to "
        "%s/windows-N.out, committed with the checkpoints\n",
        WORKERS, EVENTS, WORDS, demo_dir);
    pid_t pids[WORKERS];
    for (uint32_t i = 0; i < WORKERS; i++)
        pids[i] = demo_start_worker(demo_name, i, false, pipefd[1], 0);
    if (await_checkpoint(&s, 2) < 0) return 1;

    uint64_t done = service_info().completed;
    demo_say("== worker 1 (pid %d) killed with SIGKILL after checkpoint %llu\n", (int)pids[1],
             (unsigned long long)done);
    demo_kill_wait(pids[1]);
    /* The service notices within a quarter of a second; then the replacement. */
    for (uint64_t t = demo_now_ns(); demo_now_ns() - t < 400000000ull;) demo_relay(&s, 50);
    pids[1] = demo_start_worker(demo_name, 1, true, pipefd[1], 0);
    if (await_checkpoint(&s, done + 2) < 0) return 1;

    done = service_info().completed;
    demo_say("== the service (pid %d) killed with SIGKILL after checkpoint %llu; the workers go "
             "on\n",
             (int)svc, (unsigned long long)done);
    demo_kill_wait(svc);
    uint64_t t0 = demo_now_ns();
    svc = start_service();
    if (await_service(&s, svc) < 0) return 1;
    double reattach_ms = (double)(demo_now_ns() - t0) / 1e6;
    demo_say("== a new service reattached in %.1f ms\n", reattach_ms);
    if (await_checkpoint(&s, done + 2) < 0) return 1;

    done = service_info().completed;
    demo_say("== power loss after checkpoint %llu: the service and every worker killed, the arena "
             "removed\n",
             (unsigned long long)done);
    demo_kill_wait(svc);
    for (uint32_t i = 0; i < WORKERS; i++) demo_kill_wait(pids[i]);
    stash_arena_destroy(demo_name, NULL);
    t0 = demo_now_ns();
    svc = start_service();
    if (await_service(&s, svc) < 0) return 1;
    double restore_ms = (double)(demo_now_ns() - t0) / 1e6;
    demo_say("== a new service restored the arena in %.1f ms; %u new workers resume from their "
             "offsets\n",
             restore_ms, WORKERS);
    for (uint32_t i = 0; i < WORKERS; i++)
        pids[i] = demo_start_worker(demo_name, i, false, pipefd[1], 0);
    for (uint64_t t = demo_now_ns();
         s.finished + s.bad < WORKERS && demo_now_ns() - t < 4 * STEP_TIMEOUT_NS;)
        demo_relay(&s, 100);
    for (uint32_t i = 0; i < WORKERS; i++) waitpid(pids[i], NULL, 0);

    char *status[] = {"status", demo_name, NULL};
    tool_status(2, status);
    stash_arena *a;
    if (stash_arena_open(demo_name, NULL, &a) == 0) {
        rc = stash_service_request_stop(a, 30000);
        stash_arena_close(a);
    }
    waitpid(svc, NULL, 0);
    uint64_t windows = 0, missing = 0, twice = 0, wrong = 0;
    int checked = demo_windows_check(demo_dir, WORKERS, EVENTS, WORDS, demo_word_of, &windows,
                                     &missing, &twice, &wrong);
    if (checked < 0)
        demo_say("== windows: the output files could not be read: %s\n", stash_strerror(checked));
    else
        demo_say(
            "== windows: %llu (per word and ten minutes of event time) expected from a replay of "
            "the stream; %llu missing, %llu emitted twice, %llu with a wrong count%s\n",
            (unsigned long long)windows, (unsigned long long)missing, (unsigned long long)twice,
            (unsigned long long)wrong, missing + twice + wrong ? "" : ": each exactly once");
    bool ok = rc == 0 && s.bad == 0 && s.finished == WORKERS && checked == 0 &&
              missing + twice + wrong == 0;
    stash_arena_destroy(demo_name, NULL);
    demo_say(
        "== %s; recoveries took %.1f ms (worker rolled back), %.1f ms (service reattached) and "
        "%.1f ms (arena restored); arena %s removed, the checkpoints and windows stay in %s "
        "(stash snapshot ls %s)\n",
        ok ? "every count and window exactly right" : "FAILED", s.rollback_ms, reattach_ms,
        restore_ms, demo_name, demo_dir, demo_dir);
    return ok ? 0 : 1;
}
