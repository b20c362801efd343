/*
 * libgmount_preload: jobs read and write the files their node holds at disk speed.
 *
 * Loaded with LD_PRELOAD into jobs that gmount starts (and into `gmount shell`). It
 * intercepts the libc calls that name a path -- open/openat/creat/fopen and the stat
 * family -- and, for a path inside a gmount mount of this machine whose file this node
 * holds itself, makes the call on the file in the node's export instead: reads, writes,
 * mmap and fstat on the descriptor never pass through FUSE. Everything else -- other
 * nodes' files, directories, symlinks, renames, unlinks, a daemon that does not answer --
 * goes through the mount as before.
 *
 * The daemon's word. The mount's root advertises the daemon's socket in its xattr
 * `user.gmount.bypass`. The daemon's hello gives its export root, a lease (about a
 * second) and the two marks of export files that are not its own files: the xattr of a
 * staged replica and the name of a staging copy. While the lease runs, a regular file at
 * the same path in the export, reached without a symlink and carrying neither mark, is
 * this node's own file -- the one the namespace opens first (own export, then the others;
 * docs/design.md) -- and stat or a read-only open uses it without asking again. A marked
 * file (a replica that may be stale) is asked about (`R`): the daemon checks the replica's
 * source as an open through the mount would. When the lease ends the hello is repeated,
 * so a daemon that stopped serving (or died) sends jobs back to the mount within a second.
 *
 * What stays on the mount, so every node sees what it would have seen:
 * - creates and truncations (O_CREAT, O_TRUNC) are made through the mount first (the
 *   directory's home hears of them, no twins); only then is the descriptor swapped for
 *   the export file's;
 * - opening for writing asks the daemon (`W`), which refuses replicas (writes go to their
 *   source) and watches the file with inotify; closing such a descriptor tells it (`C`),
 *   so the directory's home learns the closed size before close() returns; the inotify
 *   watch covers descriptors closed by exit or inherited across exec;
 * - unlink, rename, mkdir, chmod, utimes, xattrs and directory listings.
 *
 * Statically linked programs do not load this library; they use the mount.
 * GMOUNT_BYPASS=0 in the environment switches it off.
 *
 * The wire format with the daemon (gmountpy/node/bypass.py), integers little-endian:
 *   request  u32 length of what follows | u8 op | u8 0 | u16 0 | path bytes
 *   reply    u32 length of what follows | i32 status | payload bytes
 * ops: 'H' hello (payload: export root NUL staged xattr NUL staging mark NUL lease ms),
 * 'R' read a marked file, 'W' open for writing, 'C' a descriptor open for writing was
 * closed. status 0: served by this node (payload: the file's path in the export);
 * anything else: use the mount.
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <linux/close_range.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#ifndef RESOLVE_NO_SYMLINKS
struct open_how {
    uint64_t flags;
    uint64_t mode;
    uint64_t resolve;
};
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_NO_SYMLINKS 0x04
#else
#include <linux/openat2.h>
#endif

#define GM_EXPORT __attribute__((visibility("default")))

#define MAX_MOUNTS 64
#define MAX_CONNECTIONS 8
#define MAX_TRACKED_FD 65536
#define BYPASS_XATTR "user.gmount.bypass"
#define PROTOCOL "gmount-bypass 2 "
#define MOUNT_RESCAN_NS 1000000000LL    /* a path outside every known mount rescans at most this often */
#define RETRY_NS 2000000000LL           /* a mount whose daemon did not answer is tried again after this */
#define REPLY_TIMEOUT_S 60              /* a daemon this slow is taken for gone: the mount decides */

enum mount_state { M_UNKNOWN = 0, M_ON = 1, M_OFF = 2 };
enum probe { P_MOUNT = 0, P_LOCAL = 1, P_ASK = 2 };

struct gm_mount {
    char root[PATH_MAX];                /* the mountpoint, as this process sees it */
    size_t rootlen;
    dev_t dev;                          /* its device number (from mountinfo) */
    _Atomic int state;
    _Atomic long long retry_at;         /* when an M_OFF mount may be tried again (0: never) */
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char export_root[PATH_MAX];         /* the node's export directory, from the daemon */
    size_t exportlen;
    char staged_xattr[256];             /* set on staged replicas */
    char staging_mark[64];              /* in the names of staging copies being made */
    int mnt_id;                         /* the mount's id (mountinfo's first field, statx's stx_mnt_id) */
    unsigned slot;                      /* this node's slot: the high bits of the mount's inode numbers */
    dev_t export_dev;                   /* the export's own device: its files' numbers are file_ino(slot, 0, ino) */
    char owner_xattr[64];               /* the mark of a directory this node owns ... */
    char owner_token[64];               /* ... with this daemon's token ("": it owns none) */
    uid_t daemon_uid;                   /* the daemon's user and group: a create straight in the export */
    gid_t daemon_gid;                   /* makes the file the mount would have made only for them */
    _Atomic uint64_t unreported_in, unreported_out;  /* bytes moved through owned creates, not told yet */
    _Atomic long long reported_at;      /* when they were last told */
    _Atomic long long lease_until;      /* the hello's answer holds until then */
    pthread_mutex_t hello_lock;
};

struct connection {
    _Atomic int busy;
    int sock;                           /* the socket + 1; 0: not connected (zeroed memory is "none") */
    int mount;                          /* the mount this connection talks to */
};

