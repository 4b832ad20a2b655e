/*
 * vmsandbox-journal, provenance: which process wrote each change of the workspace, the step it belongs to, and
 * the content of small text files after each writer's change (so the host can say who made each hunk).
 * Included by journal.c (one program, one file system mark); see there for the daemon and its answers.
 *
 *   Steps.     The host starts each command it is asked to run as `step ID -- ARGV` (this program under the
 *              name "step"): it registers its own process on STEP_SOCKET as the root of step ID, then execs ARGV.
 *   Processes. The kernel's process events (the proc connector) tell every fork, exec and exit: a process
 *              belongs to its parent's step from its fork on (also after the parent ended: ancestry, not time),
 *              with its depth below the step's root; its argv, executable and role (an install script, a git
 *              hook: read from its environment) are read at its exec, before it runs.
 *   Writers.   The first change a process (one exec of it) makes gives it a writer number; each path keeps the
 *              writers that changed it, and for a text file of at most VERSION_MAX bytes its content after each
 *              new writer's change (VERSIONS_BUDGET in all: files only one writer changed are evicted first,
 *              as the host needs no versions to name their one writer).
 *
 * All of it is the guest's word: it informs a person and decides nothing. Everything is bounded; whatever does
 * not fit is said in the answer (the state, or a file's flag), never silently dropped.
 */
#include <linux/cn_proc.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <linux/connector.h>
#include <linux/netlink.h>

#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#ifndef STEP_SOCKET_PATH
#define STEP_SOCKET_PATH "/run/vmsandbox/steps.sock"
#endif
#define MAX_PROCS 200000
#define MAX_DEAD 8192 /* exited processes remembered (their last writes may still be queued) */
#define MAX_STEPS 10000
#define MAX_WRITERS 100000
#define MAX_PATHS 200000
#define MAX_FILE_WRITERS 64
#define MAX_VERSIONS 64
#define VERSION_MAX (256 * 1024)
#define VERSIONS_BUDGET (32 * 1024 * 1024)
#define ARGV_MAX 8192
#define ENVIRON_MAX (64 * 1024)
#define BUCKETS 65536

struct proc {
    int tgid, step, depth, writer, dead;
    char *argv; /* NUL-separated, argv_len bytes */
    size_t argv_len;
    char *exe;
    char role[65];
    struct proc *next;
};

struct writer {
    int pid, step, depth;
    char *argv, *exe;
    size_t argv_len;
    char role[65];
};

struct version {
    int writer;
    char *data;
    size_t len;
};

struct pinfo {
    char *path;
    int writers[MAX_FILE_WRITERS], nwriters;
    const char *flag; /* why no versions are kept */
    struct version *v; /* capv of them allocated, at most MAX_VERSIONS */
    int nv, capv, evicted;
    int created; /* made in the session (a create, not a rename onto it): a new file for the host, one hunk
                  * whose makers are all its writers, so no versions are kept of it */
    struct pinfo *next, *lru_prev, *lru_next;
    int in_lru;
};

static int proc_fd = -1, step_fd = -1, tracing = 1;
static struct proc *procs[BUCKETS];
static size_t nprocs;
static int dead_ring[MAX_DEAD];
static size_t dead_at;
static char *steps[MAX_STEPS];
static int step_roots[MAX_STEPS];
static size_t nsteps;
static struct writer *writers;
static size_t nwriters, cap_writers;
static int unnamed = -1;
static struct pinfo *pinfos[BUCKETS];
static size_t npaths, versions_bytes;
static struct pinfo *lru_head, *lru_tail;
static const char *prov_lost; /* why the answer is partial */

static void lost(const char *why) {
    if (!prov_lost) prov_lost = why;
}

static struct proc **proc_slot(int tgid) {
    struct proc **p = &procs[(unsigned)tgid % BUCKETS];
    while (*p && (*p)->tgid != tgid) p = &(*p)->next;
    return p;
}

static void proc_clear(struct proc *p) {
    free(p->argv);
    free(p->exe);
    p->argv = p->exe = NULL;
    p->argv_len = 0;
    p->role[0] = 0;
}

