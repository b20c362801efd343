/* gmount-job: make's SHELL under gmount.mk -- run one recipe on the node that holds its prerequisites.
 *
 * make runs `gmount-job -c RECIPE` (or with its .SHELLFLAGS) for every recipe line (one per recipe
 * with .ONESHELL), with GMOUNT_TARGET=$@ and GMOUNT_DEPS=$^ in the environment. This program costs
 * what a small C program costs: the decision comes from the node daemon whose mount make runs in,
 * over its job socket (gmountpy/cluster/jobsocket.py: where it is, and the protocol; the daemon's
 * side is gmountpy/node/jobs.py), which already knows who holds what.
 *
 * - No target (a $(shell ...)) or no arguments: exec the recipe shell right here.
 * - A node on this machine: run the recipe shell in the same directory of that node's mount, in a
 *   process group of its own, with GMOUNT_NODE, GMOUNT_SITE and GMOUNT_CLUSTER set. INT, TERM, HUP
 *   and QUIT are forwarded to the whole group, and what is left of it after one of them is
 *   terminated (SIGTERM, SIGKILL 2 s later): a shell starts `cmd &` with SIGINT ignored.
 * - A node on another machine (SSH cluster), or no job socket (a daemon without one): exec the
 *   Python gmount-sh ($GMOUNT_SH_FALLBACK, else gmount-sh on PATH), which reaches SSH nodes; told
 *   the node already chosen (GMOUNT_PLACED_NODE) when there is one.
 * - Not in a gmount mount at all: the recipe runs here, with a notice.
 * - stdout, stderr and stdin are the recipe's own; the exit status is the recipe's (killed by a
 *   signal: this process dies of the same signal, as make expects of a shell).
 * - A recipe that fails says so on stderr, naming its node and exit status, on the line before
 *   make's own error (`gmount: target T failed on node n3: its recipe exited with status 7`).
 * - One JSON line per recipe goes to $GMOUNT_PLACEMENT_LOG, in the format of the Python gmount-sh,
 *   with "via": "daemon".
 * - A node DAG-aware staging planned for the target ($GMOUNT_PLACEMENT_LOG.plan, written by
 *   gmountpy.jobs.prestage) is sent along; the daemon takes it when the rule counts it a candidate.
 * - `gmount-job --gmount-check` (gmount.mk, once per run of make): prints "place <time>-<make's pid>"
 *   when the working directory is in a gmount mount whose daemon answers on its job socket (the
 *   stamp names the run's placement log), else "local <why>", so
 *   that make runs recipes as plain make does, with one notice (the Python gmount-sh decides for a
 *   daemon without a job socket).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>

#include "gmount_registry.h"

extern char **environ;

#define MAGIC "gmount-jobs/1"
#define MAX_REPLY (16 << 20)
#define STOP_GRACE_NS 2000000000LL

static const char *program = "gmount-job";

static void say(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fprintf(stderr, "%s: ", program);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
}

/* ------------------------------------------------------------------ growing buffers */

typedef struct {
    char *data;
    size_t len, cap;
} buffer;

static void put(buffer *b, const void *data, size_t len) {
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + len + 1)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            say("out of memory");
            exit(2);
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
}

static void puts_(buffer *b, const char *s) { put(b, s, strlen(s)); }

static void putf(buffer *b, const char *format, ...) {
    char small[128];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(small, sizeof small, format, args);
    va_end(args);
    if (n > 0)
        put(b, small, (size_t)n < sizeof small ? (size_t)n : sizeof small - 1);
}

static int read_all(int fd, buffer *b, size_t limit) {
    char chunk[65536];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n == 0)
            return 0;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (b->len + (size_t)n > limit) {
            errno = EFBIG;
            return -1;
        }
        put(b, chunk, (size_t)n);
    }
}

/* ------------------------------------------------------------------ .ONESHELL prefixes */

/* Drop @, - and + (and blanks) at the start of every logical line but the first, as make does for
 * POSIX shells only -- which this program is not by name (gmountpy_make.shell.strip_oneshell_prefixes). */