struct mount_table {
    int count;
    struct gm_mount *mounts[MAX_MOUNTS];
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mount_table *_Atomic table;       /* replaced whole, never freed (small, rare) */
static _Atomic long long last_scan_ns;
static struct connection connections[MAX_CONNECTIONS];
/*
 * Export files the bypass opened, one slot per open file description (shared by its dup'ed
 * descriptors): the mount, whether it was opened for writing (each close is told to the daemon)
 * and the bytes moved through it, reported when its last descriptor closes, so the daemon's
 * byte counters (read_local, write_local) keep adding up to what jobs read and wrote.
 */
#define MAX_SLOTS 4096
struct slot {
    _Atomic int refs;            /* descriptors of this process using it; 0: free */
    int index;                   /* the mount */
    int writes;
    int created;                 /* made here in a directory the node owns: its close is told to nobody */
    int forked;                  /* opened before this process was forked: its parent tells of its close */
    _Atomic uint64_t in, out;    /* bytes read and written */
    dev_t dev;                   /* the file, to tell a descriptor number reused behind our back */
    ino_t ino;
};
static struct slot slots[MAX_SLOTS];
static _Atomic unsigned short fd_slot[MAX_TRACKED_FD];  /* 1 + slot, 0: not ours */
static _Atomic int fds_tracked;                           /* descriptors with a slot: exec and exit look if any */

static void set_slot(int fd, int slot) {
    int old = atomic_exchange(&fd_slot[fd], (unsigned short)slot);
    if (!old && slot)
        atomic_fetch_add(&fds_tracked, 1);
    else if (old && !slot)
        atomic_fetch_sub(&fds_tracked, 1);
}
static _Atomic int cwd_mount = -2;      /* -2: unknown, -1: cwd outside every mount, else its mount */

/* Counters for GMOUNT_BYPASS_STATS (tests and benchmarks check the bypass was used). */
static _Atomic long n_open_direct, n_open_mount, n_stat_direct, n_stat_mount, n_close_notes, n_create_direct;

/* ------------------------------------------------------------------ the real functions */

#define REAL(name) real_##name()
#define DEFINE_REAL(ret, name, ...)                                                        \
    static ret (*p_##name)(__VA_ARGS__);                                                  \
    static ret (*real_##name(void))(__VA_ARGS__) {                                        \
        if (p_##name == NULL)                                                             \
            p_##name = (ret (*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name);                     \
        return p_##name;                                                                  \
    }

DEFINE_REAL(int, openat, int, const char *, int, ...)
DEFINE_REAL(int, openat64, int, const char *, int, ...)
DEFINE_REAL(FILE *, fopen, const char *, const char *)
DEFINE_REAL(FILE *, fopen64, const char *, const char *)
DEFINE_REAL(int, fclose, FILE *)
DEFINE_REAL(int, close, int)
DEFINE_REAL(int, dup, int)
DEFINE_REAL(int, dup2, int, int)
DEFINE_REAL(int, dup3, int, int, int)
DEFINE_REAL(int, chdir, const char *)
DEFINE_REAL(int, fchdir, int)
DEFINE_REAL(int, stat, const char *, struct stat *)
DEFINE_REAL(int, lstat, const char *, struct stat *)
DEFINE_REAL(int, fstatat, int, const char *, struct stat *, int)
DEFINE_REAL(int, stat64, const char *, struct stat64 *)
DEFINE_REAL(int, lstat64, const char *, struct stat64 *)
DEFINE_REAL(int, fstatat64, int, const char *, struct stat64 *, int)
DEFINE_REAL(int, statx, int, const char *, int, unsigned int, struct statx *)

/* --------------------------------------------------------------------------- helpers */

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int sys_close(int fd) { return (int)syscall(SYS_close, fd); }

/*
 * GMOUNT_BYPASS=0 (or off, no, false): every call goes through the mount. Read at each call
 * that names a mount path, so a program may switch it off for itself (the node daemon does).
 */
static int is_disabled(void) {
    const char *value = getenv("GMOUNT_BYPASS");
    return value != NULL && (strcmp(value, "0") == 0 || strcasecmp(value, "off") == 0 ||
                             strcasecmp(value, "no") == 0 || strcasecmp(value, "false") == 0);
}

/* Undo the octal escapes of /proc/self/mountinfo (\040 for a space, ...). */
static void unescape(char *s) {
    char *out = s;
    for (char *in = s; *in;) {
        if (in[0] == '\\' && in[1] >= '0' && in[1] <= '7' && in[2] >= '0' && in[2] <= '7' && in[3] >= '0' &&
            in[3] <= '7') {
            *out++ = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
            in += 4;
        } else {
            *out++ = *in++;
        }
    }
    *out = '\0';
}

/* ------------------------------------------------------------------- the mount table */

/* The gmount mounts (fstype fuse.gmount) this process sees; known mounts keep their state. */
static void scan_mounts(void) {
    int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap + 1);
    if (text == NULL) {
        sys_close(fd);
        return;
    }
    for (;;) {
        if (len == cap) {
            char *bigger = realloc(text, 2 * cap + 1);
            if (bigger == NULL)
                break;
            text = bigger;
            cap *= 2;
        }
        ssize_t got = syscall(SYS_read, fd, text + len, cap - len);
        if (got <= 0)
            break;
        len += (size_t)got;
    }
    sys_close(fd);
    text[len] = '\0';

    struct mount_table *old = atomic_load(&table);
    struct mount_table *fresh = calloc(1, sizeof(*fresh));
    if (fresh == NULL) {
        free(text);
        return;
    }
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line != NULL && fresh->count < MAX_MOUNTS;
         line = strtok_r(NULL, "\n", &save)) {
        /* id parent major:minor root mountpoint options [optional...] - fstype source superoptions */
        char *sep = strstr(line, " - ");
        if (sep == NULL || strncmp(sep + 3, "fuse.gmount ", 12) != 0)
            continue;
        unsigned major = 0, minor = 0;
        int mnt_id = 0;
        char point[PATH_MAX];
        if (sscanf(line, "%d %*s %u:%u %*s %4095s", &mnt_id, &major, &minor, point) != 4)
            continue;
        unescape(point);
        dev_t dev = makedev(major, minor);
        struct gm_mount *found = NULL;
        for (int i = 0; old != NULL && i < old->count; i++) {
            if (old->mounts[i]->dev == dev && strcmp(old->mounts[i]->root, point) == 0)
                found = old->mounts[i];
        }
        if (found == NULL) {
            found = calloc(1, sizeof(*found));
            if (found == NULL)
                continue;
            snprintf(found->root, sizeof(found->root), "%s", point);
            found->rootlen = strlen(found->root);
            if (found->rootlen > 1 && found->root[found->rootlen - 1] == '/')
                found->root[--found->rootlen] = '\0';
            found->dev = dev;
            found->mnt_id = mnt_id;
            pthread_mutex_init(&found->hello_lock, NULL);
        }
        fresh->mounts[fresh->count++] = found;
    }
    free(text);
    atomic_store(&table, fresh);
    atomic_store(&last_scan_ns, now_ns());
}

static struct mount_table *mounts(void) {
    struct mount_table *current = atomic_load(&table);
    if (current == NULL) {
        pthread_mutex_lock(&table_lock);
        if (atomic_load(&table) == NULL)
            scan_mounts();
        pthread_mutex_unlock(&table_lock);
        current = atomic_load(&table);
    }
    return current;
}

/* Mounts made after this process started: looked for again, at most once a second. */
static void maybe_rescan(void) {
    if (now_ns() - atomic_load(&last_scan_ns) < MOUNT_RESCAN_NS)
        return;
    pthread_mutex_lock(&table_lock);
    if (now_ns() - atomic_load(&last_scan_ns) >= MOUNT_RESCAN_NS)
        scan_mounts();
    pthread_mutex_unlock(&table_lock);
}

/* The mount `path` (absolute, normalised) is in, and where the namespace path starts; -1 if none. */
static int mount_of(const char *path, const char **rest) {
    struct mount_table *t = mounts();
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; t != NULL && i < t->count; i++) {
            struct gm_mount *m = t->mounts[i];
            if (strncmp(path, m->root, m->rootlen) == 0 && (path[m->rootlen] == '/' || path[m->rootlen] == '\0')) {
                *rest = path + m->rootlen;
                return i;
            }
        }
        if (pass == 0) {
            maybe_rescan();
            struct mount_table *again = atomic_load(&table);
            if (again == t)
                break;
            t = again;
        }
    }
    return -1;
}

static struct gm_mount *mount_at(int index) {
    struct mount_table *t = atomic_load(&table);
    return t != NULL && index >= 0 && index < t->count ? t->mounts[index] : NULL;
}

/* -------------------------------------------------------------------- the daemon's word */

static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t len) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* One request, one reply, on `fd`. Returns the status (>= 0) or -1 if the connection broke. */
static int exchange(int fd, char op, const char *path, size_t pathlen, char *payload, size_t cap,
                    size_t *got) {
    char request[8 + PATH_MAX + 64];
    if (pathlen > PATH_MAX + 64)
        return -1;
    uint32_t length = (uint32_t)(4 + pathlen);
    memcpy(request, &length, 4);
    request[4] = op;
    request[5] = request[6] = request[7] = 0;
    memcpy(request + 8, path, pathlen);
    if (write_all(fd, request, 8 + pathlen) != 0)
        return -1;
    char reply[8];
    if (read_all(fd, reply, 8) != 0)
        return -1;
    uint32_t rlen;
    int32_t status;
    memcpy(&rlen, reply, 4);
    memcpy(&status, reply + 4, 4);
    if (rlen < 4 || rlen - 4 >= cap)
        return -1;
    if (read_all(fd, payload, rlen - 4) != 0)
        return -1;
    payload[rlen - 4] = '\0';
    if (got != NULL)
        *got = rlen - 4;
    return status < 0 ? 1 : status;
}

static int connect_to(const char *socket_path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_path);
    struct timeval timeout = {.tv_sec = REPLY_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    int rc;
    do {
        rc = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
    } while (rc < 0 && errno == EINTR);
    if (rc < 0) {
        sys_close(fd);
        return -1;
    }
    /* Only the daemon of this user (or root) may answer for a mount of ours. */
    struct ucred cred;
    socklen_t credlen = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &credlen) != 0 ||
        (cred.uid != geteuid() && cred.uid != 0)) {
        sys_close(fd);
        return -1;
    }
    return fd;
}

static void mount_off(struct gm_mount *m) {
    atomic_store(&m->retry_at, now_ns() + RETRY_NS);
    atomic_store(&m->state, M_OFF);
}

/* Parse the hello's payload: export root, staged xattr, staging mark, lease in ms, slot, export
 * device, owner xattr, owner token, the daemon's uid and gid. */
static int hello_fields(struct gm_mount *m, const char *payload, size_t len, long long *lease_ms) {
    const char *fields[10];
    size_t at = 0;
    for (int i = 0; i < 10; i++) {
        if (at >= len)
            return -1;
        fields[i] = payload + at;
        at += strlen(payload + at) + 1;
    }
    if (fields[0][0] != '/' || strlen(fields[0]) >= sizeof(m->export_root) ||
        strlen(fields[1]) >= sizeof(m->staged_xattr) || strlen(fields[2]) >= sizeof(m->staging_mark) ||
        fields[2][0] == '\0' || strlen(fields[6]) >= sizeof(m->owner_xattr) ||
        strlen(fields[7]) >= sizeof(m->owner_token))
        return -1;
    long long slot = atoll(fields[4]);
    if (slot < 1 || slot > 65535)
        return -1;
    strcpy(m->export_root, fields[0]);
    m->exportlen = strlen(m->export_root);
    strcpy(m->staged_xattr, fields[1]);
    strcpy(m->staging_mark, fields[2]);
    m->slot = (unsigned)slot;
    m->export_dev = (dev_t)strtoull(fields[5], NULL, 10);
    strcpy(m->owner_xattr, fields[6]);
    strcpy(m->owner_token, fields[7]);
    m->daemon_uid = (uid_t)strtoul(fields[8], NULL, 10);
    m->daemon_gid = (gid_t)strtoul(fields[9], NULL, 10);
    *lease_ms = atoll(fields[3]);
    return *lease_ms > 0 ? 0 : -1;
}

