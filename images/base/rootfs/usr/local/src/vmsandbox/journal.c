/*
 * vmsandbox-journal: which paths of the workspace changed since a cursor, so that a pull fetches those and
 * does not walk the whole tree (on either side).
 *
 *   journal serve DIR         the daemon (a systemd notify service, vmsandbox-journal@.service): a fanotify
 *                             mark on DIR's whole file system; answers queries on SOCKET
 *   journal since ID SEQ      ask it: prints "ok ID SEQ COUNT" and COUNT escaped paths (one per line,
 *                             relative to DIR, bytes outside printable ASCII and "\" as \xNN), or
 *                             "walk ID SEQ REASON" when it cannot answer for sure. SEQ is the new cursor.
 *   journal provenance        ask it who wrote what (provenance.c: the format is the host's
 *                             vmsandbox/sync/provenance/answer.py)
 *   journal tracing on|off    follow writers and keep versions, or not (for a benchmark of its cost)
 *   step ID -- ARGV           (this program under the name "step") run ARGV as the root of step ID
 *
 * The host is the judge of what a guest says (a guest can lie, and only hides its own changes by it); this
 * program's duty is to never leave out a change while it is honest. Everything uncertain is a "walk":
 *   - a cursor from another daemon (it restarted, the guest rebooted) or from before a lost event;
 *   - the first daemon of a workspace answers from SEQ 0 (the tree as the host made it) only if it began at
 *     the workspace's first mount (ORIGIN_MARK did not exist yet);
 *   - a file changed while it had more than one name (a hard link elsewhere changed with it), or moved out of
 *     sight of every recorded name;
 *   - a file of the workspace mapped shared and writable (mmap writes make no events);
 *   - more than MAX_RECORDS changes waiting, or more than MAX_ANSWER paths in one answer.
 * A new directory (created or moved in) is answered with everything under it, walked at query time.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fanotify.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef SOCKET_PATH /* (both can be set with -D for a test outside a guest) */
#define SOCKET_PATH "/run/vmsandbox/journal.sock"
#endif
#ifndef ORIGIN_MARK
#define ORIGIN_MARK "/var/lib/vmsandbox/journal-began"
#endif
#define MAX_RECORDS 2000000
#define MAX_ANSWER 200000

enum kind { ENTRY = 'E', TREE = 'T', CONTENT = 'C' };

struct record {
    uint64_t seq;
    char kind;
    char *path; /* relative to the root; "" is the root itself */
    struct file_handle *handle; /* CONTENT: the changed file itself */
};

static int fan_fd = -1, root_fd = -1;
static char root[PATH_MAX];
static size_t root_len;
static dev_t root_dev;
static char instance[33];
static uint64_t seq, broken_seq, pruned;
static int origin; /* began at the workspace's first mount: SEQ 0 is the tree as the host made it */
static const char *broken_why = "";
static struct record *records;
static size_t nrecords, cap_records;