static void proc_forget(int tgid) {
    struct proc **slot = proc_slot(tgid), *p = *slot;
    if (!p) return;
    *slot = p->next;
    proc_clear(p);
    free(p);
    nprocs--;
}

/* a fresh entry for tgid (an old one of a reused pid is replaced); NULL when the table is full */
static struct proc *proc_new(int tgid) {
    struct proc **slot = proc_slot(tgid);
    if (*slot) {
        proc_clear(*slot);
    } else {
        if (nprocs >= MAX_PROCS) {
            lost("processes-full");
            return NULL;
        }
        *slot = calloc(1, sizeof **slot);
        if (!*slot) die("calloc");
        nprocs++;
    }
    struct proc *p = *slot;
    struct proc *next = p->next;
    memset(p, 0, sizeof *p);
    p->next = next;
    p->tgid = tgid;
    p->step = p->depth = p->writer = -1;
    return p;
}

static ssize_t read_file_at(const char *name, char *buf, size_t size) {
    int fd = open(name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t got = 0;
    ssize_t n;
    while (got < size && (n = read(fd, buf + got, size - got)) > 0) got += (size_t)n;
    close(fd);
    return (ssize_t)got;
}

static const char *env_value(const char *env, size_t len, const char *name) {
    size_t nl = strlen(name);
    for (size_t at = 0; at < len;) {
        const char *e = env + at;
        size_t el = strnlen(e, len - at);
        if (el > nl && memcmp(e, name, nl) == 0 && e[nl] == '=') return e + nl + 1;
        at += el + 1;
    }
    return NULL;
}

/* what a program is, from its environment and argv: a package's install script, a build script, a git hook */
static void read_role(struct proc *p, int tgid) {
    static char env[ENVIRON_MAX];
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/environ", tgid);
    ssize_t n = read_file_at(name, env, sizeof env - 1);
    p->role[0] = 0;
    if (n > 0) {
        env[n] = 0;
        const char *v;
        if ((v = env_value(env, (size_t)n, "npm_lifecycle_event")) && *v) {
            snprintf(p->role, sizeof p->role, "npm:");
            size_t i = 4;
            for (; *v && i < sizeof p->role - 1; v++)
                if ((*v >= 'a' && *v <= 'z') || (*v >= '0' && *v <= '9') || *v == '-' || *v == '_') p->role[i++] = *v;
            p->role[i] = 0;
            if (i == 4) strcat(p->role, "script");
            return;
        }
        if (env_value(env, (size_t)n, "_PYPROJECT_HOOKS_BUILD_BACKEND") || env_value(env, (size_t)n, "PEP517_BUILD_BACKEND")) {
            strcpy(p->role, "build-backend");
            return;
        }
        if (env_value(env, (size_t)n, "CARGO_MANIFEST_DIR") && p->exe && strstr(p->exe, "/build-script-")) {
            strcpy(p->role, "build-script");
            return;
        }
    }
    for (size_t at = 0, i = 0; p->argv && at < p->argv_len && i < 2; i++) {
        if (strstr(p->argv + at, ".git/hooks/")) {
            strcpy(p->role, "git-hook");
            return;
        }
        at += strlen(p->argv + at) + 1;
    }
}

/* argv, executable and role of tgid as /proc shows them now (a program just exec'd: before it runs) */
static void read_identity(struct proc *p, int tgid) {
    char name[64], buf[ARGV_MAX], link[PATH_MAX];
    proc_clear(p);
    snprintf(name, sizeof name, "/proc/%d/cmdline", tgid);
    ssize_t n = read_file_at(name, buf, sizeof buf);
    if (n > 0) {
        if (buf[n - 1] != 0) {
            if ((size_t)n == sizeof buf) n--;
            buf[n++] = 0;
        }
        p->argv = malloc((size_t)n);
        if (!p->argv) die("malloc");
        memcpy(p->argv, buf, (size_t)n);
        p->argv_len = (size_t)n;
    }
    snprintf(name, sizeof name, "/proc/%d/exe", tgid);
    ssize_t l = readlink(name, link, sizeof link - 1);
    if (l > 0) {
        link[l] = 0;
        if (!(p->exe = strdup(link))) die("strdup");
    }
    read_role(p, tgid);
}

static void on_fork(int parent_tgid, int child_pid, int child_tgid) {
    if (child_pid != child_tgid) return; /* a thread: its writes are its process's */
    struct proc *parent = *proc_slot(parent_tgid);
    struct proc *c = proc_new(child_tgid);
    if (!c || !parent) return;
    c->step = parent->step;
    c->depth = parent->depth >= 0 ? parent->depth + 1 : -1;
    c->writer = parent->writer; /* the same program until it execs: the same writer */
    if (parent->argv) {
        if (!(c->argv = malloc(parent->argv_len))) die("malloc");
        memcpy(c->argv, parent->argv, parent->argv_len);
        c->argv_len = parent->argv_len;
    }
    if (parent->exe && !(c->exe = strdup(parent->exe))) die("strdup");
    memcpy(c->role, parent->role, sizeof c->role);
}

static void on_exec(int tgid) {
    struct proc *p = *proc_slot(tgid);
    if (!p && !(p = proc_new(tgid))) return;
    read_identity(p, tgid);
    p->writer = -1; /* another program: another writer */
}

static void on_exit_event(int pid, int tgid) {
    if (pid != tgid) return;
    struct proc *p = *proc_slot(tgid);
    if (!p || p->dead) return;
    p->dead = 1;
    int old = dead_ring[dead_at % MAX_DEAD];
    if (dead_at >= MAX_DEAD) {
        struct proc *o = *proc_slot(old);
        if (o && o->dead) proc_forget(old);
    }
    dead_ring[dead_at++ % MAX_DEAD] = tgid;
}

static void proc_listen(void) {
    proc_fd = socket(PF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_CONNECTOR);
    if (proc_fd < 0) {
        lost("no-process-events");
        return;
    }
    int size = 16 << 20;
    setsockopt(proc_fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size);
    struct sockaddr_nl sa = {.nl_family = AF_NETLINK, .nl_groups = CN_IDX_PROC, .nl_pid = (unsigned)getpid()};
    struct __attribute__((packed)) {
        struct nlmsghdr nl;
        struct cn_msg cn;
        enum proc_cn_mcast_op op;
    } msg;
    memset(&msg, 0, sizeof msg);
    msg.nl.nlmsg_len = sizeof msg;
    msg.nl.nlmsg_type = NLMSG_DONE;
    msg.nl.nlmsg_pid = (unsigned)getpid();
    msg.cn.id.idx = CN_IDX_PROC;
    msg.cn.id.val = CN_VAL_PROC;
    msg.cn.len = sizeof msg.op;
    msg.op = PROC_CN_MCAST_LISTEN;
    if (bind(proc_fd, (struct sockaddr *)&sa, sizeof sa) != 0 || send(proc_fd, &msg, sizeof msg, 0) < 0) {
        close(proc_fd);
        proc_fd = -1;
        lost("no-process-events");
    }
}

static void proc_drain(void) {
    static char buf[65536] __attribute__((aligned(NLMSG_ALIGNTO)));
    while (proc_fd >= 0) {
        ssize_t n = recv(proc_fd, buf, sizeof buf, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == ENOBUFS) {
                lost("process-events-lost");
                continue;
            }
            return; /* EAGAIN */
        }
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type == NLMSG_ERROR || h->nlmsg_type == NLMSG_NOOP) continue;
            struct cn_msg *cn = NLMSG_DATA(h);
            if (cn->id.idx != CN_IDX_PROC || cn->len < sizeof(struct proc_event) - sizeof(((struct proc_event *)0)->event_data)) continue;
            struct proc_event *ev = (struct proc_event *)cn->data;
            if (!tracing) continue;
            switch (ev->what) {
            case PROC_EVENT_FORK:
                on_fork(ev->event_data.fork.parent_tgid, ev->event_data.fork.child_pid, ev->event_data.fork.child_tgid);
                break;
            case PROC_EVENT_EXEC:
                on_exec(ev->event_data.exec.process_tgid);
                break;
            case PROC_EVENT_EXIT:
                on_exit_event(ev->event_data.exit.process_pid, ev->event_data.exit.process_tgid);
                break;
            default:
                break;
            }
        }
    }
}