/* Whether `m`'s daemon serves the bypass now: its hello, repeated when its lease ends. */
static int mount_on(struct gm_mount *m) {
    long long now = now_ns();
    int state = atomic_load(&m->state);
    if (state == M_ON && now < atomic_load(&m->lease_until))
        return 1;
    if (state == M_OFF && (atomic_load(&m->retry_at) == 0 || now < atomic_load(&m->retry_at)))
        return 0;
    pthread_mutex_lock(&m->hello_lock);
    state = atomic_load(&m->state);
    now = now_ns();
    if ((state == M_ON && now >= atomic_load(&m->lease_until)) || state == M_UNKNOWN ||
        (state == M_OFF && atomic_load(&m->retry_at) != 0 && now >= atomic_load(&m->retry_at))) {
        char value[512];
        ssize_t n = syscall(SYS_getxattr, m->root, BYPASS_XATTR, value, sizeof(value) - 1);
        int ok = 0;
        if (n > (ssize_t)strlen(PROTOCOL)) {
            value[n] = '\0';
            const char *socket_path = value + strlen(PROTOCOL);
            if (strncmp(value, PROTOCOL, strlen(PROTOCOL)) == 0 && strlen(socket_path) < sizeof(m->socket_path)) {
                memcpy(m->socket_path, socket_path, strlen(socket_path) + 1);
                int fd = connect_to(m->socket_path);
                if (fd >= 0) {
                    char payload[PATH_MAX + 512];
                    size_t len = 0;
                    long long lease_ms = 0;
                    if (exchange(fd, 'H', "", 0, payload, sizeof(payload), &len) == 0 &&
                        hello_fields(m, payload, len, &lease_ms) == 0) {
                        atomic_store(&m->lease_until, now_ns() + lease_ms * 1000000LL);
                        ok = 1;
                    }
                    sys_close(fd);
                }
            }
        }
        if (ok)
            atomic_store(&m->state, M_ON);
        else if (n < 0 && errno == ENODATA)
            atomic_store(&m->state, M_OFF);  /* this daemon does not serve the bypass: never ask again */
        else
            mount_off(m);
    }
    state = atomic_load(&m->state);
    pthread_mutex_unlock(&m->hello_lock);
    return state == M_ON;
}

/* Send mount `index` a request of `len` bytes. 0: served here (`out`: the payload); 1: use the mount. */
static int ask_bytes(int index, char op, const char *request, size_t len, char *out, size_t cap) {
    struct gm_mount *m = mount_at(index);
    if (m == NULL || !mount_on(m))
        return 1;
    struct connection *c = NULL;
    for (int i = 0; i < MAX_CONNECTIONS; i++) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&connections[i].busy, &expected, 1)) {
            c = &connections[i];
            break;
        }
    }
    if (c == NULL)
        return 1;  /* every connection busy (many threads, or a signal handler): the mount serves this one */
    int status = 1;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (c->sock && c->mount != index) {
            sys_close(c->sock - 1);
            c->sock = 0;
        }
        if (!c->sock) {
            c->sock = connect_to(m->socket_path) + 1;
            c->mount = index;
            if (!c->sock) {
                mount_off(m);
                break;
            }
        }
        status = exchange(c->sock - 1, op, request, len, out, cap, NULL);
        if (status >= 0)
            break;
        sys_close(c->sock - 1);  /* a reused connection may have been closed by a restarted daemon: once more */
        c->sock = 0;
        status = 1;
    }
    atomic_store(&c->busy, 0);
    return status;
}

static int ask(int index, char op, const char *nspath, char *out, size_t cap) {
    return ask_bytes(index, op, nspath, strlen(nspath), out, cap);
}

static void after_fork_in_child(void) {
    /* The bytes counted so far are the parent's to report, and the parent (or the program a
     * child execs, told by INHERITED) tells of the closes; the child counts its own bytes. */
    for (int i = 0; i < MAX_SLOTS; i++) {
        atomic_store(&slots[i].in, 0);
        atomic_store(&slots[i].out, 0);
        slots[i].forked = 1;
    }
    struct mount_table *t = atomic_load(&table);
    for (int i = 0; t != NULL && i < t->count; i++) {
        atomic_store(&t->mounts[i]->unreported_in, 0);
        atomic_store(&t->mounts[i]->unreported_out, 0);
    }
    /* The parent's connections are shared with it: a request from here would mix with its replies. */
    for (int i = 0; i < MAX_CONNECTIONS; i++) {
        if (connections[i].sock)
            sys_close(connections[i].sock - 1);
        connections[i].sock = 0;
        atomic_store(&connections[i].busy, 0);
    }
}

/* ----------------------------------------------------------------------- path handling */

/*
 * The namespace path of (dirfd, path) if it lies in a gmount mount: normalised (no "//",
 * no "."). A relative path's leading ".." steps up the directory it is relative to, whose
 * path the kernel gave without symlinks (getcwd, /proc/self/fd); any other ".." gives up (it
 * may follow a symlink, which only the kernel can resolve). Montage's `cd proj && mBackground
 * ../corr/x.fits` is bypassed this way. Returns the mount index, or -1 when the call is not ours.
 */
static int resolve(int dirfd, const char *path, char *ns, size_t cap) {
    if (path == NULL || path[0] == '\0')
        return -1;
    size_t given = strlen(path);
    if (path[given - 1] == '/' || (path[given - 1] == '.' && (given == 1 || path[given - 2] == '/')))
        return -1;  /* "name/" or "name/.": the kernel's (a directory is meant, ENOTDIR for a file) */
    char full[PATH_MAX];
    size_t physical = 0;  /* how much of `full` the kernel gave: a ".." there is its parent */
    if (path[0] == '/') {
        if (strlen(path) >= sizeof(full))
            return -1;
        strcpy(full, path);
    } else {
        char base[PATH_MAX];
        if (dirfd == AT_FDCWD) {
            int known = atomic_load(&cwd_mount);
            if (known == -1)
                return -1;
            if (syscall(SYS_getcwd, base, sizeof(base)) < 0 || base[0] != '/')
                return -1;
            if (known == -2) {
                const char *rest;
                atomic_store(&cwd_mount, mount_of(base, &rest) >= 0 ? 0 : -1);
                if (atomic_load(&cwd_mount) == -1)
                    return -1;
            }
        } else {
            /* Only descriptors on a gmount mount are worth a readlink: their device tells. */
            struct statx sx;
            if (syscall(SYS_statx, dirfd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, 0, &sx) != 0)
                return -1;
            dev_t dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
            struct mount_table *t = mounts();
            int on_mount = 0;
            for (int i = 0; t != NULL && i < t->count; i++)
                on_mount |= t->mounts[i]->dev == dev;
            if (!on_mount)
                return -1;
            char link[64];
            snprintf(link, sizeof(link), "/proc/self/fd/%d", dirfd);
            ssize_t n = syscall(SYS_readlinkat, AT_FDCWD, link, base, sizeof(base) - 1);
            if (n <= 0)
                return -1;
            base[n] = '\0';
            if (base[0] != '/')
                return -1;
        }
        physical = strlen(base);
        if ((size_t)snprintf(full, sizeof(full), "%s/%s", base, path) >= sizeof(full))
            return -1;
    }
    /* normalise in place */
    char clean[PATH_MAX];
    size_t out = 0;
    size_t stepped_into = 0;  /* components of the caller's path kept so far */
    for (const char *p = full; *p;) {
        while (*p == '/')
            p++;
        if (!*p)
            break;
        const char *end = strchrnul(p, '/');
        size_t len = (size_t)(end - p);
        if (len == 1 && p[0] == '.') {
            p = end;
            continue;
        }
        if (len == 2 && p[0] == '.' && p[1] == '.') {
            if ((size_t)(p - full) < physical || stepped_into > 0 || out == 0)
                return -1;
            while (out > 0 && clean[out - 1] != '/')
                out--;
            out--;  /* the '/' before the component left */
            p = end;
            continue;
        }
        if (out + 1 + len >= sizeof(clean))
            return -1;
        clean[out++] = '/';
        memcpy(clean + out, p, len);
        out += len;
        if ((size_t)(p - full) >= physical)
            stepped_into++;
        p = end;
    }
    clean[out] = '\0';
    if (out == 0)
        return -1;
    const char *rest;
    int index = mount_of(clean, &rest);
    if (index < 0 || rest[0] == '\0')
        return -1;  /* not in a mount, or the mount's root itself */
    if (strlen(rest) >= cap)
        return -1;
    strcpy(ns, rest);
    return index;
}

/* --------------------------------------------------------------------------- opening */

static int accmode_writes(int flags) { return (flags & O_ACCMODE) != O_RDONLY; }