static char *strip_oneshell_prefixes(const char *script) {
    if (!strchr(script, '\n'))
        return (char *)script;
    size_t n = strlen(script), i = 0, o = 0;
    char *out = malloc(n + 1);
    if (!out)
        return (char *)script;
    int first = 1;
    while (i < n) {
        if (!first)
            while (i < n && strchr(" \t-@+", script[i]))
                i++;
        first = 0;
        int escaped = 0;
        while (i < n) {
            char ch = script[i++];
            out[o++] = ch;
            if (ch == '\\') {
                escaped = !escaped;
                continue;
            }
            if (ch == '\n' && !escaped)
                break;
            escaped = 0;
        }
    }
    out[o] = '\0';
    return out;
}

/* ------------------------------------------------------------------ finding the mount and its socket */

static void unescape_mountinfo(char *s) {
    char *o = s;
    for (char *p = s; *p; p++) {
        if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' && p[3] >= '0' && p[3] <= '7') {
            *o++ = (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0'));
            p += 3;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
}

static int inside(const char *path, const char *mount) {
    size_t n = strlen(mount);
    if (n == 1 && mount[0] == '/')
        return 1;
    return strncmp(path, mount, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* The mountpoint of the mount `path` is in, if that mount is a gmount one (fstype fuse.gmount). */
static int find_gmount(const char *path, buffer *found) {
    int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    buffer text = {0};
    int failed = read_all(fd, &text, 64 << 20);
    close(fd);
    if (failed || !text.data)
        return 0;
    size_t best = 0;
    int best_is_gmount = 0;
    for (char *line = text.data, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        /* id parent major:minor root MOUNTPOINT options [optional...] - FSTYPE source options */
        char *fields[5] = {0};
        char *cursor = line;
        for (int i = 0; i < 5 && cursor; i++) {
            fields[i] = cursor;
            cursor = strchr(cursor, ' ');
            if (cursor)
                *cursor++ = '\0';
        }
        char *separator = cursor ? strstr(cursor, " - ") : NULL;
        if (!fields[4] || !separator)
            continue;
        char *fstype = separator + 3;
        char *end = strchr(fstype, ' ');
        if (end)
            *end = '\0';
        unescape_mountinfo(fields[4]);
        size_t len = strlen(fields[4]);
        if (inside(path, fields[4]) && len >= best) {
            best = len;
            best_is_gmount = strcmp(fstype, "fuse.gmount") == 0;
            found->len = 0;
            puts_(found, fields[4]);
        }
    }
    free(text.data);
    return best_is_gmount;
}

static uint64_t fnv1a64(const char *s) {
    uint64_t value = 0xcbf29ce484222325ULL;
    for (; *s; s++)
        value = (value ^ (unsigned char)*s) * 0x100000001b3ULL;
    return value;
}

/* The daemon's file `jobs-<hash>.<suffix>` for the mount at `mount`, if its directory is this user's
 * alone (never send a recipe through, or believe, anything else); 0 with errno set if not. */
static int daemon_file(const char *mount, const char *suffix, char *out, size_t size) {
    char directory[64];
    snprintf(directory, sizeof directory, "/tmp/gmountpy-%u", (unsigned)geteuid());
    struct stat info;
    if (lstat(directory, &info) < 0)
        return 0;
    if (!S_ISDIR(info.st_mode) || info.st_uid != geteuid() || (info.st_mode & 077)) {
        errno = EPERM;
        return 0;
    }
    snprintf(out, size, "%s/jobs-%016llx.%s", directory, (unsigned long long)fnv1a64(mount), suffix);
    return 1;
}

/* Connected to the job socket of the daemon mounted at `mount`, or -1 (errno set). */
static int connect_daemon(const char *mount) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (!daemon_file(mount, "sock", address.sun_path, sizeof address.sun_path))
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&address, sizeof address) < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    struct ucred peer;
    socklen_t size = sizeof peer;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &size) < 0 || peer.uid != geteuid()) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}

