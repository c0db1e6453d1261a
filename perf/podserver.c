/*
 * podserver: product pods for the fan-out benchmarks, all in ONE process.
 *
 *   podserver [-s MS] PORT...        (PORT 0: the kernel picks one)
 *
 * Listens on 127.0.0.1:PORT for every PORT given and prints one line, "ports P1 P2 ...",
 * with the ports bound, in order, once every socket listens. HTTP/1.1 with keep-alive and
 * pipelining (answers leave in request order); request bodies by Content-Length only.
 *
 *   GET /<key>      200 {"key":"<key>","pod":<port>}, exactly MS ms (default 2, fractional
 *                   ok) after the request was parsed; <key> is %-decoded, then JSON-escaped
 *   POST /batch     a JSON array of strings: 200 with a JSON array of such objects, in
 *                   order, after MS ms
 *   GET /_stats     at once: {"ports":[...],"accepted":{...},"served":{...},"keys":{...},
 *                   "max_concurrent":{...},"in_flight":{...},"open":{...}}, each
 *                   {"total":N,"<port>":N}
 *                   (accepted: TCP connections accepted; served: key requests answered,
 *                   keys: the keys in them;
 *                   max_concurrent: most key requests being served at once; open:
 *                   connections open now, so accepted - the growth of open = closed ones)
 *   POST /_reset    at once: zeroes the counters (max_concurrent restarts from in_flight)
 *
 * One epoll loop, one timerfd. Every delayed answer is due MS after its parse, and parse
 * times only grow, so the due times enter in non-decreasing order: a FIFO is the timer's
 * min-heap here. Bounded: headers 16 KiB, a body 1 MiB, 4096 answers queued and 16 MiB of
 * output per connection; anything malformed or over a bound closes the connection (a 400
 * or 413 is sent first when the request line could be read). SIGPIPE is ignored and every
 * socket error just closes that connection.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "podserver.h"

enum { K_LISTEN = 1, K_TIMER = 2, K_CONN = 3 };

int n_ports;
int ports[MAX_PORTS];
static int listen_fds[MAX_PORTS];
uint64_t accepted[MAX_PORTS], served[MAX_PORTS], keys_served[MAX_PORTS];
uint64_t open_now[MAX_PORTS]; /* connections open now (not zeroed by a reset) */
int64_t in_flight[MAX_PORTS], max_conc[MAX_PORTS];
int64_t in_flight_all, max_conc_all;

static int epfd, tfd;
uint64_t delay_ns = 2000000;
/* -r: every answer carries a load report and Server-Timing, as the serving middleware's. */
int with_reports = 0;
static conn **conns;
static int conns_cap;
static uint32_t next_gen = 1;

static timer_entry *tq;
static size_t tq_cap, tq_head, tq_len;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n);
    if (!q) {
        fprintf(stderr, "podserver: out of memory\n");
        exit(2);
    }
    return q;
}

static uint64_t ev_data(int kind, uint32_t gen, int fd) {
    return ((uint64_t)kind << 62) | ((uint64_t)(gen & 0x3fffffffu) << 32) | (uint32_t)fd;
}

/* ---- timer queue (FIFO = min-heap, see the header) ---------------------------------- */