static int bypassable_flags(int flags) {
    return !(flags & (O_DIRECTORY | O_PATH)) && (flags & O_TMPFILE) != O_TMPFILE;
}

/* A descriptor the bypass opened on mount `index`'s export: its bytes are counted from here. */
static void track(int fd, int index, int writes, int created) {
    if (fd < 0 || fd >= MAX_TRACKED_FD)
        return;
    for (int i = 0; i < MAX_SLOTS; i++) {
        int free_slot = 0;
        if (atomic_compare_exchange_strong(&slots[i].refs, &free_slot, 1)) {
            struct slot *sl = &slots[i];
            sl->index = index;
            sl->writes = writes;
            sl->created = created;
            sl->forked = 0;
            atomic_store(&sl->in, 0);
            atomic_store(&sl->out, 0);
            struct stat st;
            if (syscall(SYS_fstat, fd, &st) != 0) {
                atomic_store(&sl->refs, 0);
                return;
            }
            sl->dev = st.st_dev;
            sl->ino = st.st_ino;
            set_slot(fd, i + 1);
            return;
        }
    }
    /* every slot taken: this descriptor is not counted (a written file's close still reaches the
       daemon through its inotify watch) */
}

static int export_path(const struct gm_mount *m, const char *ns, char *out, size_t cap) {
    size_t len = strlen(ns);
    if (m->exportlen + len >= cap)
        return -1;
    memcpy(out, m->export_root, m->exportlen);
    memcpy(out + m->exportlen, ns, len + 1);
    return 0;
}

/*
 * `ns` in the export of `m`, opened with the caller's flags (creating and truncating are the
 * mount's): no symlink is followed on the way, as the daemon follows none in its export.
 */
static int open_in_export(const char *path, int flags) {
    struct open_how how = {
        .flags = (uint64_t)(unsigned)((flags & ~(O_CREAT | O_EXCL | O_TRUNC)) | O_NOFOLLOW),
        .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    return (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof(how));
}

/*
 * The mount's identity of an export file, as every node shows it (gmountpy/node/inodes.py):
 * st_dev the mount's, st_ino `file_ino(slot, 0, ino)` = slot << 48 | ino. Only for files of the
 * export's own file system with ino < 2**47; the mount numbers others by a hash, and serves them.
 */
#define FILE_BITS 48
#define HASHED_INO (1ULL << 47)

static int representable(const struct gm_mount *m, dev_t dev, uint64_t ino) {
    return dev == m->export_dev && ino != 0 && ino < HASHED_INO;
}

static void to_mount_stat(const struct gm_mount *m, struct stat *st) {
    st->st_ino = (ino_t)(((uint64_t)m->slot << FILE_BITS) | (uint64_t)st->st_ino);
    st->st_dev = m->dev;
}

#ifndef STATX_MNT_ID
#define STATX_MNT_ID 0x00001000U
#endif
#ifndef STATX_MNT_ID_UNIQUE
#define STATX_MNT_ID_UNIQUE 0x00004000U
#endif

static int statx_representable(const struct gm_mount *m, const struct statx *sx) {
    return representable(m, makedev(sx->stx_dev_major, sx->stx_dev_minor), sx->stx_ino);
}

/* What a statx through the mount gives: its device, inode number and mount id, and the basic
 * fields only (the mount knows no birth time, no attributes of the export's file system). */
static void to_mount_statx(const struct gm_mount *m, struct statx *sx) {
    sx->stx_ino = ((uint64_t)m->slot << FILE_BITS) | sx->stx_ino;
    sx->stx_dev_major = major(m->dev);
    sx->stx_dev_minor = minor(m->dev);
    if (sx->stx_mask & STATX_MNT_ID)
        sx->stx_mnt_id = (uint64_t)m->mnt_id;
    sx->stx_mask &= STATX_BASIC_STATS | STATX_MNT_ID;
    sx->stx_attributes = 0;
    sx->stx_attributes_mask = 0;
    memset(&sx->stx_btime, 0, sizeof(sx->stx_btime));
}

/* P_LOCAL: the opened export file is this node's own (regular, unmarked); P_ASK: it carries a
 * mark (a replica, or a staging copy): the daemon decides; P_MOUNT: not a regular file. */
static int own_file(const struct gm_mount *m, const char *path, const char *ns, int fd, struct stat *st) {
    if (syscall(SYS_fstat, fd, st) != 0 || !S_ISREG(st->st_mode) || !representable(m, st->st_dev, st->st_ino))
        return P_MOUNT;  /* (a file the mount numbers by a hash: the mount serves it, with its number) */
    if (strstr(ns, m->staging_mark) != NULL)
        return P_ASK;
    int saved = errno;
    ssize_t n = syscall(SYS_lgetxattr, path, m->staged_xattr, NULL, 0);
    int unmarked = n < 0 && (errno == ENODATA || errno == ENOTSUP);
    errno = saved;
    return unmarked ? P_LOCAL : P_ASK;
}

/*
 * This node's own file for `ns` of mount `index`, opened with `flags` (O_PATH for a stat):
 * decided here while the daemon's hello holds, asked of the daemon for a marked file.
 * -1 when the mount must serve the call.
 */
static int open_own(int index, const char *ns, int flags, struct stat *st) {
    struct gm_mount *m = mount_at(index);
    char path[PATH_MAX];
    if (m == NULL || !mount_on(m) || export_path(m, ns, path, sizeof(path)) != 0)
        return -1;
    int saved = errno;
    int fd = open_in_export(path, flags);
    if (fd < 0) {
        errno = saved;
        return -1;  /* not here (or a symlink on the way, or no permission): the mount knows */
    }
    int kind = own_file(m, path, ns, fd, st);
    if (kind == P_LOCAL)
        return fd;
    sys_close(fd);
    char reply[PATH_MAX];
    if (kind == P_ASK && ask(index, 'R', ns, reply, sizeof(reply)) == 0 && strcmp(reply, path) == 0) {
        fd = open_in_export(path, flags);  /* the daemon checked the replica's source */
        if (fd >= 0 && syscall(SYS_fstat, fd, st) == 0 && S_ISREG(st->st_mode) &&
            representable(m, st->st_dev, st->st_ino))
            return fd;
        if (fd >= 0)
            sys_close(fd);
    }
    errno = saved;
    return -1;
}

/* Opening for writing: only with the daemon's yes (no replica; it watches the file's closes). */
static int open_for_writing(int index, const char *ns, int flags) {
    struct gm_mount *m = mount_at(index);
    char path[PATH_MAX], reply[PATH_MAX];
    struct stat st;
    if (m == NULL || !mount_on(m) || export_path(m, ns, path, sizeof(path)) != 0 ||
        ask(index, 'W', ns, reply, sizeof(reply)) != 0 || strcmp(reply, path) != 0)
        return -1;
    int saved = errno;
    int fd = open_in_export(path, flags);
    if (fd >= 0 && (syscall(SYS_fstat, fd, &st) != 0 || !S_ISREG(st.st_mode) ||
                    !representable(m, st.st_dev, st.st_ino))) {
        sys_close(fd);
        fd = -1;
    }
    errno = saved;
    return fd;
}

/*
 * A new file in a directory this node owns (gmountpy/node/index/owners.py), made straight in
 * the export: nobody else holds a lease in such a directory, and the first request of another
 * node about it waits for this create and lists the export before it is answered. The
 * directory is held with a shared flock while its mark (owner xattr: "TOKEN PATH") is checked
 * and the file made; the daemon takes the mark off, then an exclusive flock, to end the
 * ownership. Only for the daemon's own user and group (the mount makes files theirs). Returns
 * the descriptor; -1 with errno for a final answer (EEXIST under O_EXCL: the name is here, so it
 * exists); -2 when the mount must do it (not owned, the name exists, any other error).
 */
static int create_owned(int index, const char *ns, int flags, mode_t mode) {
    struct gm_mount *m = mount_at(index);
    if (m == NULL || !mount_on(m) || m->owner_token[0] == '\0')
        return -2;
    uid_t uid = geteuid();
    if (uid != m->daemon_uid || (uid != 0 && getegid() != m->daemon_gid))
        return -2;
    const char *slash = strrchr(ns, '/');
    size_t dirlen = (size_t)(slash - ns);  /* 0: the mount's root */
    const char *name = slash + 1;
    char dirpath[PATH_MAX], want[sizeof(m->owner_token) + PATH_MAX + 2], mark[sizeof(want)];
    if (name[0] == '\0' || m->exportlen + dirlen + 1 >= sizeof(dirpath))
        return -2;
    memcpy(dirpath, m->export_root, m->exportlen);
    memcpy(dirpath + m->exportlen, ns, dirlen);
    dirpath[m->exportlen + dirlen] = '\0';
    int wanted = snprintf(want, sizeof(want), "%s %.*s", m->owner_token, dirlen ? (int)dirlen : 1, dirlen ? ns : "/");
    if (wanted < 0 || (size_t)wanted >= sizeof(want))
        return -2;
    int saved = errno;
    struct open_how how = {.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
                           .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    int dfd = (int)syscall(SYS_openat2, AT_FDCWD, dirpath, &how, sizeof(how));
    if (dfd < 0) {
        errno = saved;
        return -2;
    }
    int result = -2, err = 0;
    struct stat st;
    if (syscall(SYS_fstat, dfd, &st) != 0 || st.st_dev != m->export_dev)
        goto out;  /* (a file system mounted inside the export: the mount numbers its files) */
    int locked;
    while ((locked = flock(dfd, LOCK_SH)) != 0 && errno == EINTR)
        ;
    if (locked != 0)
        goto out;
    ssize_t n = syscall(SYS_fgetxattr, dfd, m->owner_xattr, mark, sizeof(mark));
    if (n == wanted && memcmp(mark, want, (size_t)n) == 0) {
        int fd = (int)syscall(SYS_openat, dfd, name, (flags & ~O_TRUNC) | O_CREAT | O_EXCL | O_NOFOLLOW, mode);
        if (fd >= 0) {
            result = fd;
        } else if (errno == EEXIST && (flags & O_EXCL)) {
            result = -1;
            err = EEXIST;
        }
    }
    flock(dfd, LOCK_UN);
out:
    sys_close(dfd);
    errno = result == -1 ? err : saved;
    return result;
}

/* Whether the directory of `ns` still carries this daemon's owner mark (a created file's close
 * is then told to nobody: the first request of another node lists the export). */
static int still_owned(const struct gm_mount *m, const char *ns) {
    const char *slash = strrchr(ns, '/');
    size_t dirlen = slash != NULL ? (size_t)(slash - ns) : 0;
    char dirpath[PATH_MAX], want[sizeof(m->owner_token) + PATH_MAX + 2], mark[sizeof(want)];
    if (slash == NULL || m->owner_token[0] == '\0' || m->exportlen + dirlen + 1 >= sizeof(dirpath))
        return 0;
    memcpy(dirpath, m->export_root, m->exportlen);
    memcpy(dirpath + m->exportlen, ns, dirlen);
    dirpath[m->exportlen + dirlen] = '\0';
    int wanted = snprintf(want, sizeof(want), "%s %.*s", m->owner_token, dirlen ? (int)dirlen : 1, dirlen ? ns : "/");
    int saved = errno;
    ssize_t n = syscall(SYS_lgetxattr, dirpath, m->owner_xattr, mark, sizeof(mark));
    errno = saved;
    return wanted > 0 && n == wanted && memcmp(mark, want, (size_t)n) == 0;
}

/*
 * open/openat of a path in a gmount mount. `real` makes the call through the mount when the
 * bypass does not apply. Returns the descriptor, or -1 with errno as the real call set it.
 */
static int bypass_open(int dirfd, const char *path, int flags, mode_t mode,
                       int (*real)(int, const char *, int, mode_t)) {
    char ns[PATH_MAX];
    int index;
    if (!bypassable_flags(flags) || (index = resolve(dirfd, path, ns, sizeof(ns))) < 0 || is_disabled())
        return real(dirfd, path, flags, mode);
    int writes = accmode_writes(flags);
    int through_mount = -1;
    if (flags & O_CREAT) {
        int made = create_owned(index, ns, flags, mode);
        if (made == -1)
            return -1;
        if (made >= 0) {
            track(made, index, writes, 1);
            atomic_fetch_add(&n_create_direct, 1);
            return made;
        }
    }
    if (flags & (O_CREAT | O_TRUNC)) {
        /* Creates and truncations go through the mount: the namespace hears of them as always. */
        through_mount = real(dirfd, path, flags, mode);
        if (through_mount < 0)
            return through_mount;
    }
    struct stat st;
    int fd = writes ? open_for_writing(index, ns, flags) : open_own(index, ns, flags, &st);
    if (fd < 0) {
        atomic_fetch_add(&n_open_mount, 1);
        return through_mount >= 0 ? through_mount : real(dirfd, path, flags, mode);
    }
    if (through_mount >= 0) {
        /* the export file takes the descriptor number the program was given */
        int saved = errno;
        int swapped = (int)syscall(SYS_dup3, fd, through_mount, flags & O_CLOEXEC);
        sys_close(fd);
        errno = saved;
        if (swapped < 0) {
            atomic_fetch_add(&n_open_mount, 1);
            return through_mount;
        }
        fd = through_mount;
    }
    track(fd, index, writes, 0);
    atomic_fetch_add(&n_open_direct, 1);
    return fd;
}

static int call_open(int dirfd, const char *path, int flags, mode_t mode) {
    return REAL(openat)(dirfd, path, flags, mode);
}

static int call_open64(int dirfd, const char *path, int flags, mode_t mode) {
    return REAL(openat64)(dirfd, path, flags, mode);
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

GM_EXPORT int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return bypass_open(AT_FDCWD, path, flags, mode, call_open);
}

GM_EXPORT int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return bypass_open(AT_FDCWD, path, flags, mode, call_open64);
}

GM_EXPORT int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return bypass_open(dirfd, path, flags, mode, call_open);
}