static int send_all(int fd, const char *data, size_t len) {
    while (len) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

/* ------------------------------------------------------------------ the daemon's reply */

typedef struct {
    const char *node, *site, *cluster, *make_node, *cwd, *dir, *remote, *inputs, *bytes_local, *bytes_remote;
} placement;

static const char *value_of(const char *field, const char *key) {
    size_t n = strlen(key);
    return strncmp(field, key, n) == 0 && field[n] == '=' ? field + n + 1 : NULL;
}

/* 0 with `out` filled from an "ok" reply; 1 with `error` pointing at the daemon's message; -1 if malformed. */
static int parse_reply(buffer *reply, placement *out, const char **error) {
    if (!reply->len || reply->data[reply->len - 1] != '\0')
        return -1;
    const char *end = reply->data + reply->len;
    const char *field = reply->data;
    if (strcmp(field, "error") == 0) {
        field += strlen(field) + 1;
        *error = field < end ? field : "the node daemon refused the request";
        return 1;
    }
    if (strcmp(field, "ok") != 0)
        return -1;
    memset(out, 0, sizeof *out);
    for (field += 3; field < end; field += strlen(field) + 1) {
        const char *v;
        if ((v = value_of(field, "node"))) out->node = v;
        else if ((v = value_of(field, "site"))) out->site = v;
        else if ((v = value_of(field, "cluster"))) out->cluster = v;
        else if ((v = value_of(field, "make_node"))) out->make_node = v;
        else if ((v = value_of(field, "cwd"))) out->cwd = v;
        else if ((v = value_of(field, "dir"))) out->dir = v;
        else if ((v = value_of(field, "remote"))) out->remote = v;
        else if ((v = value_of(field, "inputs"))) out->inputs = v;
        else if ((v = value_of(field, "bytes_local"))) out->bytes_local = v;
        else if ((v = value_of(field, "bytes_remote"))) out->bytes_remote = v;
    }
    if (!out->node || !out->site || !out->cluster || !out->make_node || !out->cwd || !out->dir || !out->remote ||
        !out->inputs || !out->bytes_local || !out->bytes_remote)
        return -1;
    return 0;
}

/* A recipe without prerequisites stays on make's node: its answer is the card the daemon keeps beside
 * its socket (node, site, cluster, mountpoint), no question asked. 0 if there is no card. */
static int own_node(const char *mount, const char *cwd, buffer *card, buffer *paths, placement *out) {
    char path[128];
    if (!daemon_file(mount, "node", path, sizeof path))
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int failed = read_all(fd, card, 65536);
    close(fd);
    const char *fields[4];
    size_t n = 0;
    for (size_t at = 0; !failed && n < 4 && at < card->len; at += strlen(card->data + at) + 1)
        fields[n++] = card->data + at;
    if (failed || n != 4 || card->data[card->len - 1] != '\0')
        return 0;
    const char *below = cwd + strlen(mount);  /* cwd is inside the mount: "" or "/..." */
    put(paths, *below ? below : "/", strlen(*below ? below : "/") + 1);
    size_t cwd_at = 0, dir_at = paths->len;
    puts_(paths, fields[3]);
    if (*below)
        puts_(paths, below);
    memset(out, 0, sizeof *out);
    out->node = out->make_node = fields[0];
    out->site = fields[1];
    out->cluster = fields[2];
    out->cwd = paths->data + cwd_at;
    out->dir = paths->data + dir_at;
    out->remote = "0";
    out->inputs = out->bytes_local = out->bytes_remote = "0";
    return 1;
}

/* ------------------------------------------------------------------ the prestager's plan */

/* The node DAG-aware staging (gmountpy.jobs.prestage) planned for `target`: a line "target<TAB>node" of
 * $GMOUNT_PLACEMENT_LOG.plan (gmountpy.jobs.planned), copied into `out`; NULL when there is no plan for it. */
static const char *planned_node(const char *target, buffer *out) {
    const char *log = getenv("GMOUNT_PLACEMENT_LOG");
    if (!log || !*log)
        return NULL;
    buffer path = {0}, plan = {0};
    puts_(&path, log);
    puts_(&path, ".plan");
    int fd = open(path.data, O_RDONLY | O_CLOEXEC);
    free(path.data);
    if (fd < 0)
        return NULL;
    int failed = read_all(fd, &plan, MAX_REPLY);
    close(fd);
    const char *found = NULL;
    size_t target_len = strlen(target);
    for (char *line = plan.data; !failed && line && *line;) {
        char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char *tab = memrchr(line, '\t', len);
        if (tab && (size_t)(tab - line) == target_len && memcmp(line, target, target_len) == 0 && tab + 1 < line + len) {
            put(out, tab + 1, (size_t)(line + len - tab - 1));
            found = out->data;
            break;
        }
        line = end ? end + 1 : NULL;
    }
    free(plan.data);
    return found;
}

/* ------------------------------------------------------------------ the placement log */

/* A JSON string exactly as Python's json.dumps writes it (ensure_ascii) for the string Python would
 * read from these bytes (UTF-8 with surrogateescape: an undecodable byte B is the code point 0xDC00+B). */
static void json_string(buffer *b, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    put(b, "\"", 1);
    while (*s) {
        unsigned char c = *s;
        uint32_t code;
        size_t len = 1;
        if (c < 0x80) {
            code = c;
        } else {
            uint32_t min;
            if (c >= 0xc2 && c <= 0xdf) len = 2, code = c & 0x1f, min = 0x80;
            else if (c >= 0xe0 && c <= 0xef) len = 3, code = c & 0x0f, min = 0x800;
            else if (c >= 0xf0 && c <= 0xf4) len = 4, code = c & 0x07, min = 0x10000;
            else len = 0, min = 0;
            for (size_t k = 1; k < len; k++) {
                if ((s[k] & 0xc0) != 0x80) {
                    len = 0;
                    break;
                }
                code = (code << 6) | (s[k] & 0x3f);
            }
            if (len && (code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)))
                len = 0;
            if (!len) {  /* undecodable: this byte alone, as surrogateescape does */
                code = 0xdc00 + c;
                len = 1;
            }
        }
        s += len;
        switch (code) {
        case '"': puts_(b, "\\\""); continue;
        case '\\': puts_(b, "\\\\"); continue;
        case '\n': puts_(b, "\\n"); continue;
        case '\r': puts_(b, "\\r"); continue;
        case '\t': puts_(b, "\\t"); continue;
        case '\b': puts_(b, "\\b"); continue;
        case '\f': puts_(b, "\\f"); continue;
        }
        if (code >= 0x20 && code < 0x7f) {
            char ch = (char)code;
            put(b, &ch, 1);
        } else if (code < 0x10000) {
            putf(b, "\\u%04x", code);
        } else {
            code -= 0x10000;
            putf(b, "\\u%04x\\u%04x", 0xd800 | (code >> 10), 0xdc00 | (code & 0x3ff));
        }
    }
    put(b, "\"", 1);
}

