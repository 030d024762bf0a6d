/* SPDX-License-Identifier: MIT */
/*
 * machines.c: machines apart on one Linux host (machines.h): namespaces
 * held by a process each, veth pairs on a bridge of their own, made with
 * unshare(2) and ip(8).
 */
#define _GNU_SOURCE
#include "tools/machines.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

pid_t machines_fork_bound(void)
{
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(0);
    }
    return pid;
}

int machines_run(const machines *m, pid_t holder, const char *const *argv)
{
    const char *full[32] = {"nsenter", "-t", NULL, "-n"};
    char t[16];
    size_t n = 0;
    if (holder > 0) {
        snprintf(t, sizeof t, "%d", (int)holder);
        full[2] = t;
        n = 4;
    }
    for (size_t i = 0; argv[i] && n < 31; i++) full[n++] = argv[i];
    full[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int fd = m->log ? open(m->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execvp(full[0], (char *const *)full);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#define RUN(m, holder, ...) machines_run(m, holder, (const char *const[]){__VA_ARGS__, NULL})

/* A process that holds new namespaces (flags; what and days as for
 * machines_add) until its parent ends: its pid once they exist, or -1. */
static pid_t holder(machines *m, int flags, int what, unsigned days)
{
    int p[2];
    if (pipe(p) < 0) {
        snprintf(m->why, sizeof m->why, "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = machines_fork_bound();
    if (pid == 0) {
        close(p[0]);
        const char *failed = NULL;
        if (unshare(flags) < 0) failed = "unshare";
        if (!failed && (flags & CLONE_NEWNS) &&
            (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
             mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") < 0 ||
             ((what & MACHINE_VAR_TMP) &&
              mount("tmpfs", "/var/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") < 0)))
            failed = "mount";
        if (!failed && (flags & CLONE_NEWTIME)) {
            char off[96];
            int n = snprintf(off, sizeof off, "monotonic %u 0\nboottime %u 0\n", days * 86400u,
                             days * 86400u);
            int fd = open("/proc/self/timens_offsets", O_WRONLY | O_CLOEXEC);
            if (fd < 0 || write(fd, off, (size_t)n) != n) failed = "timens_offsets";
            if (fd >= 0) close(fd);
        }
        char msg[120] = "";
        if (failed) snprintf(msg, sizeof msg, "%s: %s", failed, strerror(errno));
        if (write(p[1], msg, strlen(msg) + 1) < 0) _exit(1);
        if (failed) _exit(1);
        for (;;) pause();
    }
    close(p[1]);
    char msg[120] = "no answer";
    ssize_t got = pid > 0 ? read(p[0], msg, sizeof msg - 1) : -1;
    close(p[0]);
    if (got > 0 && msg[0] == '\0') return pid;
    if (got > 0) msg[got] = '\0';
    snprintf(m->why, sizeof m->why,
             "no namespaces could be made (%.120s): root and a kernel with network, mount and time "
             "namespaces are needed",
             pid < 0 ? strerror(errno) : msg);
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return -1;
}

/* Whether 10.213.c.0/24 holds none of this machine's addresses. */
static bool subnet_free(unsigned c)
{
    struct ifaddrs *ifs, *i;
    if (getifaddrs(&ifs) < 0) return false;
    bool free_ = true;
    for (i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        uint32_t a = ntohl(((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr);
        if ((a >> 8) == ((10u << 16) | (213u << 8) | c)) free_ = false;
    }
    freeifaddrs(ifs);
    return free_;
}

int machines_open(machines *m, const char *log)
{
    *m = (machines){.log = log};
    unsigned c = (unsigned)getpid() % 250u;
    for (unsigned tries = 0; tries < 250 && !subnet_free(c); tries++) c = (c + 1) % 250u;
    if (!subnet_free(c)) {
        snprintf(m->why, sizeof m->why, "no free subnet in 10.213.0.0/16");
        return -1;
    }
    snprintf(m->net, sizeof m->net, "10.213.%u.", c);
    m->sw = holder(m, CLONE_NEWNET, 0, 0);
    if (m->sw < 0) return -1;
    char swpid[16], addr[32];
    snprintf(swpid, sizeof swpid, "%d", (int)m->sw);
    snprintf(m->uplink, sizeof m->uplink, "stn%d", (int)getpid() % 1000000);
    snprintf(addr, sizeof addr, "%s1/24", m->net);
    if (RUN(m, m->sw, "ip", "link", "add", "br0", "type", "bridge") ||
        RUN(m, m->sw, "ip", "link", "set", "br0", "up") ||
        RUN(m, 0, "ip", "link", "add", m->uplink, "type", "veth", "peer", "name", "up0", "netns",
            swpid) ||
        RUN(m, 0, "ip", "addr", "add", addr, "dev", m->uplink) ||
        RUN(m, 0, "ip", "link", "set", m->uplink, "up") ||
        RUN(m, m->sw, "ip", "link", "set", "up0", "master", "br0", "up")) {
        snprintf(m->why, sizeof m->why, "the switch could not be made (see %s)", log);
        return -1;
    }
    return 0;
}

pid_t machines_add(machines *m, unsigned i, unsigned generation, int what, unsigned days)
{
    int flags = CLONE_NEWNET | CLONE_NEWNS | ((what & MACHINE_CLOCK) ? CLONE_NEWTIME : 0);
    pid_t h = holder(m, flags, what, days);
    if (h < 0) return -1;
    char hpid[16], port[16], addr[32];
    snprintf(hpid, sizeof hpid, "%d", (int)h);
    snprintf(port, sizeof port, "d%ux%u", i, generation);
    snprintf(addr, sizeof addr, "%s%u/24", m->net, 10 + i);
    if (RUN(m, m->sw, "ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns",
            hpid) ||
        RUN(m, m->sw, "ip", "link", "set", port, "master", "br0", "up") ||
        RUN(m, h, "ip", "addr", "add", addr, "dev", "eth0") ||
        RUN(m, h, "ip", "link", "set", "eth0", "up") ||
        RUN(m, h, "ip", "link", "set", "lo", "up")) {
        snprintf(m->why, sizeof m->why, "machine %u could not be linked to the switch (see %s)", i,
                 m->log);
        kill(h, SIGKILL);
        waitpid(h, NULL, 0);
        return -1;
    }
    return h;
}

int machines_enter(pid_t holder)
{
    static const char *ns[] = {"net", "mnt", "time_for_children"};
    static const int kinds[] = {CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWTIME};
    for (size_t k = 0; k < 3; k++) {
        char path[64], own[64];
        snprintf(path, sizeof path, "/proc/%d/ns/%s", (int)holder, ns[k]);
        snprintf(own, sizeof own, "/proc/self/ns/%s", ns[k]);
        struct stat a, b;
        /* A machine without a time namespace of its own shares this one. */
        if (stat(path, &a) == 0 && stat(own, &b) == 0 && a.st_ino == b.st_ino) continue;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return -1;
        int rc = setns(fd, kinds[k]);
        close(fd);
        if (rc < 0) return -1;
    }
    return chdir("/") < 0 ? -1 : 0;
}
