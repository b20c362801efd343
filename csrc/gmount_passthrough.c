/*
 * libgmount_passthrough: kernel FUSE passthrough (Linux >= 6.9) for the pyfuse3 node daemon.
 *
 * With passthrough the kernel reads and writes a file opened through the mount on a
 * "backing" file the daemon registered (FUSE_DEV_IOC_BACKING_OPEN on /dev/fuse) instead of
 * sending READ/WRITE to the daemon: local files at disk speed, for every program, static
 * binaries included. Opening a backing file needs CAP_SYS_ADMIN.
 *
 * libfuse before 3.16 and pyfuse3 (3.5) know nothing of it: the INIT reply must carry the
 * FUSE_PASSTHROUGH flag and max_stack_depth, the OPEN/CREATE reply FOPEN_PASSTHROUGH and the
 * backing id, and neither can be set through their APIs. This library, loaded with
 * RTLD_GLOBAL into the daemon before pyfuse3, wraps fuse_session_mount() (which pyfuse3
 * calls) to give the session a custom I/O (fuse_session_custom_io, libfuse >= 3.14): every
 * request still goes to libfuse untouched, and three kinds of reply are amended on their way
 * to the kernel -- INIT (passthrough asked for, when the kernel offered it), and OPEN/CREATE
 * replies whose file handle the daemon offered for passthrough (gmount_pt_offer).
 *
 * The kernel structures used here are its stable ABI (include/uapi/linux/fuse.h, 7.40).
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define GM_EXPORT __attribute__((visibility("default")))

/* --- kernel ABI --------------------------------------------------------------------- */
#define FUSE_OPEN 14
#define FUSE_INIT 26
#define FUSE_CREATE 35
#define FUSE_WRITEBACK_CACHE (1u << 16)
#define FUSE_INIT_EXT (1u << 30)
#define FUSE_PASSTHROUGH_FLAGS2 (1u << 5) /* FUSE_PASSTHROUGH is 1ULL << 37: bit 5 of flags2 */
#define FOPEN_DIRECT_IO (1u << 0)
#define FOPEN_NOFLUSH (1u << 5)
#define FOPEN_PARALLEL_DIRECT_WRITES (1u << 6)
#define FOPEN_PASSTHROUGH (1u << 7)
#define FILESYSTEM_MAX_STACK_DEPTH 2

struct fuse_in_header {
    uint32_t len;
    uint32_t opcode;
    uint64_t unique;
    uint64_t nodeid;
    uint32_t uid, gid, pid;
    uint16_t total_extlen;
    uint16_t padding;
};

struct fuse_init_in {
    uint32_t major, minor, max_readahead, flags, flags2;
};

struct fuse_out_header {
    uint32_t len;
    int32_t error;
    uint64_t unique;
};

struct fuse_open_out {
    uint64_t fh;
    uint32_t open_flags;
    int32_t backing_id;
};

#define INIT_OUT_FLAGS 12         /* offsets in struct fuse_init_out */
#define INIT_OUT_FLAGS2 32
#define INIT_OUT_MAX_STACK_DEPTH 36
#define INIT_OUT_MIN_SIZE 40
#define ENTRY_OUT_SIZE 128        /* struct fuse_entry_out, protocol >= 7.9 */

struct fuse_backing_map {
    int32_t fd;
    uint32_t flags;
    uint64_t padding;
};
#define FUSE_DEV_IOC_BACKING_OPEN _IOW(229, 1, struct fuse_backing_map)
#define FUSE_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

/* --- libfuse (3.14 - 3.16 layout; 3.17 takes its size) ------------------------------ */
struct fuse_session;
struct fuse_custom_io {
    ssize_t (*writev)(int fd, struct iovec *iov, int count, void *userdata);
    ssize_t (*read)(int fd, void *buf, size_t buf_len, void *userdata);
    ssize_t (*splice_receive)(int fdin, off_t *offin, int fdout, off_t *offout, size_t len, unsigned int flags,
                              void *userdata);
    ssize_t (*splice_send)(int fdin, off_t *offin, int fdout, off_t *offout, size_t len, unsigned int flags,
                           void *userdata);
};

/* --- state -------------------------------------------------------------------------- */
#define PENDING 1024   /* OPEN/CREATE requests awaiting a reply (pyfuse3 runs at most 99 at once) */
#define OFFERS 4096    /* file handles offered for passthrough, open-addressed */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int armed;                 /* gmount_pt_arm() was called: install the custom I/O at mount */
static int fuse_fd = -1;
static int kernel_offers;         /* the kernel's INIT offered FUSE_PASSTHROUGH */
static int negotiated;            /* our INIT reply asked for it */
static struct { uint64_t unique; uint32_t opcode; } pending[PENDING];
static struct { uint64_t fh; int32_t backing_id; } offers[OFFERS];   /* fh 0 = free slot */
static long replies_amended;

/* x in (lo, hi], going round the table: an entry whose home is there must stay behind `lo`. */
static int cyclic_between(unsigned lo, unsigned x, unsigned hi) {
    return lo <= hi ? (lo < x && x <= hi) : (lo < x || x <= hi);
}