GM_EXPORT int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return bypass_open(dirfd, path, flags, mode, call_open64);
}

/* _FORTIFY_SOURCE's checked variants (no mode: O_CREAT is not allowed there). */
GM_EXPORT int __open_2(const char *path, int flags) { return bypass_open(AT_FDCWD, path, flags, 0, call_open); }
GM_EXPORT int __open64_2(const char *path, int flags) {
    return bypass_open(AT_FDCWD, path, flags, 0, call_open64);
}
GM_EXPORT int __openat_2(int dirfd, const char *path, int flags) {
    return bypass_open(dirfd, path, flags, 0, call_open);
}
GM_EXPORT int __openat64_2(int dirfd, const char *path, int flags) {
    return bypass_open(dirfd, path, flags, 0, call_open64);
}

GM_EXPORT int creat(const char *path, mode_t mode) {
    return bypass_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, call_open);
}

GM_EXPORT int creat64(const char *path, mode_t mode) {
    return bypass_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, call_open64);
}

/* fopen's mode as open(2) flags; -1 for a mode fopen itself would refuse. */
static int fopen_flags(const char *mode) {
    int flags;
    switch (mode[0]) {
    case 'r': flags = O_RDONLY; break;
    case 'w': flags = O_WRONLY | O_CREAT | O_TRUNC; break;
    case 'a': flags = O_WRONLY | O_CREAT | O_APPEND; break;
    default: return -1;
    }
    for (const char *p = mode + 1; *p && *p != ','; p++) {
        if (*p == '+')
            flags = (flags & ~O_ACCMODE) | O_RDWR;
        else if (*p == 'e')
            flags |= O_CLOEXEC;
        else if (*p == 'x')
            flags |= O_EXCL;
    }
    return flags;
}

static FILE *bypass_fopen(const char *path, const char *mode, FILE *(*real)(const char *, const char *)) {
    char ns[PATH_MAX];
    int flags;
    if (path == NULL || mode == NULL || (flags = fopen_flags(mode)) < 0 ||
        resolve(AT_FDCWD, path, ns, sizeof(ns)) < 0 || is_disabled())
        return real(path, mode);
    int fd = bypass_open(AT_FDCWD, path, flags, 0666, call_open);
    if (fd < 0)
        return NULL;
    /* fdopen takes the same letters, minus those only fopen understands */
    char fmode[4] = {mode[0], 0, 0, 0};
    if (strchr(mode, '+') != NULL)
        fmode[1] = '+';
    FILE *stream = fdopen(fd, fmode);
    if (stream == NULL) {
        int saved = errno;
        close(fd);
        errno = saved;
    }
    return stream;
}

GM_EXPORT FILE *fopen(const char *path, const char *mode) { return bypass_fopen(path, mode, REAL(fopen)); }
GM_EXPORT FILE *fopen64(const char *path, const char *mode) { return bypass_fopen(path, mode, REAL(fopen64)); }

/* ------------------------------------------------------------------------ counting bytes */

#define IN 0
#define OUT 1
static void count(int direction, int fd, ssize_t n) {
    if (n <= 0 || fd < 0 || fd >= MAX_TRACKED_FD)
        return;
    int slot = atomic_load_explicit(&fd_slot[fd], memory_order_relaxed);
    if (slot)
        atomic_fetch_add_explicit(direction == IN ? &slots[slot - 1].in : &slots[slot - 1].out, (uint64_t)n,
                                  memory_order_relaxed);
}