static void json_key(buffer *b, const char *key, int first) {
    if (!first)
        puts_(b, ", ");
    json_string(b, key);
    puts_(b, ": ");
}

static void make_parents(const char *path) {
    char *copy = strdup(path);
    if (!copy)
        return;
    for (char *p = copy + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        mkdir(copy, 0777);
        *p = '/';
    }
    free(copy);
}

static void write_log(const char *target, const placement *where, double seconds, int status) {
    const char *path = getenv("GMOUNT_PLACEMENT_LOG");
    if (!path || !*path)
        return;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    buffer line = {0};
    puts_(&line, "{");
    json_key(&line, "target", 1), json_string(&line, target);
    json_key(&line, "node", 0), json_string(&line, where->node);
    json_key(&line, "make_node", 0), json_string(&line, where->make_node);
    json_key(&line, "cluster", 0), json_string(&line, where->cluster);
    json_key(&line, "cwd", 0), json_string(&line, where->cwd);
    json_key(&line, "inputs", 0), putf(&line, "%lld", atoll(where->inputs));
    json_key(&line, "bytes_local", 0), putf(&line, "%lld", atoll(where->bytes_local));
    json_key(&line, "bytes_remote", 0), putf(&line, "%lld", atoll(where->bytes_remote));
    json_key(&line, "seconds", 0), putf(&line, "%.6f", seconds);
    json_key(&line, "status", 0), putf(&line, "%d", status);
    json_key(&line, "time", 0), putf(&line, "%lld.%06ld", (long long)now.tv_sec, now.tv_nsec / 1000);
    json_key(&line, "via", 0), json_string(&line, "daemon");
    puts_(&line, "}\n");
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ENOENT) {  /* the first line of a run: make its directory */
        make_parents(path);
        fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    }
    /* one write: lines from recipes running in parallel stay whole */
    if (fd < 0 || write(fd, line.data, line.len) != (ssize_t)line.len)
        say("cannot write the placement log %s: %s (set GMOUNT_PLACEMENT_LOG to a writable file)", path,
            strerror(errno));
    if (fd >= 0)
        close(fd);
    free(line.data);
}