static void remember_request(uint64_t unique, uint32_t opcode) {
    for (unsigned i = 0; i < PENDING; i++) {
        unsigned slot = (unsigned)((unique + i) % PENDING);
        if (pending[slot].unique == 0) {
            pending[slot].unique = unique;
            pending[slot].opcode = opcode;
            return;
        }
    }
}

static uint32_t take_request(uint64_t unique) {
    for (unsigned i = 0; i < PENDING; i++) {
        unsigned slot = (unsigned)((unique + i) % PENDING);
        if (pending[slot].unique == unique) {
            uint32_t opcode = pending[slot].opcode;
            /* backward-shift deletion keeps the probe chains of the others intact */
            unsigned hole = slot;
            for (unsigned j = 1; j < PENDING; j++) {
                unsigned next = (slot + j) % PENDING;
                if (pending[next].unique == 0)
                    break;
                unsigned home = (unsigned)(pending[next].unique % PENDING);
                if (!cyclic_between(hole, home, next)) {
                    pending[hole] = pending[next];
                    hole = next;
                }
            }
            pending[hole].unique = 0;
            return opcode;
        }
        if (pending[slot].unique == 0)
            return 0;
    }
    return 0;
}

static int offer_slot(uint64_t fh, int create) {
    for (unsigned i = 0; i < OFFERS; i++) {
        unsigned slot = (unsigned)((fh + i) % OFFERS);
        if (offers[slot].fh == fh)
            return (int)slot;
        if (offers[slot].fh == 0)
            return create ? (int)slot : -1;
    }
    return -1;
}

/* --- the custom I/O ------------------------------------------------------------------ */

static ssize_t pt_read(int fd, void *buf, size_t len, void *userdata) {
    (void)userdata;
    ssize_t n = read(fd, buf, len);
    if (n >= (ssize_t)sizeof(struct fuse_in_header)) {
        const struct fuse_in_header *in = buf;
        if (in->opcode == FUSE_OPEN || in->opcode == FUSE_CREATE) {
            pthread_mutex_lock(&lock);
            remember_request(in->unique, in->opcode);
            pthread_mutex_unlock(&lock);
        } else if (in->opcode == FUSE_INIT &&
                   (size_t)n >= sizeof(struct fuse_in_header) + sizeof(struct fuse_init_in)) {
            const struct fuse_init_in *init = (const void *)((const char *)buf + sizeof(struct fuse_in_header));
            kernel_offers = init->major == 7 && init->minor >= 40 && (init->flags & FUSE_INIT_EXT) &&
                            (init->flags2 & FUSE_PASSTHROUGH_FLAGS2);
            if (kernel_offers) {
                pthread_mutex_lock(&lock);
                remember_request(in->unique, FUSE_INIT);
                pthread_mutex_unlock(&lock);
            }
        }
    }
    return n;
}

/* The reply's argument, when libfuse put it in one piece after the header (it always does). */
static char *argument(struct iovec *iov, int count, size_t size) {
    if (count < 2 || iov[1].iov_len < size)
        return NULL;
    return iov[1].iov_base;
}

static void amend_init(struct iovec *iov, int count) {
    char *out = argument(iov, count, INIT_OUT_MIN_SIZE);
    if (out == NULL)
        return;
    uint32_t flags;
    memcpy(&flags, out + INIT_OUT_FLAGS, 4);
    if (flags & FUSE_WRITEBACK_CACHE)
        return;  /* the kernel refuses passthrough with a writeback cache */
    uint32_t flags2;
    memcpy(&flags2, out + INIT_OUT_FLAGS2, 4);
    flags |= FUSE_INIT_EXT;
    flags2 |= FUSE_PASSTHROUGH_FLAGS2;
    /* backing files may sit on a stacked file system (overlayfs) themselves */
    uint32_t depth = FILESYSTEM_MAX_STACK_DEPTH;
    memcpy(out + INIT_OUT_FLAGS, &flags, 4);
    memcpy(out + INIT_OUT_FLAGS2, &flags2, 4);
    memcpy(out + INIT_OUT_MAX_STACK_DEPTH, &depth, 4);
    negotiated = 1;
}

static void amend_open(struct iovec *iov, int count, size_t offset) {
    char *arg = argument(iov, count, offset + sizeof(struct fuse_open_out));
    if (arg == NULL)
        return;
    struct fuse_open_out open_out;
    memcpy(&open_out, arg + offset, sizeof(open_out));
    int slot = offer_slot(open_out.fh, 0);
    if (slot < 0)
        return;
    open_out.open_flags = (open_out.open_flags & (FOPEN_NOFLUSH | FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES)) |
                          FOPEN_PASSTHROUGH;
    open_out.backing_id = offers[slot].backing_id;
    memcpy(arg + offset, &open_out, sizeof(open_out));
    replies_amended++;
}