DEFINE_REAL(ssize_t, read, int, void *, size_t)
DEFINE_REAL(ssize_t, pread, int, void *, size_t, off_t)
DEFINE_REAL(ssize_t, pread64, int, void *, size_t, off64_t)
DEFINE_REAL(ssize_t, readv, int, const struct iovec *, int)
DEFINE_REAL(ssize_t, preadv, int, const struct iovec *, int, off_t)
DEFINE_REAL(ssize_t, preadv64, int, const struct iovec *, int, off64_t)
DEFINE_REAL(ssize_t, write, int, const void *, size_t)
DEFINE_REAL(ssize_t, pwrite, int, const void *, size_t, off_t)
DEFINE_REAL(ssize_t, pwrite64, int, const void *, size_t, off64_t)
DEFINE_REAL(ssize_t, writev, int, const struct iovec *, int)
DEFINE_REAL(ssize_t, pwritev, int, const struct iovec *, int, off_t)
DEFINE_REAL(ssize_t, pwritev64, int, const struct iovec *, int, off64_t)
DEFINE_REAL(ssize_t, copy_file_range, int, off64_t *, int, off64_t *, size_t, unsigned int)
DEFINE_REAL(ssize_t, sendfile, int, int, off_t *, size_t)
DEFINE_REAL(ssize_t, sendfile64, int, int, off64_t *, size_t)

GM_EXPORT ssize_t read(int fd, void *buf, size_t n) {
    ssize_t got = REAL(read)(fd, buf, n);
    count(IN, fd, got);
    return got;
}
GM_EXPORT ssize_t pread(int fd, void *buf, size_t n, off_t at) {
    ssize_t got = REAL(pread)(fd, buf, n, at);
    count(IN, fd, got);
    return got;
}
GM_EXPORT ssize_t pread64(int fd, void *buf, size_t n, off64_t at) {
    ssize_t got = REAL(pread64)(fd, buf, n, at);
    count(IN, fd, got);
    return got;
}
GM_EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt) {
    ssize_t got = REAL(readv)(fd, iov, cnt);
    count(IN, fd, got);
    return got;
}
GM_EXPORT ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t at) {
    ssize_t got = REAL(preadv)(fd, iov, cnt, at);
    count(IN, fd, got);
    return got;
}
GM_EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off64_t at) {
    ssize_t got = REAL(preadv64)(fd, iov, cnt, at);
    count(IN, fd, got);
    return got;
}
GM_EXPORT ssize_t write(int fd, const void *buf, size_t n) {
    ssize_t done = REAL(write)(fd, buf, n);
    count(OUT, fd, done);
    return done;
}
GM_EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t at) {
    ssize_t done = REAL(pwrite)(fd, buf, n, at);
    count(OUT, fd, done);
    return done;
}
GM_EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t at) {
    ssize_t done = REAL(pwrite64)(fd, buf, n, at);
    count(OUT, fd, done);
    return done;
}
GM_EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    ssize_t done = REAL(writev)(fd, iov, cnt);
    count(OUT, fd, done);
    return done;
}
GM_EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t at) {
    ssize_t done = REAL(pwritev)(fd, iov, cnt, at);
    count(OUT, fd, done);
    return done;
}
GM_EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off64_t at) {
    ssize_t done = REAL(pwritev64)(fd, iov, cnt, at);
    count(OUT, fd, done);
    return done;
}
GM_EXPORT ssize_t copy_file_range(int in, off64_t *in_at, int out, off64_t *out_at, size_t n, unsigned int flags) {
    ssize_t done = REAL(copy_file_range)(in, in_at, out, out_at, n, flags);
    count(IN, in, done);
    count(OUT, out, done);
    return done;
}
GM_EXPORT ssize_t sendfile(int out, int in, off_t *at, size_t n) {
    ssize_t done = REAL(sendfile)(out, in, at, n);
    count(IN, in, done);
    count(OUT, out, done);
    return done;
}
GM_EXPORT ssize_t sendfile64(int out, int in, off64_t *at, size_t n) {
    ssize_t done = REAL(sendfile64)(out, in, at, n);
    count(IN, in, done);
    count(OUT, out, done);
    return done;
}

DEFINE_REAL(size_t, fread, void *, size_t, size_t, FILE *)
DEFINE_REAL(size_t, fwrite, const void *, size_t, size_t, FILE *)

/* stdio moves its bulk data inside libc, where read() and write() cannot be seen: counted here. */
static void count_stream(int direction, FILE *stream, size_t items, size_t size) {
    if (items > 0 && stream != NULL && atomic_load_explicit(&fds_tracked, memory_order_relaxed))
        count(direction, fileno(stream), (ssize_t)(items * size));
}

GM_EXPORT size_t fread(void *buf, size_t size, size_t n, FILE *stream) {
    size_t got = REAL(fread)(buf, size, n, stream);
    count_stream(IN, stream, got, size);
    return got;
}
GM_EXPORT size_t fwrite(const void *buf, size_t size, size_t n, FILE *stream) {
    size_t done = REAL(fwrite)(buf, size, n, stream);
    count_stream(OUT, stream, done, size);
    return done;
}

/* ----------------------------------------------------------------------------- closing */

struct closing {
    int index;                   /* the mount, -1: not a descriptor of ours */
    int writes;                  /* written and closed here: the daemon announces the file's attributes */
    int created;                 /* made straight in the export, in a directory this node owned then */
    char ns[PATH_MAX];           /* where the written file is now, in the namespace ("" if unlinked) */
    uint64_t in, out;            /* bytes read and written through it */
};

/*
 * Just before a descriptor is closed: what to tell its daemon. The written file's name is
 * where it is now (it follows renames). The bytes are those this process image moved through
 * the calls it made (a forked child and its parent each count their own; the file position
 * would count a description shared with another process twice).
 */
static void closing(int fd, struct closing *c) {
    c->index = -1;
    c->created = 0;
    c->ns[0] = '\0';
    c->in = c->out = 0;
    if (fd < 0 || fd >= MAX_TRACKED_FD)
        return;
    int slot = atomic_load(&fd_slot[fd]);
    if (slot == 0)
        return;
    set_slot(fd, 0);
    struct slot *sl = &slots[slot - 1];
    struct stat st;
    if (syscall(SYS_fstat, fd, &st) != 0 || st.st_dev != sl->dev || st.st_ino != sl->ino) {
        atomic_fetch_sub(&sl->refs, 1);  /* closed behind our back (close_range, a raw syscall) and reused */
        return;
    }
    c->index = sl->index;
    c->writes = sl->writes && !sl->forked;
    c->created = sl->created && !sl->forked;
    if (atomic_load(&sl->refs) == 1) {  /* its last descriptor here: the bytes this image moved through it */
        c->in = atomic_load(&sl->in);
        c->out = atomic_load(&sl->out);
    }
    atomic_fetch_sub(&sl->refs, 1);
    struct gm_mount *m = mount_at(c->index);
    if (!c->writes || m == NULL || !mount_on(m))
        return;
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = m != NULL ? syscall(SYS_readlinkat, AT_FDCWD, link, target, sizeof(target) - 1) : -1;
    if (n <= 0)
        return;
    target[n] = '\0';
    size_t len = (size_t)n;
    if (len > 10 && strcmp(target + len - 10, " (deleted)") == 0)
        return;  /* unlinked while open: no name to tell about (it must not come back) */
    if (strncmp(target, m->export_root, m->exportlen) == 0 && target[m->exportlen] == '/' &&
        strlen(target + m->exportlen) < sizeof(c->ns))
        strcpy(c->ns, target + m->exportlen);
}

/* The bytes moved through files this process created in owned directories, told with one `D` at
 * most every second (and at exit): their closes cost no round trip. */
static void report_bytes(int index, int now) {
    struct gm_mount *m = mount_at(index);
    if (m == NULL || (!now && now_ns() - atomic_load(&m->reported_at) < 1000000000LL))
        return;
    atomic_store(&m->reported_at, now_ns());
    uint64_t in = atomic_exchange(&m->unreported_in, 0), out = atomic_exchange(&m->unreported_out, 0);
    if (in == 0 && out == 0)
        return;
    char request[64], reply[16];
    request[0] = '\0';
    int extra = snprintf(request + 1, sizeof(request) - 1, "%llu %llu", (unsigned long long)in,
                         (unsigned long long)out);
    int saved = errno;
    ask_bytes(index, 'D', request, 1 + (size_t)extra, reply, sizeof(reply));
    errno = saved;
}

/* The descriptor was closed: a written file's attributes reach its directory's home (`C`) before
 * close() returns; the bytes moved are added to the node's counters (`C`, or `D` for the rest).
 * A file made in a directory this node still owns needs no `C`: nobody else holds a lease there,
 * and the first request of another node about the directory lists the export after this close. */
