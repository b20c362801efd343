/* gmw-delay: hold each queued packet's verdict until its deadline (WAN latency without netem).
 *
 * Usage: gmw-delay QUEUE:DELAY_US [QUEUE:DELAY_US ...]
 *
 * Run inside the hub network namespace, where iptables sends each ordered
 * site pair's FORWARD traffic to its own NFQUEUE number. The kernel keeps the
 * packets (copy mode META: no payload crosses to user space); this program
 * only remembers (packet id, deadline) per queue. A queue has one constant
 * delay, so its deadlines are in arrival order: a ring per queue, and one
 * batch verdict (accept every id <= the last due one) releases all due
 * packets of a queue at once.
 *
 * Built by benchmarks/wan/sites.py with: gcc -O2 delay.c -lnetfilter_queue -lmnl
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/socket.h>

#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#define MAX_QUEUES 1024
#define RING (1u << 18) /* packets held per queue at most; the kernel queue is capped below it */
#define QMAXLEN (RING - 1024)

struct held {
    uint32_t id;
    int64_t due_ns;
};

struct queue {
    int used;
    int64_t delay_ns;
    struct held *ring;
    uint32_t head, tail; /* ring indices, head == tail: empty */
};

static struct queue queues[MAX_QUEUES];
static struct mnl_socket *nl;
static volatile sig_atomic_t stopping;
static char sendbuf[8192];

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "gmw-delay: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void send_or_die(struct nlmsghdr *nlh, const char *what) {
    if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0)
        die(what);
}

static void configure(uint16_t num) {
    struct nlmsghdr *nlh = nfq_nlmsg_put(sendbuf, NFQNL_MSG_CONFIG, num);
    nfq_nlmsg_cfg_put_cmd(nlh, AF_INET, NFQNL_CFG_CMD_BIND);
    send_or_die(nlh, "bind queue");

    nlh = nfq_nlmsg_put(sendbuf, NFQNL_MSG_CONFIG, num);
    nfq_nlmsg_cfg_put_params(nlh, NFQNL_COPY_META, 0);
    mnl_attr_put_u32(nlh, NFQA_CFG_QUEUE_MAXLEN, htonl(QMAXLEN));
    /* GSO: queue whole GSO super-packets instead of making the kernel segment them. */
    mnl_attr_put_u32(nlh, NFQA_CFG_FLAGS, htonl(NFQA_CFG_F_GSO));
    mnl_attr_put_u32(nlh, NFQA_CFG_MASK, htonl(NFQA_CFG_F_GSO));
    send_or_die(nlh, "configure queue");
}

static void release(uint16_t num, uint32_t id) {
    struct nlmsghdr *nlh = nfq_nlmsg_put(sendbuf, NFQNL_MSG_VERDICT_BATCH, num);
    nfq_nlmsg_verdict_put(nlh, id, NF_ACCEPT);
    send_or_die(nlh, "send verdict");
}

static int on_packet(const struct nlmsghdr *nlh, void *data) {
    (void)data;
    struct nlattr *attr[NFQA_MAX + 1] = {0};
    if (nfq_nlmsg_parse(nlh, attr) < 0 || attr[NFQA_PACKET_HDR] == NULL)
        return MNL_CB_OK;
    struct nfqnl_msg_packet_hdr *ph = mnl_attr_get_payload(attr[NFQA_PACKET_HDR]);
    struct nfgenmsg *nfg = mnl_nlmsg_get_payload(nlh);
    uint16_t num = ntohs(nfg->res_id);
    uint32_t id = ntohl(ph->packet_id);
    if (num >= MAX_QUEUES || !queues[num].used) {
        release(num, id); /* not ours to delay: let it through */
        return MNL_CB_OK;
    }
    struct queue *q = &queues[num];
    if (((q->tail + 1) & (RING - 1)) == q->head) {
        release(num, id); /* cannot happen with QMAXLEN < RING; never stall the link */
        return MNL_CB_OK;
    }
    q->ring[q->tail].id = id;
    q->ring[q->tail].due_ns = now_ns() + q->delay_ns;
    q->tail = (q->tail + 1) & (RING - 1);
    return MNL_CB_OK;
}

/* Release every due packet; return the nearest future deadline (or -1). */
static int64_t release_due(void) {
    int64_t now = now_ns(), next = -1;
    for (int num = 0; num < MAX_QUEUES; num++) {
        struct queue *q = &queues[num];
        if (!q->used || q->head == q->tail)
            continue;
        uint32_t last = 0;
        int any = 0;
        while (q->head != q->tail && q->ring[q->head].due_ns <= now) {
            last = q->ring[q->head].id;
            any = 1;
            q->head = (q->head + 1) & (RING - 1);
        }
        if (any)
            release((uint16_t)num, last);
        if (q->head != q->tail && (next < 0 || q->ring[q->head].due_ns < next))
            next = q->ring[q->head].due_ns;
    }
    return next;
}

static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: gmw-delay QUEUE:DELAY_US [QUEUE:DELAY_US ...]\n");
        return 2;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);

    nl = mnl_socket_open(NETLINK_NETFILTER);
    if (nl == NULL)
        die("open netlink socket");
    if (mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0)
        die("bind netlink socket");
    int fd = mnl_socket_get_fd(nl);
    int size = 64 << 20, one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);

    for (int i = 1; i < argc; i++) {
        unsigned num;
        double delay_us;
        if (sscanf(argv[i], "%u:%lf", &num, &delay_us) != 2 || num >= MAX_QUEUES || delay_us < 0) {
            fprintf(stderr, "gmw-delay: bad argument %s (want QUEUE:DELAY_US, queue < %d)\n", argv[i], MAX_QUEUES);
            return 2;
        }
        queues[num].used = 1;
        queues[num].delay_ns = (int64_t)(delay_us * 1000.0);
        queues[num].ring = malloc(sizeof(struct held) * RING);
        if (queues[num].ring == NULL)
            die("malloc");
        configure((uint16_t)num);
    }
    printf("READY\n");
    fflush(stdout);

    static char buf[1 << 20];
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    while (!stopping) {
        int64_t next = release_due();
        struct timespec timeout, *tp = NULL;
        if (next >= 0) {
            int64_t wait = next - now_ns();
            if (wait < 0)
                wait = 0;
            timeout.tv_sec = wait / 1000000000LL;
            timeout.tv_nsec = wait % 1000000000LL;
            tp = &timeout;
        }
        int ready = ppoll(&pfd, 1, tp, NULL);
        if (ready < 0) {
            if (errno == EINTR)
                continue;
            die("poll");
        }
        if (ready == 0)
            continue;
        /* Drain everything that is waiting, then release what became due. */
        for (;;) {
            ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                    break;
                if (errno == ENOBUFS)
                    continue;
                die("receive");
            }
            /* Walk the messages ourselves: an error reply about one verdict must not
             * make us skip the packets that follow it in the same buffer. */
            int left = (int)n;
            for (struct nlmsghdr *nlh = (struct nlmsghdr *)buf; mnl_nlmsg_ok(nlh, left);
                 nlh = mnl_nlmsg_next(nlh, &left)) {
                if (nlh->nlmsg_type == ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET))
                    on_packet(nlh, NULL);
            }
        }
    }
    return 0;
}