/* ------------------------------------------------------------------ running the recipe */

static const int FORWARDED[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
#define N_FORWARDED (sizeof FORWARDED / sizeof FORWARDED[0])
static volatile sig_atomic_t child_group = 0;
static volatile sig_atomic_t received = 0;
static int not_run = 0;  /* the recipe could not be started or waited for: said already */

static void forward(int sig) {
    received = sig;
    if (child_group > 0)
        kill(-child_group, sig);
}

static long long monotonic_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* After an interrupt, end what the recipe left in its process group: SIGTERM, then SIGKILL. */
static void stop_group(pid_t group) {
    long long deadline = monotonic_ns() + STOP_GRACE_NS;
    const int signals[] = {SIGTERM, SIGKILL};
    for (int i = 0; i < 2; i++) {
        if (kill(-group, signals[i]) < 0 && errno == ESRCH)
            return;
        while (monotonic_ns() < deadline) {
            if (kill(-group, 0) < 0 && errno == ESRCH)
                return;
            struct timespec pause = {0, 20000000};
            nanosleep(&pause, NULL);
        }
    }
}

static int private_variable(const char *entry) {
    static const char *names[] = {"GMOUNT_TARGET=", "GMOUNT_DEPS=", "GMOUNT_NODE=", "GMOUNT_SITE=",
                                  "GMOUNT_CLUSTER=", "PWD=", "GMOUNT_PLACED_NODE="};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strncmp(entry, names[i], strlen(names[i])) == 0)
            return 1;
    return 0;
}

/* GMOUNT_BYPASS set to 0, off, no or false (any case) where make runs: recipes keep to the mount. */
static int bypass_off(void) {
    const char *value = getenv("GMOUNT_BYPASS");
    static const char *off[] = {"0", "off", "no", "false"};
    if (!value)
        return 0;
    while (*value == ' ' || *value == '\t')
        value++;
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
        if (strncasecmp(value, off[i], strlen(off[i])) == 0 && value[strlen(off[i])] == '\0')
            return 1;
    return 0;
}

/* LD_PRELOAD for a recipe run on this machine: the bypass library first, then what was preloaded
 * already (as gmountpy.jobs.bypass.preload_value); NULL when off or not built. */
static char *preload_entry(void) {
    const char *lib = getenv("GMOUNT_PRELOAD");
    if (!lib || !*lib || bypass_off() || access(lib, R_OK) != 0)
        return NULL;
    const char *current = getenv("LD_PRELOAD");
    if (!current)
        current = "";
    char *entry = malloc(strlen("LD_PRELOAD=") + strlen(lib) + 1 + strlen(current) + 1);
    if (!entry)
        return NULL;
    strcpy(entry, "LD_PRELOAD=");
    strcat(entry, lib);
    for (const char *p = current; *p;) {  /* the entries already there, without the library twice */
        size_t skip = strspn(p, " :"), len;
        p += skip;
        len = strcspn(p, " :");
        if (len && !(len == strlen(lib) && strncmp(p, lib, len) == 0)) {
            strcat(entry, " ");
            strncat(entry, p, len);
        }
        p += len;
    }
    return entry;
}

static char *joined(const char *name, const char *value) {
    char *s = malloc(strlen(name) + strlen(value) + 2);
    if (!s) {
        say("out of memory");
        exit(2);
    }
    sprintf(s, "%s=%s", name, value);
    return s;
}

/* Run `args` in where->dir as a child in its own process group; its status as the shell reports it
 * (negative: the signal that killed it). */