/* ---------------------------------------------------------------- steps */

static int step_index(const char *id) {
    for (size_t i = 0; i < nsteps; i++)
        if (strcmp(steps[i], id) == 0) return (int)i;
    if (nsteps >= MAX_STEPS) return -1;
    if (!(steps[nsteps] = strdup(id))) die("strdup");
    return (int)nsteps++;
}

static int valid_step(const char *id) {
    size_t n = strlen(id);
    if (n < 1 || n > 32) return 0;
    for (const char *c = id; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9'))) return 0;
    return 1;
}

static void serve_step(void) {
    int c = accept4(step_fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) return;
    struct timeval tv = {0, 200000}; /* the wrapper writes at once: nobody holds the journal up */
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct ucred cred;
    socklen_t len = sizeof cred;
    char req[64] = {0};
    ssize_t n = read(c, req, sizeof req - 1);
    char *nl = n > 0 ? memchr(req, '\n', (size_t)n) : NULL;
    if (nl && getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid > 0) {
        *nl = 0;
        proc_drain(); /* its own fork and exec first */
        struct proc *p = *proc_slot(cred.pid);
        if (!p) p = proc_new(cred.pid);
        int known = -1;
        for (size_t i = 0; valid_step(req) && i < nsteps; i++)
            if (strcmp(steps[i], req) == 0) known = (int)i;
        /* a process already in a step cannot leave it for another, and a step has one root (the first): a
         * program a step runs cannot relabel what it writes as another step's own command */
        if (valid_step(req) && p && p->step < 0 && (known < 0 || step_roots[known] == 0)) {
            int idx = known >= 0 ? known : step_index(req);
            if (idx < 0) {
                lost("steps-full");
            } else {
                p->step = idx;
                p->depth = 0;
                p->writer = -1;
                step_roots[idx] = cred.pid;
                if (!p->argv) read_identity(p, cred.pid);
            }
        }
    }
    if (write(c, "ok\n", 3) < 0) { /* the wrapper goes on either way */
    }
    close(c);
}

/* the wrapper: `step ID -- ARGV...` registers this process as step ID's root, then becomes ARGV */
static int step_main(int argc, char **argv) {
    if (argc < 4 || strcmp(argv[2], "--") != 0) {
        fprintf(stderr, "usage: step ID -- COMMAND [ARG...]\n");
        return 2;
    }
    /* never waits on a journal that is busy or gone (a full backlog: not registered, the command runs anyway) */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strcpy(addr.sun_path, STEP_SOCKET_PATH);
    if (fd >= 0 && valid_step(argv[1]) && connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0 &&
        fcntl(fd, F_SETFL, 0) == 0) {
        struct timeval tv = {2, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char buf[8];
        if (dprintf(fd, "%s\n", argv[1]) > 0 && read(fd, buf, sizeof buf) < 0) { /* unregistered: runs anyway */
        }
    }
    if (fd >= 0) close(fd);
    execvp(argv[3], argv + 3);
    fprintf(stderr, "%s: %s\n", argv[3], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}

/* ---------------------------------------------------------------- writers and versions */

static int new_writer(const struct proc *p, int pid) {
    if (nwriters >= MAX_WRITERS) {
        lost("writers-full");
        return -1;
    }
    if (nwriters == cap_writers) {
        cap_writers = cap_writers ? 2 * cap_writers : 256;
        if (!(writers = realloc(writers, cap_writers * sizeof *writers))) die("realloc");
    }
    struct writer *w = &writers[nwriters];
    memset(w, 0, sizeof *w);
    w->pid = pid;
    w->step = p ? p->step : -1;
    w->depth = p ? p->depth : -1;
    if (p && p->argv) {
        if (!(w->argv = malloc(p->argv_len))) die("malloc");
        memcpy(w->argv, p->argv, p->argv_len);
        w->argv_len = p->argv_len;
    }
    if (p && p->exe && !(w->exe = strdup(p->exe))) die("strdup");
    if (p) memcpy(w->role, p->role, sizeof w->role);
    return (int)nwriters++;
}

/* a process the events did not introduce (it began before the journal, or events were lost): its step by its
 * living ancestors, read from /proc now */
static struct proc *adopt(int pid) {
    char name[64], buf[512];
    int at = pid, depth = 0;
    struct proc *known = NULL;
    for (int i = 0; i < 64 && at > 1; i++, depth++) {
        if (i > 0 && (known = *proc_slot(at))) break;
        snprintf(name, sizeof name, "/proc/%d/stat", at);
        ssize_t n = read_file_at(name, buf, sizeof buf - 1);
        if (n <= 0) break;
        buf[n] = 0;
        char *close_paren = strrchr(buf, ')');
        int ppid;
        if (!close_paren || sscanf(close_paren + 1, " %*c %d", &ppid) != 1) break;
        at = ppid;
    }
    struct proc *p = proc_new(pid);
    if (!p) return NULL;
    if (known && known->step >= 0) {
        p->step = known->step;
        p->depth = known->depth >= 0 ? known->depth + depth : -1;
    }
    read_identity(p, pid);
    return p;
}

static int writer_of(int pid) {
    struct proc *p = pid > 0 ? *proc_slot(pid) : NULL;
    if (!p && pid > 0) {
        proc_drain(); /* a process forked just now: its fork is older than its write */
        p = *proc_slot(pid);
    }
    if (!p && pid > 0) p = adopt(pid);
    if (p && p->writer >= 0) return p->writer;
    if (!p) { /* not even its fork was seen */
        if (unnamed < 0) unnamed = new_writer(NULL, 0);
        return unnamed;
    }
    p->writer = new_writer(p, pid); /* (no argv when it ended before it was read: still its step's, by ancestry) */
    return p->writer;
}

static unsigned path_hash(const char *s) {
    unsigned h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h % BUCKETS;
}

static struct pinfo *pinfo_of(const char *path, int create) {
    struct pinfo **slot = &pinfos[path_hash(path)];
    while (*slot && strcmp((*slot)->path, path) != 0) slot = &(*slot)->next;
    if (*slot || !create) return *slot;
    if (npaths >= MAX_PATHS) {
        lost("paths-full");
        return NULL;
    }
    *slot = calloc(1, sizeof **slot);
    if (!*slot || !((*slot)->path = strdup(path))) die("calloc");
    npaths++;
    return *slot;
}

static void lru_out(struct pinfo *pi) {
    if (!pi->in_lru) return;
    if (pi->lru_prev) pi->lru_prev->lru_next = pi->lru_next; else lru_head = pi->lru_next;
    if (pi->lru_next) pi->lru_next->lru_prev = pi->lru_prev; else lru_tail = pi->lru_prev;
    pi->lru_prev = pi->lru_next = NULL;
    pi->in_lru = 0;
}

static void lru_in(struct pinfo *pi) {
    lru_out(pi);
    pi->lru_prev = lru_tail;
    if (lru_tail) lru_tail->lru_next = pi; else lru_head = pi;
    lru_tail = pi;
    pi->in_lru = 1;
}

static void drop_versions(struct pinfo *pi) {
    for (int i = 0; i < pi->nv; i++) {
        versions_bytes -= pi->v[i].len;
        free(pi->v[i].data);
    }
    pi->nv = pi->capv = 0;
    free(pi->v);
    pi->v = NULL;
    lru_out(pi);
}

static void set_flag(struct pinfo *pi, const char *flag) {
    drop_versions(pi);
    pi->flag = flag;
}

/* room for `more` bytes of versions, evicting files only one writer changed (oldest first; never `keep`) */
static int make_room(size_t more, struct pinfo *keep) {
    while (versions_bytes + more > VERSIONS_BUDGET) {
        struct pinfo *old = lru_head;
        while (old == keep) old = old->lru_next;
        if (!old) return 0;
        drop_versions(old);
        old->evicted = 1;
    }
    return 1;
}

static void note_writer(struct pinfo *pi, int w) {
    for (int i = 0; i < pi->nwriters; i++)
        if (pi->writers[i] == w) return;
    if (pi->nwriters < MAX_FILE_WRITERS)
        pi->writers[pi->nwriters++] = w;
    else if (!pi->flag)
        set_flag(pi, "too-many-writers");
}

/* the file's content now, as writer w left it */
static void snapshot(struct pinfo *pi, int w) {
    if (pi->flag) return;
    if (pi->evicted && !(pi->nwriters == 1 && pi->writers[0] == w)) {
        set_flag(pi, "budget-full"); /* an earlier writer's version was let go when memory ran short */
        return;
    }
    /* beneath the root, through no symlink at all: a guest that swaps a directory for a link between the event
     * and this read makes root open nothing of its choosing (a device, a file outside the workspace) */
    struct open_how how = {.flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    int fd = (int)syscall(SYS_openat2, root_fd, pi->path, &how, sizeof how);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return;
    }
    if (st.st_size > VERSION_MAX) {
        close(fd);
        set_flag(pi, "too-large");
        return;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) die("malloc");
    size_t got = 0;
    ssize_t n;
    while (got <= (size_t)st.st_size && (n = read(fd, buf + got, (size_t)st.st_size + 1 - got)) > 0) got += (size_t)n;
    close(fd);
    if (got > VERSION_MAX) {
        free(buf);
        set_flag(pi, "too-large");
        return;
    }
    if (memchr(buf, 0, got)) {
        free(buf);
        set_flag(pi, "not-text");
        return;
    }
    struct version *last = pi->nv ? &pi->v[pi->nv - 1] : NULL;
    if (last && last->len == got && memcmp(last->data, buf, got) == 0) {
        free(buf);
        return;
    }
    if (!(last && last->writer == w) && pi->nv >= MAX_VERSIONS) {
        free(buf);
        set_flag(pi, "too-many-versions");
        return;
    }
    if (!make_room(got, pi)) {
        free(buf);
        set_flag(pi, "budget-full");
        return;
    }
    if (last && last->writer == w) {
        versions_bytes -= last->len;
        free(last->data);
    } else {
        if (pi->nv == pi->capv) {
            pi->capv = pi->capv ? 2 * pi->capv : 2;
            if (!(pi->v = realloc(pi->v, (size_t)pi->capv * sizeof *pi->v))) die("realloc");
        }
        last = &pi->v[pi->nv++];
        last->writer = w;
    }
    last->data = buf;
    last->len = got;
    versions_bytes += got;
    if (pi->nwriters <= 1 && pi->nv == 1)
        lru_in(pi);
    else
        lru_out(pi);
}

/* one change of `path` by process `pid` (from journal.c's event) */
static void provenance_event(int pid, const char *path, uint64_t mask, int ondir) {
    if (!tracing) return;
    struct pinfo *pi = pinfo_of(path, 1);
    if (!pi) return;
    int w = writer_of(pid);
    if (w < 0) return;
    if (mask & (FAN_DELETE | FAN_MOVED_FROM)) pi->nwriters = 0; /* what was written there is gone: its remover
                                                                  * is what the host will see of it */
    note_writer(pi, w);
    if (pi->nwriters > 1) lru_out(pi);
    if (ondir) return;
    if (mask & (FAN_DELETE | FAN_MOVED_FROM | FAN_CREATE)) { /* another file from here on */
        drop_versions(pi);
        pi->flag = NULL;
        pi->evicted = 0;
        pi->created = (mask & FAN_CREATE) != 0;
    }
    /* a rename onto the name (an editor's or `sed -i`'s save) or a write closed: the content as it left it */
    if ((mask & (FAN_MOVED_TO | FAN_CLOSE_WRITE)) && !pi->created) snapshot(pi, w);
}

/* ---------------------------------------------------------------- the answer */

static void put_escaped(FILE *out, const char *s, size_t len) {
    fputc('=', out);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x21 || c > 0x7e || c == '\\')
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out);
    }
}