static void die(const char *what) {
    fprintf(stderr, "vmsandbox-journal: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void drain(void);
static void print_escaped_word(FILE *out, const char *s);
#include "provenance.c"

static void set_broken(const char *why) {
    broken_seq = ++seq;
    broken_why = why;
    for (size_t i = 0; i < nrecords; i++) {
        free(records[i].path);
        free(records[i].handle);
    }
    nrecords = 0;
}

static void add(char kind, const char *path, const struct file_handle *h) {
    if (nrecords > 0) {
        struct record *last = &records[nrecords - 1];
        if (last->kind == kind && strcmp(last->path, path) == 0) {
            last->seq = ++seq; /* the same file written again: one record */
            return;
        }
    }
    if (nrecords >= MAX_RECORDS) {
        set_broken("too-many-changes");
        return;
    }
    if (nrecords == cap_records) {
        cap_records = cap_records ? 2 * cap_records : 4096;
        records = realloc(records, cap_records * sizeof *records);
        if (!records) die("realloc");
    }
    struct record *r = &records[nrecords++];
    r->seq = ++seq;
    r->kind = kind;
    r->path = strdup(path);
    r->handle = NULL;
    if (h) {
        size_t n = sizeof *h + h->handle_bytes;
        r->handle = malloc(n);
        if (r->handle) memcpy(r->handle, h, n);
    }
    if (!r->path || (h && !r->handle)) die("malloc");
}

/* The path of directory handle h relative to the root, into out; 0 if the directory is gone (its own removal
 * is an event in a directory that still exists, so nothing is lost by skipping), -1 if not understood. */
static int dir_path(struct file_handle *h, char *out, size_t size) {
    int fd = open_by_handle_at(root_fd, h, O_PATH | O_DIRECTORY);
    if (fd < 0) return (errno == ESTALE || errno == ENOENT) ? 0 : -1;
    struct stat st;
    char link[64], buf[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, buf, sizeof buf - 1);
    int gone = fstat(fd, &st) == 0 && st.st_nlink == 0;
    close(fd);
    if (gone) return 0;
    if (n < 0) return -1;
    buf[n] = 0;
    if (strcmp(buf, root) == 0) {
        out[0] = 0;
        return 1;
    }
    if ((size_t)n <= root_len || strncmp(buf, root, root_len) != 0 || buf[root_len] != '/') return -1;
    if (strlen(buf + root_len + 1) >= size) return -1;
    strcpy(out, buf + root_len + 1);
    return 1;
}

static void event(const struct fanotify_event_metadata *m) {
    if (m->mask & FAN_Q_OVERFLOW) {
        set_broken("events-lost");
        return;
    }
    struct file_handle *parent = NULL, *self = NULL;
    const char *name = NULL;
    for (size_t off = m->metadata_len; off < m->event_len;) {
        const struct fanotify_event_info_fid *info = (const void *)((const char *)m + off);
        if (info->hdr.len == 0) break;
        struct file_handle *h = (struct file_handle *)info->handle;
        if (info->hdr.info_type == FAN_EVENT_INFO_TYPE_DFID_NAME) {
            parent = h;
            name = (const char *)h->f_handle + h->handle_bytes;
        } else if (info->hdr.info_type == FAN_EVENT_INFO_TYPE_FID) {
            self = h;
        }
        off += info->hdr.len;
    }
    if (!parent || !name || strcmp(name, ".") == 0) return;
    char dir[PATH_MAX], path[PATH_MAX];
    int found = dir_path(parent, dir, sizeof dir);
    if (found == 0) return;
    if (found < 0 || strlen(dir) + strlen(name) + 2 > sizeof path) {
        set_broken("unresolved-event");
        return;
    }
    snprintf(path, sizeof path, "%s%s%s", dir, dir[0] ? "/" : "", name);
    int ondir = (m->mask & FAN_ONDIR) != 0;
    if (m->mask & (FAN_CREATE | FAN_MOVED_TO)) add(ondir ? TREE : ENTRY, path, NULL);
    if (m->mask & (FAN_DELETE | FAN_MOVED_FROM)) add(ENTRY, path, NULL);
    if (m->mask & (FAN_MODIFY | FAN_CLOSE_WRITE | FAN_ATTRIB)) {
        if (ondir)
            add(ENTRY, path, NULL);
        else if (self)
            add(CONTENT, path, self);
        else
            set_broken("event-without-file");
    }
    provenance_event(m->pid, path, m->mask, ondir);
}

static void drain(void) {
    static char buf[65536] __attribute__((aligned(__alignof__(struct fanotify_event_metadata))));
    for (;;) {
        ssize_t len = read(fan_fd, buf, sizeof buf);
        if (len < 0) {
            if (errno == EAGAIN) return;
            if (errno == EINTR) continue;
            die("read fanotify");
        }
        const struct fanotify_event_metadata *m = (const void *)buf;
        for (; FAN_EVENT_OK(m, len); m = FAN_EVENT_NEXT(m, len)) event(m);
    }
}

/* ---------------------------------------------------------------- answering */

struct answer {
    char **paths;
    size_t n, cap;
    ino_t *seen; /* inodes met while walking new directories */
    size_t nseen, capseen;
    int sorted; /* seen also holds the recorded names' inodes, sorted */
    const char *walk; /* why the host must walk instead */
};

static void put(struct answer *a, const char *path) {
    if (a->walk) return;
    if (a->n >= MAX_ANSWER) {
        a->walk = "answer-too-large";
        return;
    }
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 1024;
        a->paths = realloc(a->paths, a->cap * sizeof *a->paths);
        if (!a->paths) die("realloc");
    }
    if (!(a->paths[a->n++] = strdup(path))) die("strdup");
}

static void saw(struct answer *a, ino_t ino) {
    if (a->nseen == a->capseen) {
        a->capseen = a->capseen ? 2 * a->capseen : 1024;
        a->seen = realloc(a->seen, a->capseen * sizeof *a->seen);
        if (!a->seen) die("realloc");
    }
    a->seen[a->nseen++] = ino;
}

/* path and everything under it (never following a symlink) */
static void walk_tree(struct answer *a, const char *path) {
    put(a, path);
    int fd = openat(root_fd, path[0] ? path : ".", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return; /* not a directory (any more): the entry itself is enough */
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        a->walk = "unreadable-directory";
        return;
    }
    struct dirent *e;
    char child[PATH_MAX];
    while (!a->walk && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if ((size_t)snprintf(child, sizeof child, "%s%s%s", path, path[0] ? "/" : "", e->d_name) >= sizeof child) {
            a->walk = "path-too-long";
            break;
        }
        saw(a, e->d_ino);
        if (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN)
            walk_tree(a, child);
        else
            put(a, child);
    }
    closedir(d);
}

static int current_ino(const char *path, ino_t *ino) {
    struct stat st;
    if (fstatat(root_fd, path[0] ? path : ".", &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
    *ino = st.st_ino;
    return 1;
}

static int by_ino(const void *x, const void *y) {
    ino_t a = *(const ino_t *)x, b = *(const ino_t *)y;
    return a < b ? -1 : a > b;
}

/* The inodes the answer names: what each recorded name (past the cursor) is now, and what walks met. */
static void name_inodes(struct answer *a, uint64_t since) {
    for (size_t i = 0; i < nrecords; i++) {
        ino_t ino;
        if (records[i].seq > since && records[i].kind != TREE && current_ino(records[i].path, &ino)) saw(a, ino);
    }
    qsort(a->seen, a->nseen, sizeof *a->seen, by_ino);
    a->sorted = 1;
}

/* A changed file is accounted for if it is gone, or still has exactly one name and that name is in the answer
 * (the name it was changed under, or one it was moved to since). */
static const char *check_content(struct answer *a, const struct record *r, uint64_t since) {
    int fd = open_by_handle_at(root_fd, r->handle, O_PATH);
    if (fd < 0) return (errno == ESTALE || errno == ENOENT) ? NULL : "unreadable-handle";
    struct stat st;
    int ok = fstat(fd, &st) == 0;
    close(fd);
    if (!ok) return "unreadable-handle";
    if (st.st_nlink == 0) return NULL;
    if (st.st_nlink > 1) return "hard-linked-file-changed";
    ino_t ino;
    if (current_ino(r->path, &ino) && ino == st.st_ino) return NULL;
    if (!a->sorted) name_inodes(a, since);
    return bsearch(&st.st_ino, a->seen, a->nseen, sizeof *a->seen, by_ino) ? NULL : "changed-file-moved";
}

/* a shared writable mapping of a file on the workspace's file system (its writes make no events) */
static const char *mapped_for_writing(void) {
    DIR *proc = opendir("/proc");
    if (!proc) return "no-proc";
    struct dirent *e;
    const char *why = NULL;
    while (!why && (e = readdir(proc))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char name[300], line[4096];
        snprintf(name, sizeof name, "/proc/%s/maps", e->d_name);
        FILE *f = fopen(name, "re");
        if (!f) continue;
        while (fgets(line, sizeof line, f)) {
            char perms[8];
            unsigned major, minor;
            if (sscanf(line, "%*s %7s %*s %x:%x", perms, &major, &minor) == 3 && perms[1] == 'w' &&
                perms[3] == 's' && makedev(major, minor) == root_dev) {
                why = "file-mapped-for-writing";
                break;
            }
        }
        fclose(f);
    }
    closedir(proc);
    return why;
}

static void print_escaped_word(FILE *out, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p < 0x21 || *p > 0x7e || *p == '\\')
            fprintf(out, "\\x%02x", *p);
        else
            fputc(*p, out);
    }
}

static void print_escaped(FILE *out, const char *s) {
    print_escaped_word(out, s);
    fputc('\n', out);
}

static void answer(FILE *out, const char *id, uint64_t since) {
    drain();
    uint64_t now = seq;
    const char *why = NULL;
    if (origin && strcmp(id, "origin") == 0) id = instance;
    if (strcmp(id, instance) != 0)
        why = "another-journal";
    else if (since < broken_seq)
        why = broken_why;
    else if (since < pruned || since > now)
        why = "cursor-out-of-range";
    else
        why = mapped_for_writing();
    struct answer a = {0};
    for (size_t i = 0; !why && !a.walk && i < nrecords; i++) {
        if (records[i].seq <= since) continue;
        if (records[i].kind == TREE)
            walk_tree(&a, records[i].path);
        else
            put(&a, records[i].path);
    }
    for (size_t i = 0; !why && !a.walk && i < nrecords; i++)
        if (records[i].seq > since && records[i].kind == CONTENT) a.walk = check_content(&a, &records[i], since);
    if (!why) why = a.walk;
    if (why) {
        fprintf(out, "walk %s %llu %s\n", instance, (unsigned long long)now, why);
    } else {
        fprintf(out, "ok %s %llu %zu\n", instance, (unsigned long long)now, a.n);
        for (size_t i = 0; i < a.n; i++) print_escaped(out, a.paths[i]);
        /* what the host holds a cursor past is not asked for again: forget it */
        size_t kept = 0;
        for (size_t i = 0; i < nrecords; i++) {
            if (records[i].seq <= since) {
                free(records[i].path);
                free(records[i].handle);
            } else {
                records[kept++] = records[i];
            }
        }
        nrecords = kept;
        if (since > pruned) pruned = since;
    }
    for (size_t i = 0; i < a.n; i++) free(a.paths[i]);
    free(a.paths);
    free(a.seen);
}

static void serve_client(int listener) {
    int c = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) return;
    struct timeval tv = {5, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char req[128];
    size_t got = 0;
    while (got < sizeof req - 1) {
        ssize_t n = read(c, req + got, sizeof req - 1 - got);
        if (n <= 0) break;
        got += (size_t)n;
        if (memchr(req, '\n', got)) break;
    }
    req[got] = 0;
    char id[40];
    unsigned long long since;
    FILE *out = fdopen(c, "w");
    if (!out) {
        close(c);
        return;
    }
    if (strcmp(req, "provenance\n") == 0)
        answer_provenance(out);
    else if (strcmp(req, "tracing on\n") == 0 || strcmp(req, "tracing off\n") == 0)
        fprintf(out, "tracing %s\n", (tracing = req[9] == 'n') ? "on" : "off");
    else if (sscanf(req, "%39s %llu", id, &since) == 2)
        answer(out, id, since);
    else
        fprintf(out, "walk %s %llu bad-request\n", instance, (unsigned long long)seq);
    fclose(out);
}

static void notify_ready(void) {
    const char *sock = getenv("NOTIFY_SOCKET");
    if (!sock || !*sock) return;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t len = strlen(sock);
    if (len >= sizeof addr.sun_path) return;
    memcpy(addr.sun_path, sock, len);
    if (addr.sun_path[0] == '@') addr.sun_path[0] = 0;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    sendto(fd, "READY=1", 7, 0, (struct sockaddr *)&addr, offsetof(struct sockaddr_un, sun_path) + len);
    close(fd);
}

__attribute__((noreturn)) static void serve(const char *dir) {
    if (!realpath(dir, root)) die(dir);
    root_len = strlen(root);
    root_fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root_fd < 0) die(root);
    struct stat st;
    if (fstat(root_fd, &st) != 0) die("stat");
    root_dev = st.st_dev;
    fan_fd = fanotify_init(FAN_CLASS_NOTIF | FAN_REPORT_DFID_NAME | FAN_REPORT_FID | FAN_UNLIMITED_QUEUE |
                               FAN_CLOEXEC | FAN_NONBLOCK,
                           O_RDONLY | O_LARGEFILE);
    if (fan_fd < 0) die("fanotify_init");
    uint64_t mask = FAN_CREATE | FAN_DELETE | FAN_MOVED_FROM | FAN_MOVED_TO | FAN_MODIFY | FAN_ATTRIB |
                    FAN_CLOSE_WRITE | FAN_ONDIR;
    if (fanotify_mark(fan_fd, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, mask, AT_FDCWD, root) != 0) die("fanotify_mark");
    unsigned char raw[16];
    if (getrandom(raw, sizeof raw, 0) != sizeof raw) die("getrandom");
    for (int i = 0; i < 16; i++) snprintf(instance + 2 * i, 3, "%02x", raw[i]);
    /* From SEQ 0 only at the workspace's first mount: any later start missed what happened before it. */
    int first = open(ORIGIN_MARK, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (first >= 0) {
        close(first);
        origin = 1;
    } else {
        seq = broken_seq = 1;
        broken_why = "journal-restarted";
    }
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) die("socket");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strcpy(addr.sun_path, SOCKET_PATH);
    char run_dir[sizeof addr.sun_path];
    strcpy(run_dir, SOCKET_PATH);
    *strrchr(run_dir, '/') = 0;
    if (mkdir(run_dir, 0755) != 0 && errno != EEXIST) die(run_dir); /* a cold boot has no /run/vmsandbox yet */
    unlink(SOCKET_PATH);
    umask(077);
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(listener, 8) != 0) die(SOCKET_PATH);
    proc_listen();
    step_listen();
    notify_ready();
    struct pollfd fds[4] = {{.fd = fan_fd, .events = POLLIN}, {.fd = listener, .events = POLLIN},
                            {.fd = proc_fd, .events = POLLIN}, {.fd = step_fd, .events = POLLIN}};
    for (;;) {
        if (poll(fds, 4, -1) < 0) {
            if (errno == EINTR) continue;
            die("poll");
        }
        if (fds[2].revents & POLLIN) proc_drain(); /* forks and execs before the writes they made */
        if (fds[0].revents & POLLIN) drain();
        if (fds[1].revents & POLLIN) serve_client(listener);
        if (fds[3].revents & POLLIN) serve_step();
    }
}