static ssize_t pt_writev(int fd, struct iovec *iov, int count, void *userdata) {
    (void)userdata;
    if (count >= 1 && iov[0].iov_len >= sizeof(struct fuse_out_header)) {
        const struct fuse_out_header *out = iov[0].iov_base;
        if (out->unique != 0) {
            pthread_mutex_lock(&lock);
            uint32_t opcode = take_request(out->unique);
            if (out->error == 0) {
                if (opcode == FUSE_INIT)
                    amend_init(iov, count);
                else if (opcode == FUSE_OPEN)
                    amend_open(iov, count, 0);
                else if (opcode == FUSE_CREATE)
                    amend_open(iov, count, ENTRY_OUT_SIZE);
            }
            pthread_mutex_unlock(&lock);
        }
    }
    return writev(fd, iov, count);
}

static struct fuse_custom_io custom_io = {.writev = pt_writev, .read = pt_read};

static void *libfuse(void) { return dlopen("libfuse3.so.3", RTLD_NOW | RTLD_NOLOAD); }

/* pyfuse3.init() calls this: mount, then route the session's I/O through the functions above. */
GM_EXPORT int fuse_session_mount(struct fuse_session *se, const char *mountpoint) {
    void *handle = libfuse();
    int (*real_mount)(struct fuse_session *, const char *) =
        handle != NULL ? (int (*)(struct fuse_session *, const char *))dlsym(handle, "fuse_session_mount") : NULL;
    if (real_mount == NULL || real_mount == fuse_session_mount) {
        errno = ENOSYS;
        return -1;
    }
    int rc = real_mount(se, mountpoint);
    if (rc != 0 || !armed)
        return rc;
    int (*session_fd)(struct fuse_session *) = (int (*)(struct fuse_session *))dlsym(handle, "fuse_session_fd");
    int (*custom_317)(struct fuse_session *, const struct fuse_custom_io *, size_t, int) =
        (int (*)(struct fuse_session *, const struct fuse_custom_io *, size_t, int))dlsym(
            handle, "fuse_session_custom_io_317");
    int (*custom_30)(struct fuse_session *, const struct fuse_custom_io *, int) =
        (int (*)(struct fuse_session *, const struct fuse_custom_io *, int))dlsym(handle, "fuse_session_custom_io");
    if (session_fd == NULL || (custom_317 == NULL && custom_30 == NULL))
        return rc;  /* libfuse < 3.14: no passthrough, the mount works as before */
    int fd = session_fd(se);
    int done = custom_317 != NULL ? custom_317(se, &custom_io, sizeof(custom_io), fd) : custom_30(se, &custom_io, fd);
    if (done == 0)
        fuse_fd = fd;
    return rc;
}

/* --- the daemon's side (ctypes) ------------------------------------------------------ */

/* Called before pyfuse3.init(): install the custom I/O when the session is mounted. */
GM_EXPORT void gmount_pt_arm(void) { armed = 1; }

/* 1 once the INIT reply asked the kernel for passthrough (it accepts what it offered). */
GM_EXPORT int gmount_pt_negotiated(void) { return negotiated && fuse_fd >= 0; }

/* Register `fd` as a backing file: its id, or -errno (EPERM without CAP_SYS_ADMIN). */
GM_EXPORT int gmount_pt_backing_open(int fd) {
    if (fuse_fd < 0)
        return -ENODEV;
    struct fuse_backing_map map = {.fd = fd};
    int id = ioctl(fuse_fd, FUSE_DEV_IOC_BACKING_OPEN, &map);
    return id < 0 ? -errno : id;
}

GM_EXPORT int gmount_pt_backing_close(int backing_id) {
    uint32_t id = (uint32_t)backing_id;
    return ioctl(fuse_fd, FUSE_DEV_IOC_BACKING_CLOSE, &id) < 0 ? -errno : 0;
}

/* The reply to the open that got file handle `fh` asks for passthrough on `backing_id`. */
GM_EXPORT int gmount_pt_offer(uint64_t fh, int backing_id) {
    if (fh == 0)
        return -EINVAL;
    pthread_mutex_lock(&lock);
    int slot = offer_slot(fh, 1);
    if (slot >= 0) {
        offers[slot].fh = fh;
        offers[slot].backing_id = backing_id;
    }
    pthread_mutex_unlock(&lock);
    return slot < 0 ? -ENOSPC : 0;
}

/* The handle was released: forget the offer. */
GM_EXPORT void gmount_pt_forget(uint64_t fh) {
    pthread_mutex_lock(&lock);
    int slot = offer_slot(fh, 0);
    if (slot >= 0) {
        /* backward-shift deletion, as for the pending requests */
        unsigned hole = (unsigned)slot;
        for (unsigned j = 1; j < OFFERS; j++) {
            unsigned next = ((unsigned)slot + j) % OFFERS;
            if (offers[next].fh == 0)
                break;
            unsigned home = (unsigned)(offers[next].fh % OFFERS);
            if (!cyclic_between(hole, home, next)) {
                offers[hole] = offers[next];
                hole = next;
            }
        }
        offers[hole].fh = 0;
    }
    pthread_mutex_unlock(&lock);
}

GM_EXPORT long gmount_pt_amended(void) { return replies_amended; }