static void closed(const struct closing *c) {
    if (c->index < 0 || (!c->writes && c->in == 0 && c->out == 0))
        return;
    struct gm_mount *m = mount_at(c->index);
    if (c->created && m != NULL && (!c->writes || (c->ns[0] && still_owned(m, c->ns)))) {
        atomic_fetch_add(&m->unreported_in, c->in);
        atomic_fetch_add(&m->unreported_out, c->out);
        report_bytes(c->index, 0);
        return;
    }
    char request[PATH_MAX + 64], reply[16];
    size_t len = strlen(c->ns);
    memcpy(request, c->ns, len);
    request[len] = '\0';
    int extra = snprintf(request + len + 1, sizeof(request) - len - 1, "%llu %llu", (unsigned long long)c->in,
                         (unsigned long long)c->out);
    int saved = errno;
    ask_bytes(c->index, c->writes ? 'C' : 'D', request, len + 1 + (size_t)extra, reply, sizeof(reply));
    errno = saved;
    if (c->writes)
        atomic_fetch_add(&n_close_notes, 1);
}

GM_EXPORT int close(int fd) {
    struct closing c;
    closing(fd, &c);
    int rc = REAL(close)(fd);
    closed(&c);
    return rc;
}

GM_EXPORT int fclose(FILE *stream) {
    struct closing c;
    c.index = -1;
    if (stream != NULL) {
        int fd = fileno(stream);
        if (fd >= 0 && fd < MAX_TRACKED_FD && atomic_load(&fd_slot[fd])) {
            fflush(stream);  /* what is buffered is written now, so the position counts it */
            closing(fd, &c);
        }
    }
    int rc = REAL(fclose)(stream);
    closed(&c);
    return rc;
}

/* A copy of a descriptor of ours shares its slot (one open file description). */
static void copy_tracking(int from, int to) {
    if (from < 0 || from >= MAX_TRACKED_FD || to < 0 || to >= MAX_TRACKED_FD)
        return;
    int slot = atomic_load(&fd_slot[from]);
    if (slot) {
        atomic_fetch_add(&slots[slot - 1].refs, 1);
        set_slot(to, slot);
    }
}

GM_EXPORT int dup(int fd) {
    int copy = REAL(dup)(fd);
    copy_tracking(fd, copy);
    return copy;
}

static int dup_over(int oldfd, int newfd, int flags, int three) {
    struct closing c;
    c.index = -1;
    if (oldfd != newfd)
        closing(newfd, &c);
    int rc = three ? REAL(dup3)(oldfd, newfd, flags) : REAL(dup2)(oldfd, newfd);
    int saved = errno;
    if (rc >= 0)
        copy_tracking(oldfd, rc);
    closed(&c);
    errno = saved;
    return rc;
}

GM_EXPORT int dup2(int oldfd, int newfd) { return dup_over(oldfd, newfd, 0, 0); }

DEFINE_REAL(int, close_range, unsigned int, unsigned int, int)
DEFINE_REAL(void, closefrom, int)

/* Closing many at once: they are forgotten (a written file's close reaches the daemon by inotify). */
static void forget_range(unsigned int first, unsigned int last) {
    for (unsigned int fd = first; fd <= last && fd < MAX_TRACKED_FD && atomic_load(&fds_tracked); fd++) {
        int slot = atomic_load(&fd_slot[fd]);
        if (slot) {
            set_slot((int)fd, 0);
            atomic_fetch_sub(&slots[slot - 1].refs, 1);
        }
    }
}

GM_EXPORT int close_range(unsigned int first, unsigned int last, int flags) {
    int rc = REAL(close_range)(first, last, flags);
    if (rc == 0 && !(flags & CLOSE_RANGE_CLOEXEC))
        forget_range(first, last);
    return rc;
}

GM_EXPORT void closefrom(int lowfd) {
    REAL(closefrom)(lowfd);
    if (lowfd >= 0)
        forget_range((unsigned int)lowfd, MAX_TRACKED_FD - 1);
}
GM_EXPORT int dup3(int oldfd, int newfd, int flags) { return dup_over(oldfd, newfd, flags, 1); }

/* ----------------------------------------------------------- the working directory */

GM_EXPORT int chdir(const char *path) {
    int rc = REAL(chdir)(path);
    atomic_store(&cwd_mount, -2);
    return rc;
}

GM_EXPORT int fchdir(int fd) {
    int rc = REAL(fchdir)(fd);
    atomic_store(&cwd_mount, -2);
    return rc;
}

/* -------------------------------------------------------------------------- stat family */

/*
 * An O_PATH descriptor of this node's own file for a stat of (dirfd, path), and its mount in
 * `*index`; -1: the mount answers. The stat is the export file's with the mount's identity
 * (`to_mount_stat`): st_dev and st_ino are what a stat through the mount gives, on any node.
 */
static int stat_own(int dirfd, const char *path, int at_flags, int *index) {
    char ns[PATH_MAX];
    struct stat st;
    if ((at_flags & AT_EMPTY_PATH) || (*index = resolve(dirfd, path, ns, sizeof(ns))) < 0 || is_disabled())
        return -1;
    int fd = open_own(*index, ns, O_PATH | O_CLOEXEC, &st);
    atomic_fetch_add(fd >= 0 ? &n_stat_direct : &n_stat_mount, 1);
    return fd;
}

static int fstat_own(int fd, int index, struct stat *buf) {
    int rc = (int)syscall(SYS_fstat, fd, buf);
    int saved = errno;
    sys_close(fd);
    struct gm_mount *m = mount_at(index);
    if (rc == 0 && m != NULL)
        to_mount_stat(m, buf);
    errno = saved;
    return rc;
}

/* The mount of a descriptor the bypass opened (its slot still names this file); NULL otherwise. */
static struct gm_mount *mount_of_fd(int fd, dev_t dev, uint64_t ino) {
    if (fd < 0 || fd >= MAX_TRACKED_FD || !atomic_load_explicit(&fds_tracked, memory_order_relaxed))
        return NULL;
    int slot = atomic_load(&fd_slot[fd]);
    if (slot == 0 || slots[slot - 1].dev != dev || slots[slot - 1].ino != (ino_t)ino)
        return NULL;
    struct gm_mount *m = mount_at(slots[slot - 1].index);
    return m != NULL && representable(m, dev, ino) ? m : NULL;
}

/* fstat of a descriptor the bypass opened: the mount's identity, as for a stat by path. */
static int fstat_identity(int fd, struct stat *buf, int rc) {
    struct gm_mount *m;
    if (rc == 0 && (m = mount_of_fd(fd, buf->st_dev, buf->st_ino)) != NULL)
        to_mount_stat(m, buf);
    return rc;
}

GM_EXPORT int stat(const char *path, struct stat *buf) {
    int index, fd = stat_own(AT_FDCWD, path, 0, &index);
    return fd >= 0 ? fstat_own(fd, index, buf) : REAL(stat)(path, buf);
}

GM_EXPORT int lstat(const char *path, struct stat *buf) {
    int index, fd = stat_own(AT_FDCWD, path, 0, &index);
    return fd >= 0 ? fstat_own(fd, index, buf) : REAL(lstat)(path, buf);
}

static int empty_path(const char *path, int flags) { return (flags & AT_EMPTY_PATH) && path != NULL && !path[0]; }

GM_EXPORT int fstatat(int dirfd, const char *path, struct stat *buf, int flags) {
    int index, fd = stat_own(dirfd, path, flags, &index);
    if (fd >= 0)
        return fstat_own(fd, index, buf);
    int rc = REAL(fstatat)(dirfd, path, buf, flags);
    return empty_path(path, flags) ? fstat_identity(dirfd, buf, rc) : rc;
}

GM_EXPORT int stat64(const char *path, struct stat64 *buf) {
    int index, fd = stat_own(AT_FDCWD, path, 0, &index);
    return fd >= 0 ? fstat_own(fd, index, (struct stat *)buf) : REAL(stat64)(path, buf);
}

GM_EXPORT int lstat64(const char *path, struct stat64 *buf) {
    int index, fd = stat_own(AT_FDCWD, path, 0, &index);
    return fd >= 0 ? fstat_own(fd, index, (struct stat *)buf) : REAL(lstat64)(path, buf);
}

GM_EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *buf, int flags) {
    int index, fd = stat_own(dirfd, path, flags, &index);
    if (fd >= 0)
        return fstat_own(fd, index, (struct stat *)buf);
    int rc = REAL(fstatat64)(dirfd, path, buf, flags);
    return empty_path(path, flags) ? fstat_identity(dirfd, (struct stat *)buf, rc) : rc;
}

GM_EXPORT int fstat(int fd, struct stat *buf) {
    return fstat_identity(fd, buf, (int)syscall(SYS_fstat, fd, buf));
}