static int ask_daemon(const char *request) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strcpy(addr.sun_path, SOCKET_PATH);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        printf("walk - 0 no-journal\n");
        return 0;
    }
    dprintf(fd, "%s\n", request);
    char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        if (fwrite(buf, 1, (size_t)n, stdout) != (size_t)n) return 1;
    return n < 0;
}

int main(int argc, char **argv) {
    const char *me = strrchr(argv[0], '/');
    if (strcmp(me ? me + 1 : argv[0], "step") == 0) return step_main(argc, argv);
    if (argc == 3 && strcmp(argv[1], "serve") == 0) serve(argv[2]);
    char request[128];
    if (argc == 4 && strcmp(argv[1], "since") == 0 && strlen(argv[2]) < 40 && strlen(argv[3]) < 40) {
        snprintf(request, sizeof request, "%s %s", argv[2], argv[3]);
        return ask_daemon(request);
    }
    if (argc == 2 && strcmp(argv[1], "provenance") == 0) return ask_daemon("provenance");
    if (argc == 3 && strcmp(argv[1], "tracing") == 0 && (!strcmp(argv[2], "on") || !strcmp(argv[2], "off"))) {
        snprintf(request, sizeof request, "tracing %s", argv[2]);
        return ask_daemon(request);
    }
    fprintf(stderr, "usage: journal serve DIR | journal since ID SEQ | journal provenance | journal tracing on|off\n");
    return 2;
}