static int run_here(char **args, const char *target, const placement *where) {
    size_t count = 0;
    while (environ[count])
        count++;
    char **env = malloc((count + 6) * sizeof *env);
    if (!env) {
        say("out of memory");
        exit(2);
    }
    char *preload = preload_entry();
    size_t n = 0;
    for (size_t i = 0; i < count; i++)
        if (!private_variable(environ[i]) && !(preload && strncmp(environ[i], "LD_PRELOAD=", 11) == 0))
            env[n++] = environ[i];
    if (preload)
        env[n++] = preload;
    env[n++] = joined("GMOUNT_NODE", where->node);
    env[n++] = joined("GMOUNT_SITE", where->site);
    env[n++] = joined("GMOUNT_CLUSTER", where->cluster);
    env[n++] = joined("PWD", where->dir);
    env[n] = NULL;

    /* Caught signals are blocked until the child's group is known, so none is lost in between; the
     * child gets them back at their default action (ignored ones stay ignored, as make left them). */
    sigset_t caught, saved;
    sigemptyset(&caught);
    struct sigaction action = {.sa_handler = forward};
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < N_FORWARDED; i++) {
        struct sigaction current;
        if (sigaction(FORWARDED[i], NULL, &current) == 0 && current.sa_handler != SIG_IGN) {
            sigaddset(&caught, FORWARDED[i]);
            sigaction(FORWARDED[i], &action, NULL);
        }
    }
    sigprocmask(SIG_BLOCK, &caught, &saved);
    posix_spawnattr_t attributes;
    posix_spawn_file_actions_t actions;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    posix_spawnattr_setpgroup(&attributes, 0);
    posix_spawnattr_setsigdefault(&attributes, &caught);
    posix_spawnattr_setsigmask(&attributes, &saved);
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addchdir_np(&actions, where->dir);
    pid_t child;
    int failed = posix_spawn(&child, args[0], &actions, &attributes, args, env);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    if (failed) {
        sigprocmask(SIG_SETMASK, &saved, NULL);
        say("cannot run the recipe of %s on node %s in %s: %s", target, where->node, where->dir, strerror(failed));
        not_run = 1;
        return 127;
    }
    child_group = child;
    gmount_register_job(where->cluster, where->node, target, child, "make", where->cwd);  /* for `gmount top` */
    sigprocmask(SIG_SETMASK, &saved, NULL);  /* one that came meanwhile is forwarded now */
    int status = 0;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR) {
            say("lost the recipe of %s on node %s: %s", target, where->node, strerror(errno));
            not_run = 1;
            return 127;
        }
    }
    if (received)
        stop_group(child);
    return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

/* ------------------------------------------------------------------ main */

static int finish(char **args, const char *target, const placement *where);

static const char *fallback_program(void) {
    const char *fallback = getenv("GMOUNT_SH_FALLBACK");
    return fallback && *fallback ? fallback : "gmount-sh";
}

static void exec_fallback(char **original, const char *why) {
    const char *fallback = fallback_program();
    original[0] = (char *)fallback;
    execvp(fallback, original);
    say("%s, and the Python gmount-sh (%s) cannot run: %s", why, fallback, strerror(errno));
    exit(127);
}

/* `--gmount-check`: one line on stdout, "place <stamp>" if recipes run from the working directory are
 * placed, else "local <why>" (gmount.mk then leaves make's SHELL alone and says why, once). */
static int check(char **original) {
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) {
        printf("local the working directory cannot be read (%s)\n", strerror(errno));
        return 0;
    }
    buffer mount = {0};
    if (!find_gmount(cwd, &mount)) {
        printf("local %s is not inside a gmount mount\n", cwd);
        return 0;
    }
    int fd = connect_daemon(mount.data);
    if (fd >= 0) {  /* with the run's stamp for the placement log's name: time and make's pid */
        close(fd);
        char stamp[32];
        time_t now = time(NULL);
        strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%S", localtime(&now));
        printf("place %s-%ld\n", stamp, (long)getppid());
        return 0;
    }
    /* A daemon without a job socket: the Python wrapper can still place, if it knows the cluster. */
    const char *fallback = fallback_program();
    original[0] = (char *)fallback;
    execvp(fallback, original);
    printf("local the node daemon mounted at %s has no job socket, and the Python gmount-sh (%s) cannot run (%s)\n",
           mount.data, fallback, strerror(errno));
    return 0;
}

