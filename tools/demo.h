/* SPDX-License-Identifier: MIT */
/*
 * demo.h: what the demonstrations share (demo_workers.c): the stream of
 * words, worker processes that count it exactly once, and the story's
 * report pipe; demo.c tells the story on one host, demo_hosts.c on several.
 */
#ifndef STASH_DEMO_H
#define STASH_DEMO_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "include/stash.h"
#include "tools/tools.h"

#define WORKERS 3u
#define EVENTS 6000000u
#define WORDS 20000u
#define STEP_TIMEOUT_NS 60e9 /* the longest wait for one step of the story */

/* The demo's directory: checkpoints (or a host's), the windows' output. */
extern char demo_dir[256];

/* The story's shared state: the report pipe and what it said. */
typedef struct story {
    int fd;
    char line[512];
    size_t len;
    unsigned finished;  /* workers that reported their end */
    unsigned bad;       /* reports of a failure or a wrong count */
    double rollback_ms; /* what the replacement's rollback took */
} story;

void demo_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t demo_now_ns(void);
/* The word of event i: a deterministic stream every process can replay. */
uint64_t demo_word_of(uint64_t i);
/* Forks worker index of WORKERS on arena (rolling its key groups back
 * first if asked), reporting to fd, on the machine whose namespaces
 * process machine holds (machines.h; 0: this one). */
pid_t demo_start_worker(const char *arena, uint32_t index, bool rollback, int fd, pid_t machine);
/* Relays report lines that arrive within ms. */
void demo_relay(story *s, int ms);
void demo_kill_wait(pid_t pid);

/* `stash demo --hosts N`: the job on N hosts of a Ceph cluster (conf, pool;
 * NULL: a single-node one the demo starts and stops). */
int demo_hosts(unsigned hosts, const char *conf, const char *pool);

#endif /* STASH_DEMO_H */