static void arm_timer(void) {
    struct itimerspec its;
    memset(&its, 0, sizeof its);
    if (tq_len) {
        uint64_t due = tq[tq_head].due_ns;
        its.it_value.tv_sec = (time_t)(due / 1000000000u);
        its.it_value.tv_nsec = (long)(due % 1000000000u);
        if (!its.it_value.tv_sec && !its.it_value.tv_nsec) its.it_value.tv_nsec = 1;
    }
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

static void tq_push(int fd, uint32_t gen, uint64_t due) {
    if (tq_len == tq_cap) {
        size_t ncap = tq_cap ? tq_cap * 2 : 1024;
        timer_entry *n = xrealloc(NULL, ncap * sizeof *n);
        for (size_t i = 0; i < tq_len; i++) n[i] = tq[(tq_head + i) % tq_cap];
        free(tq);
        tq = n;
        tq_cap = ncap;
        tq_head = 0;
    }
    tq[(tq_head + tq_len) % tq_cap] = (timer_entry){fd, gen, due};
    tq_len++;
    if (tq_len == 1) arm_timer();
}

/* ---- connections ------------------------------------------------------------------ */

void conn_close(conn *c) {
    for (slot *s = c->head; s;) {
        slot *n = s->next;
        if (s->delayed && !s->ready) {
            in_flight[c->port_ix]--;
            in_flight_all--;
        }
        free(s->data);
        free(s);
        s = n;
    }
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    open_now[c->port_ix]--;
    conns[c->fd] = NULL;
    free(c->in);
    free(c->out);
    free(c);
}

void set_events(conn *c) {
    struct epoll_event ev;
    ev.events = (c->close_after ? 0 : EPOLLIN) | (c->want_out ? EPOLLOUT : 0) | EPOLLRDHUP;
    ev.data.u64 = ev_data(K_CONN, c->gen, c->fd);
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Write what is ready; returns 0 if the connection was closed. */
int conn_flush(conn *c) {
    while (c->head && c->head->ready) {
        slot *s = c->head;
        if (c->out_len - c->out_off + s->len > MAX_OUT) {
            conn_close(c);
            return 0;
        }
        if (c->out_len + s->len > c->out_cap) {
            if (c->out_off) {
                memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
                c->out_len -= c->out_off;
                c->out_off = 0;
            }
            if (c->out_len + s->len > c->out_cap) {
                size_t ncap = c->out_cap ? c->out_cap : 4096;
                while (ncap < c->out_len + s->len) ncap *= 2;
                c->out = xrealloc(c->out, ncap);
                c->out_cap = ncap;
            }
        }
        memcpy(c->out + c->out_len, s->data, s->len);
        c->out_len += s->len;
        c->head = s->next;
        if (!c->head) c->tail = NULL;
        c->n_slots--;
        free(s->data);
        free(s);
    }
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w > 0) {
            c->out_off += (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
        } else {
            conn_close(c);
            return 0;
        }
    }
    if (c->out_off == c->out_len) c->out_off = c->out_len = 0;
    int want = c->out_len > 0;
    if (!want && c->close_after && !c->head) {
        conn_close(c);
        return 0;
    }
    if (want != c->want_out) {
        c->want_out = want;
        set_events(c);
    }
    return 1;
}

slot *add_slot(conn *c, char *data, size_t len, int delayed) {
    slot *s = xrealloc(NULL, sizeof *s);
    s->next = NULL;
    s->ready = !delayed;
    s->delayed = delayed;
    s->keys = 0;
    s->data = data;
    s->len = len;
    if (c->tail)
        c->tail->next = s;
    else
        c->head = s;
    c->tail = s;
    c->n_slots++;
    if (delayed) {
        int p = c->port_ix;
        in_flight[p]++;
        in_flight_all++;
        if (in_flight[p] > max_conc[p]) max_conc[p] = in_flight[p];
        if (in_flight_all > max_conc_all) max_conc_all = in_flight_all;
        tq_push(c->fd, c->gen, now_ns() + delay_ns);
    }
    return s;
}

static void conn_read(conn *c) {
    if (c->in_len == c->in_cap) {
        if (c->in_cap >= MAX_IN) { /* cannot happen: parse answers 413/431 before */
            conn_close(c);
            return;
        }
        size_t ncap = c->in_cap ? c->in_cap * 2 : 8192;
        if (ncap > MAX_IN) ncap = MAX_IN;
        c->in = xrealloc(c->in, ncap);
        c->in_cap = ncap;
    }
    ssize_t r;
    do {
        r = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    } while (r < 0 && errno == EINTR);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (r <= 0) {
        conn_close(c); /* EOF, reset or error */
        return;
    }
    c->in_len += (size_t)r; /* level-triggered: what is left comes back as another event */
    conn_parse(c);
}

static void accept_all(int ix) {
    for (int k = 0; k < 256; k++) {
        int fd = accept4(listen_fds[ix], NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; /* EAGAIN, or EMFILE & co: try again on the next event */
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (fd >= conns_cap) {
            int ncap = conns_cap ? conns_cap : 1024;
            while (ncap <= fd) ncap *= 2;
            conns = xrealloc(conns, (size_t)ncap * sizeof *conns);
            memset(conns + conns_cap, 0, (size_t)(ncap - conns_cap) * sizeof *conns);
            conns_cap = ncap;
        }
        conn *c = xrealloc(NULL, sizeof *c);
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->port_ix = ix;
        c->gen = next_gen++ & 0x3fffffffu;
        if (!c->gen) c->gen = next_gen++ & 0x3fffffffu;
        conns[fd] = c;
        struct epoll_event ev;
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.u64 = ev_data(K_CONN, c->gen, fd);
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            conns[fd] = NULL;
            close(fd);
            free(c);
            continue;
        }
        accepted[ix]++;
        open_now[ix]++;
    }
}

static void fire_timers(void) {
    uint64_t buf;
    while (read(tfd, &buf, sizeof buf) > 0) {
    }
    uint64_t now = now_ns();
    while (tq_len && tq[tq_head].due_ns <= now) {
        timer_entry e = tq[tq_head];
        tq_head = (tq_head + 1) % tq_cap;
        tq_len--;
        conn *c = e.fd < conns_cap ? conns[e.fd] : NULL;
        if (!c || c->gen != e.gen) continue; /* that connection is gone */
        for (slot *s = c->head; s; s = s->next) {
            if (s->delayed && !s->ready) {
                s->ready = 1;
                served[c->port_ix]++;
                keys_served[c->port_ix] += s->keys;
                in_flight[c->port_ix]--;
                in_flight_all--;
                break;
            }
        }
        conn_flush(c);
    }
    arm_timer();
}

static int usage(void) {
    fprintf(stderr, "usage: podserver [-r] [-s MS] PORT...   (PORT 0: any free port)\n");
    return 2;
}

int main(int argc, char **argv) {
    int i = 1;
    if (i < argc && !strcmp(argv[i], "-r")) {
        with_reports = 1;
        i++;
    }
    if (i + 1 < argc && !strcmp(argv[i], "-s")) {
        char *e;
        double ms = strtod(argv[i + 1], &e);
        if (*e || !(ms >= 0 && ms <= 600000)) return usage();
        delay_ns = (uint64_t)(ms * 1e6 + 0.5);
        i += 2;
    }
    if (i >= argc || argc - i > MAX_PORTS) return usage();
    signal(SIGPIPE, SIG_IGN);
    epfd = epoll_create1(EPOLL_CLOEXEC);
    tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (epfd < 0 || tfd < 0) {
        perror("podserver: epoll/timerfd");
        return 1;
    }
    for (; i < argc; i++) {
        char *e;
        long p = strtol(argv[i], &e, 10);
        if (*e || p < 0 || p > 65535) return usage();
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons((uint16_t)p);
        socklen_t al = sizeof a;
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 4096) < 0 ||
            getsockname(fd, (struct sockaddr *)&a, &al) < 0) {
            fprintf(stderr, "podserver: port %ld: %s\n", p, strerror(errno));
            return 1;
        }
        listen_fds[n_ports] = fd;
        ports[n_ports] = ntohs(a.sin_port);
        struct epoll_event ev;
        ev.events = EPOLLIN;
        ev.data.u64 = ev_data(K_LISTEN, 0, n_ports);
        epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
        n_ports++;
    }
    struct epoll_event tev;
    tev.events = EPOLLIN;
    tev.data.u64 = ev_data(K_TIMER, 0, tfd);
    epoll_ctl(epfd, EPOLL_CTL_ADD, tfd, &tev);
    printf("ports");
    for (int k = 0; k < n_ports; k++) printf(" %d", ports[k]);
    printf("\n");
    fflush(stdout);

    struct epoll_event evs[256];
    for (;;) {
        int n = epoll_wait(epfd, evs, 256, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("podserver: epoll_wait");
            return 1;
        }
        for (int k = 0; k < n; k++) {
            uint64_t d = evs[k].data.u64;
            int kind = (int)(d >> 62);
            int fd = (int)(uint32_t)d;
            if (kind == K_LISTEN) {
                accept_all(fd);
            } else if (kind == K_TIMER) {
                fire_timers();
            } else {
                uint32_t gen = (uint32_t)(d >> 32) & 0x3fffffffu;
                conn *c = fd < conns_cap ? conns[fd] : NULL;
                if (!c || c->gen != gen) continue; /* closed earlier in this batch */
                uint32_t e = evs[k].events;
                if (e & EPOLLERR) {
                    conn_close(c);
                    continue;
                }
                if (e & EPOLLOUT) {
                    if (!conn_flush(c)) continue;
                }
                if (e & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) {
                    if (c->close_after) {
                        if (e & (EPOLLHUP | EPOLLRDHUP)) conn_close(c);
                        continue;
                    }
                    conn_read(c);
                }
            }
        }
    }
}