static void put_base64(FILE *out, const unsigned char *s, size_t len) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)s[i] << 16 | (i + 1 < len ? (unsigned)s[i + 1] << 8 : 0) | (i + 2 < len ? s[i + 2] : 0);
        fputc(abc[v >> 18 & 63], out);
        fputc(abc[v >> 12 & 63], out);
        fputc(i + 1 < len ? abc[v >> 6 & 63] : '=', out);
        fputc(i + 2 < len ? abc[v & 63] : '=', out);
    }
    fputc('\n', out);
}

static void answer_provenance(FILE *out) {
    drain();
    proc_drain();
    size_t records = 0;
    const char *state = !origin ? "journal-restarted" : broken_seq && strcmp(broken_why, "events-lost") == 0 ? "events-lost"
                      : !tracing ? "tracing-off" : prov_lost ? prov_lost : "complete";
    fprintf(out, "provenance %s %s\n", instance, state);
    fprintf(out, "usage %zu %zu %zu %zu\n", versions_bytes, npaths, nwriters, nprocs);
    records++;
    for (size_t i = 0; i < nsteps; i++, records++) fprintf(out, "step %s %d\n", steps[i], step_roots[i]);
    char *named = calloc(nwriters + 1, 1); /* the writers some file names: the others are not sent */
    if (!named) die("calloc");
    for (size_t b = 0; b < BUCKETS; b++)
        for (struct pinfo *pi = pinfos[b]; pi; pi = pi->next) {
            for (int i = 0; i < pi->nwriters; i++) named[pi->writers[i]] = 1;
            for (int i = 0; i < pi->nv; i++) named[pi->v[i].writer] = 1;
        }
    for (size_t i = 0; i < nwriters; i++) {
        if (!named[i]) continue;
        records++;
        struct writer *w = &writers[i];
        fprintf(out, "writer %zu %d %s ", i, w->pid, w->step >= 0 ? steps[w->step] : "-");
        if (w->depth >= 0) fprintf(out, "%d ", w->depth); else fputs("- ", out);
        fprintf(out, "%s ", w->role[0] ? w->role : "-");
        put_escaped(out, w->exe ? w->exe : "", w->exe ? strlen(w->exe) : 0);
        size_t argc = 0;
        for (size_t at = 0; at < w->argv_len; at += strlen(w->argv + at) + 1) argc++;
        fprintf(out, " %zu", argc);
        for (size_t at = 0; at < w->argv_len; at += strlen(w->argv + at) + 1) {
            fputc(' ', out);
            put_escaped(out, w->argv + at, strlen(w->argv + at));
        }
        fputc('\n', out);
    }
    free(named);
    for (size_t b = 0; b < BUCKETS; b++) {
        for (struct pinfo *pi = pinfos[b]; pi; pi = pi->next) {
            if (!pi->nwriters) continue;
            fputs("file ", out);
            print_escaped_word(out, pi->path);
            fprintf(out, " %s ", pi->flag ? pi->flag : "-");
            for (int i = 0; i < pi->nwriters; i++) fprintf(out, "%s%d", i ? "," : "", pi->writers[i]);
            fputc('\n', out);
            records++;
            for (int i = 0; i < pi->nv; i++, records++) {
                fputs("version ", out);
                print_escaped_word(out, pi->path);
                fprintf(out, " %d %zu\n", pi->v[i].writer, 4 * ((pi->v[i].len + 2) / 3));
                put_base64(out, (const unsigned char *)pi->v[i].data, pi->v[i].len);
            }
        }
    }
    fprintf(out, "end %zu\n", records);
}

static void step_listen(void) {
    step_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strcpy(addr.sun_path, STEP_SOCKET_PATH);
    unlink(STEP_SOCKET_PATH);
    if (step_fd < 0 || bind(step_fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(step_fd, 64) != 0 ||
        chmod(STEP_SOCKET_PATH, 0666) != 0) {
        lost("no-step-socket");
        if (step_fd >= 0) close(step_fd);
        step_fd = -1;
    }
}
