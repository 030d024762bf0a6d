/* SPDX-License-Identifier: MIT */
/*
 * machines.h: machines apart on one Linux host, for the demonstration of a
 * job across hosts and the crash campaign across hosts. A switch is a
 * bridge in a network namespace of its own, joined to this namespace by one
 * veth pair whose end here has the address NET.1 (a free 10.213.X.0/24);
 * a machine is a process holding new network and mount namespaces (and, if
 * asked, a time namespace) with the address NET.(10+i) on the switch and a
 * /dev/shm of its own. Traffic goes only to the addresses made here.
 *
 * Everything goes with the process that made it: the holders die with it
 * (PR_SET_PDEATHSIG), and with them their namespaces, links and mounts.
 * Needs root and a kernel with network, mount and time namespaces.
 */
#ifndef STASH_MACHINES_H
#define STASH_MACHINES_H

#include <stdbool.h>
#include <sys/types.h>

typedef struct machines {
    pid_t sw;        /* holds the switch's network namespace */
    char net[16];    /* "10.213.X." */
    char uplink[16]; /* this namespace's end of the link to the switch */
    const char *log; /* where the commands' output goes (appended) */
    char why[320];   /* what failed, when a call returns -1 */
} machines;

/* What a machine has of its own besides its network and /dev/shm. */
enum {
    MACHINE_VAR_TMP = 1, /* a /var/tmp */
    MACHINE_CLOCK = 2,   /* a monotonic and boot-time clock days apart */
};

/* Makes the switch, its commands' output appended to log: 0, or -1 with
 * m->why saying what failed (not root, no namespaces, no free subnet). */
int machines_open(machines *m, const char *log);

/* A new machine with address NET.(10+i), its port on the switch named
 * after i and generation (a lost machine's successor takes a new one);
 * what (MACHINE_*) it has of its own, days its clock's offset. Returns the
 * pid holding its namespaces, or -1 with m->why. */
pid_t machines_add(machines *m, unsigned i, unsigned generation, int what, unsigned days);

/* Moves the calling process, single-threaded and about to exec or to do a
 * machine's work, into the namespaces held by holder: 0 or -1. */
int machines_enter(pid_t holder);

/* Runs argv (NULL-terminated) in the network namespace of holder (0: this
 * one), its output appended to the log; its exit code. */
int machines_run(const machines *m, pid_t holder, const char *const *argv);

/* A child that gets SIGKILL as soon as the calling process ends: fork's
 * result. */
pid_t machines_fork_bound(void);

#endif /* STASH_MACHINES_H */