int main(int argc, char **argv) {
    const char *shell = getenv("GMOUNT_RECIPE_SHELL");
    if (!shell || !*shell)
        shell = "/bin/sh";
    const char *target = getenv("GMOUNT_TARGET");
    char **args = malloc((size_t)(argc + 1) * sizeof *args);
    char **original = malloc((size_t)(argc + 1) * sizeof *original);
    if (!args || !original) {
        say("out of memory");
        return 2;
    }
    for (int i = 0; i <= argc; i++)
        original[i] = argv[i];
    if (argc == 2 && strcmp(argv[1], "--gmount-check") == 0)
        return check(original);
    args[0] = (char *)shell;
    for (int i = 1; i <= argc; i++)
        args[i] = argv[i];
    if (!target || !*target || argc < 2) {  /* a $(shell ...): runs here, as plain make would */
        execv(shell, args);
        say("cannot run %s: %s", shell, strerror(errno));
        return 127;
    }
    args[argc - 1] = strip_oneshell_prefixes(args[argc - 1]);

    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        exec_fallback(original, "no working directory");
    buffer mount = {0};
    if (!find_gmount(cwd, &mount)) {  /* gmount.mk's check makes this rare: SHELL set by hand */
        fprintf(stderr, "gmount: %s is not inside a gmount mount: the recipe of %s runs here\n", cwd, target);
        execv(shell, args);
        say("cannot run %s: %s", shell, strerror(errno));
        return 127;
    }
    const char *deps = getenv("GMOUNT_DEPS");
    placement where;
    buffer card = {0}, paths = {0};
    if ((!deps || !deps[strspn(deps, " \t\n")]) && own_node(mount.data, cwd, &card, &paths, &where))
        return finish(args, target, &where);
    int fd = connect_daemon(mount.data);
    if (fd < 0)
        exec_fallback(original, "no job socket");

    buffer request = {0}, plan = {0};
    const char *planned = planned_node(target, &plan);
    put(&request, MAGIC, sizeof MAGIC);
    if (planned)  /* taken by the daemon if the placement rule counts it a candidate */
        put(&request, "place-planned", sizeof "place-planned");
    else
        put(&request, "place", sizeof "place");
    put(&request, cwd, strlen(cwd) + 1);
    put(&request, "", 1);  /* no pinned node */
    if (planned)
        put(&request, planned, strlen(planned) + 1);
    for (const char *p = deps ? deps : ""; *p;) {
        size_t skip = strspn(p, " \t\n"), len;
        p += skip;
        len = strcspn(p, " \t\n");
        if (len) {
            put(&request, p, len);
            put(&request, "", 1);
        }
        p += len;
    }
    buffer reply = {0};
    if (send_all(fd, request.data, request.len) < 0 || shutdown(fd, SHUT_WR) < 0 || read_all(fd, &reply, MAX_REPLY)) {
        say("cannot place target %s: the job socket of the node daemon mounted at %s failed: %s", target, mount.data,
            strerror(errno));
        return 2;
    }
    close(fd);
    const char *error = NULL;
    int parsed = parse_reply(&reply, &where, &error);
    if (parsed == 1) {
        say("cannot place target %s: %s", target, error);
        return 2;
    }
    if (parsed < 0) {
        say("cannot place target %s: malformed reply from the node daemon mounted at %s", target, mount.data);
        return 2;
    }
    if (strcmp(where.remote, "1") == 0) {  /* another machine: the SSH path of the Python wrapper */
        setenv("GMOUNT_PLACED_NODE", where.node, 1);
        exec_fallback(original, "a node on another machine");
    }
    return finish(args, target, &where);
}

/* Run the recipe where `where` says, log it, and end as it ended; a failure names its node. */
static int finish(char **args, const char *target, const placement *where) {
    long long started = monotonic_ns();
    int status = run_here(args, target, where);
    write_log(target, where, (double)(monotonic_ns() - started) / 1e9, status);
    if (status > 0 && !not_run)
        fprintf(stderr, "gmount: target %s failed on node %s: its recipe exited with status %d\n", target,
                where->node, status);
    else if (status < 0 && !received)  /* an interrupt (make's, forwarded) is make's to report */
        fprintf(stderr, "gmount: target %s failed on node %s: its recipe was killed by signal %d (%s)\n", target,
                where->node, -status, strsignal(-status));
    if (status < 0) {  /* killed by a signal: die the same way, so make reports it as it would for /bin/sh */
        int sig = -status;
        signal(sig, SIG_DFL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        sigprocmask(SIG_UNBLOCK, &one, NULL);
        kill(getpid(), sig);
        return 128 + sig;
    }
    return status;
}
