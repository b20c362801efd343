/* gmount_registry.h -- register a job that runs on a node, for `gmount top`, from C.
 *
 * The same registration gmountpy/cluster/registry.py writes (read it for the why): one small file
 *
 *     $XDG_STATE_HOME (else ~/.local/state) /gmountpy/jobs/<cluster>/<pid>-<process start>.json
 *
 * naming the node the job runs on, the job (a make target), who started it, its directory in the
 * namespace, when, this machine, and the pid of a process of this machine that lives exactly as
 * long as the job. Nothing to unregister: readers drop the files of ended processes, and about one
 * registration in GMOUNT_REGISTRY_PRUNE_EVERY does too. A registration that cannot be written is
 * skipped: a job never fails for want of one.
 *
 *     #include "gmount_registry.h"
 *     gmount_register_job(cluster, node, target, child_pid, "make", namespace_directory);
 *
 * Self-contained (standard C and POSIX only), every function static: include it in one program.
 */
#ifndef GMOUNT_REGISTRY_H
#define GMOUNT_REGISTRY_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define GMOUNT_REGISTRY_PRUNE_EVERY 64
#define GMOUNT_REGISTRY_RECORD_MAX 16384

/* When process `pid` started (clock ticks since boot, field 22 of /proc/<pid>/stat); 0 if it does not
 * run or is a zombie. */
static unsigned long long gmount_registry_start_ticks(long pid) {
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return 0;
    text[n] = '\0';
    char *p = strrchr(text, ')');  /* after the command name, which may hold anything */
    if (!p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X')
        return 0;
    p += 2;
    for (int field = 3; field < 22; field++) {  /* p is at field 3 (state): step to field 22 */
        p = strchr(p, ' ');
        if (!p)
            return 0;
        p++;
    }
    return strtoull(p, NULL, 10);
}

/* `text` as a JSON string into out[*at..limit), as Python's json.dumps escapes the characters that need it
 * (bytes from 0x80 up are copied: UTF-8 stays UTF-8). 0 if it did not fit. */
static int gmount_registry_json_string(char *out, size_t *at, size_t limit, const char *text) {
    static const char hex[] = "0123456789abcdef";
    size_t i = *at;
    if (i + 1 >= limit)
        return 0;
    out[i++] = '"';
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (i + 7 >= limit)
            return 0;
        if (*c == '"' || *c == '\\') {
            out[i++] = '\\';
            out[i++] = (char)*c;
        } else if (*c < 0x20 || *c == 0x7f) {
            memcpy(out + i, "\\u00", 4);
            out[i + 4] = hex[*c >> 4];
            out[i + 5] = hex[*c & 15];
            i += 6;
        } else {
            out[i++] = (char)*c;
        }
    }
    out[i++] = '"';
    *at = i;
    return 1;
}

/* Make `path` and its missing parents, mode 0700. */
static void gmount_registry_mkdirs(char *path) {
    for (char *slash = strchr(path + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        mkdir(path, 0700);
        *slash = '/';
    }
    mkdir(path, 0700);
}

/* Remove the registrations in `folder` whose process ended (or whose pid another process now has). */
static void gmount_registry_prune(const char *folder) {
    DIR *dir = opendir(folder);
    if (!dir)
        return;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        long pid;
        unsigned long long ticks;
        char tail[8];
        if (sscanf(entry->d_name, "%ld-%llu%7s", &pid, &ticks, tail) != 3 || strcmp(tail, ".json") != 0)
            continue;
        if (gmount_registry_start_ticks(pid) != ticks) {
            char path[PATH_MAX];
            if (snprintf(path, sizeof path, "%s/%s", folder, entry->d_name) < (int)sizeof path)
                unlink(path);
        }
    }
    closedir(dir);
}

/* Register `job` (started by `kind`, in namespace `directory`) as running on `node` of `cluster` while
 * process `pid` of this machine runs. */
static void gmount_register_job(const char *cluster, const char *node, const char *job, long pid, const char *kind,
                                const char *directory) {
    unsigned long long ticks = gmount_registry_start_ticks(pid);
    if (!ticks || !cluster || !*cluster || strchr(cluster, '/'))
        return;
    char folder[PATH_MAX];
    const char *state = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    int n = state && *state ? snprintf(folder, sizeof folder, "%s/gmountpy/jobs/%s", state, cluster)
            : home && *home ? snprintf(folder, sizeof folder, "%s/.local/state/gmountpy/jobs/%s", home, cluster)
            : -1;
    if (n < 0 || n >= (int)sizeof folder)
        return;
    struct utsname names;
    struct timespec now;
    if (uname(&names) < 0 || clock_gettime(CLOCK_REALTIME, &now) < 0)
        return;
    char record[GMOUNT_REGISTRY_RECORD_MAX];
    size_t at = 0;
    const char *keys[] = {"cluster", "node", "job", "kind", "directory"};
    const char *values[] = {cluster, node, job, kind, directory};
    record[at++] = '{';
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        at += (size_t)snprintf(record + at, sizeof record - at, "%s\"%s\": ", k ? ", " : "", keys[k]);
        if (at >= sizeof record || !gmount_registry_json_string(record, &at, sizeof record, values[k] ? values[k] : ""))
            return;
    }
    int tail = snprintf(record + at, sizeof record - at, ", \"started\": %lld.%03ld, \"host\": ", (long long)now.tv_sec,
                        now.tv_nsec / 1000000);
    if (tail < 0 || at + (size_t)tail >= sizeof record)
        return;
    at += (size_t)tail;
    if (!gmount_registry_json_string(record, &at, sizeof record, names.nodename))
        return;
    tail = snprintf(record + at, sizeof record - at, ", \"pid\": %ld}", pid);
    if (tail < 0 || at + (size_t)tail >= sizeof record)
        return;
    at += (size_t)tail;

    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%ld-%llu.json", folder, pid, ticks) >= (int)sizeof path)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 && errno == ENOENT) {
        gmount_registry_mkdirs(folder);
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    }
    if (fd < 0)
        return;
    ssize_t written = write(fd, record, at);  /* one write: a reader sees all of it or an empty file */
    (void)written;
    close(fd);
    if (pid % GMOUNT_REGISTRY_PRUNE_EVERY == 0)  /* nobody may be reading them: clear ended jobs now and then */
        gmount_registry_prune(folder);
}

#endif