GM_EXPORT int fstat64(int fd, struct stat64 *buf) {
    return fstat_identity(fd, (struct stat *)buf, (int)syscall(SYS_fstat, fd, buf));
}

/* glibc before 2.33 compiled stat() into these; binaries built then still call them. */
GM_EXPORT int __xstat(int ver, const char *path, struct stat *buf) { (void)ver; return stat(path, buf); }
GM_EXPORT int __lxstat(int ver, const char *path, struct stat *buf) { (void)ver; return lstat(path, buf); }
GM_EXPORT int __fxstat(int ver, int fd, struct stat *buf) { (void)ver; return fstat(fd, buf); }
GM_EXPORT int __fxstatat(int ver, int dirfd, const char *path, struct stat *buf, int flags) {
    (void)ver;
    return fstatat(dirfd, path, buf, flags);
}
GM_EXPORT int __xstat64(int ver, const char *path, struct stat64 *buf) { (void)ver; return stat64(path, buf); }
GM_EXPORT int __lxstat64(int ver, const char *path, struct stat64 *buf) { (void)ver; return lstat64(path, buf); }
GM_EXPORT int __fxstat64(int ver, int fd, struct stat64 *buf) { (void)ver; return fstat64(fd, buf); }
GM_EXPORT int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *buf, int flags) {
    (void)ver;
    return fstatat64(dirfd, path, buf, flags);
}

GM_EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    int index = -1, fd = (mask & STATX_MNT_ID_UNIQUE) ? -1 : stat_own(dirfd, path, flags, &index);
    if (fd < 0) {
        int rc = REAL(statx)(dirfd, path, flags, mask, buf);
        struct gm_mount *m;
        if (rc == 0 && empty_path(path, flags) &&
            (m = mount_of_fd(dirfd, makedev(buf->stx_dev_major, buf->stx_dev_minor), buf->stx_ino)) != NULL &&
            !(buf->stx_mask & STATX_MNT_ID_UNIQUE))
            to_mount_statx(m, buf);
        return rc;
    }
    int rc = (int)syscall(SYS_statx, fd, "", AT_EMPTY_PATH | (flags & AT_STATX_SYNC_TYPE), mask, buf);
    int saved = errno;
    sys_close(fd);
    struct gm_mount *m = mount_at(index);
    if (rc == 0 && m != NULL && statx_representable(m, buf))
        to_mount_statx(m, buf);
    errno = saved;
    return rc;
}

/* ------------------------------------------------------------------------- life cycle */

/* ----------------------------------------------------------------- exec and exit */

/*
 * Written files handed to a program across exec (`cmd > out`: the shell opens out, the program
 * writes it): the new image is told which of its descriptors are export files of which mount
 * (INHERITED="fd@mountpoint ..."), so it tells the daemon when it closes them -- or when it
 * exits, which is when such a program usually lets go of them. The daemon's inotify watch
 * covers what cannot be seen here (_exit, a static binary, posix_spawn).
 */
#define INHERITED "GMOUNT_BYPASS_INHERITED"
#define MAX_ENV_ADD 2048

DEFINE_REAL(int, execve, const char *, char *const[], char *const[])
DEFINE_REAL(int, execvpe, const char *, char *const[], char *const[])

extern char **environ;

/* `envp` with INHERITED describing the written descriptors that survive exec; no malloc (vfork). */
static char *const *exec_environment(char *const envp[], char **out, size_t cap, char *value, size_t value_cap) {
    int present = 0;
    for (size_t i = 0; envp != NULL && envp[i] != NULL && !present; i++)
        present = strncmp(envp[i], INHERITED "=", strlen(INHERITED) + 1) == 0;
    if (atomic_load(&fds_tracked) == 0 && !present)
        return envp;  /* the usual case: nothing to hand on */
    size_t len = (size_t)snprintf(value, value_cap, "%s=", INHERITED);
    int any = 0;
    struct mount_table *t = atomic_load(&table);
    for (int fd = 0; fd < MAX_TRACKED_FD && t != NULL && atomic_load(&fds_tracked); fd++) {
        int slot = atomic_load_explicit(&fd_slot[fd], memory_order_relaxed);
        if (!slot || !slots[slot - 1].writes || slots[slot - 1].index >= t->count)
            continue;
        int flags = (int)syscall(SYS_fcntl, fd, F_GETFD);
        if (flags < 0 || (flags & FD_CLOEXEC))
            continue;
        int n = snprintf(value + len, value_cap - len, "%s%d@%s", any ? " " : "", fd,
                         t->mounts[slots[slot - 1].index]->root);
        if (n < 0 || (size_t)n >= value_cap - len)
            break;
        len += (size_t)n;
        any = 1;
    }
    size_t count = 0;
    for (size_t i = 0; envp != NULL && envp[i] != NULL; i++) {
        if (strncmp(envp[i], INHERITED "=", strlen(INHERITED) + 1) == 0)
            continue;
        if (count + 2 >= cap)
            return envp;  /* an environment this large keeps its own (the inotify watch still covers) */
        out[count++] = envp[i];
    }
    if (any)
        out[count++] = value;
    out[count] = NULL;
    return out;
}

GM_EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
    char *env[MAX_ENV_ADD], value[4096];
    return REAL(execve)(path, argv, exec_environment(envp, env, MAX_ENV_ADD, value, sizeof(value)));
}

GM_EXPORT int execv(const char *path, char *const argv[]) { return execve(path, argv, environ); }

GM_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
    char *env[MAX_ENV_ADD], value[4096];
    return REAL(execvpe)(file, argv, exec_environment(envp, env, MAX_ENV_ADD, value, sizeof(value)));
}

GM_EXPORT int execvp(const char *file, char *const argv[]) { return execvpe(file, argv, environ); }

/* The written descriptors this image inherited (INHERITED): tracked as if opened here. */
static void adopt_inherited(void) {
    const char *value = getenv(INHERITED);
    if (value == NULL)
        return;
    char copy[4096];
    snprintf(copy, sizeof(copy), "%s", value);
    unsetenv(INHERITED);  /* what this image hands on is its own to say */
    char *save = NULL;
    for (char *item = strtok_r(copy, " ", &save); item != NULL; item = strtok_r(NULL, " ", &save)) {
        char *at = strchr(item, '@');
        if (at == NULL)
            continue;
        *at = '\0';
        int fd = atoi(item);
        const char *rest;
        int index = mount_of(at + 1, &rest);
        struct stat st;
        if (index >= 0 && syscall(SYS_fstat, fd, &st) == 0 && S_ISREG(st.st_mode))
            track(fd, index, 1, 0);
    }
}

__attribute__((constructor)) static void preload_init(void) {
    pthread_atfork(NULL, NULL, after_fork_in_child);
    adopt_inherited();
}

/* At exit: the descriptors of ours still open are closed by the kernel; tell their daemons now. */
static void exiting(void) {
    if (atomic_load(&fds_tracked) != 0) {
        fflush(NULL);  /* stdio buffers reach the files first (libc would flush them only after this) */
        for (int fd = 0; fd < MAX_TRACKED_FD && atomic_load(&fds_tracked); fd++) {
            if (atomic_load_explicit(&fd_slot[fd], memory_order_relaxed) == 0)
                continue;
            struct closing c;
            closing(fd, &c);
            closed(&c);
        }
    }
    struct mount_table *t = atomic_load(&table);
    for (int i = 0; t != NULL && i < t->count; i++)
        if (atomic_load(&t->mounts[i]->unreported_in) || atomic_load(&t->mounts[i]->unreported_out))
            report_bytes(i, 1);
}

/* GMOUNT_BYPASS_STATS=FILE: one line of counters per process, appended at exit. */
__attribute__((destructor)) static void preload_fini(void) {
    exiting();
    const char *file = getenv("GMOUNT_BYPASS_STATS");
    if (file == NULL || file[0] == '\0')
        return;
    long opens = atomic_load(&n_open_direct) + atomic_load(&n_open_mount) + atomic_load(&n_stat_direct) +
                 atomic_load(&n_stat_mount) + atomic_load(&n_create_direct);
    if (opens == 0)
        return;
    char line[256];
    int len = snprintf(line, sizeof(line),
                       "pid=%d open_direct=%ld open_mount=%ld stat_direct=%ld stat_mount=%ld close_notes=%ld "
                       "create_direct=%ld\n",
                       (int)getpid(), atomic_load(&n_open_direct), atomic_load(&n_open_mount),
                       atomic_load(&n_stat_direct), atomic_load(&n_stat_mount), atomic_load(&n_close_notes),
                       atomic_load(&n_create_direct));
    int fd = (int)syscall(SYS_openat, AT_FDCWD, file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
        if (syscall(SYS_write, fd, line, (size_t)len) < 0) {
            /* nothing to do: the counters are a diagnostic */
        }
        sys_close(fd);
    }
}
