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

#define MAX_PORTS 64
#define MAX_HEADER (16 * 1024)
#define MAX_BODY (1024 * 1024)
#define MAX_IN (MAX_HEADER + MAX_BODY)
#define MAX_SLOTS 4096
#define MAX_OUT (16 * 1024 * 1024)

enum { K_LISTEN = 1, K_TIMER = 2, K_CONN = 3 };

typedef struct slot {
    struct slot *next;
    int ready;  /* 1: may be written once every slot before it was */
    int delayed;
    uint64_t keys; /* keys answered (counted when the answer is due) */
    size_t len;
    char *data;
} slot;

typedef struct {
    int fd;
    int port_ix;
    uint32_t gen;
    char *in;
    size_t in_len, in_cap;
    char *out;
    size_t out_len, out_off, out_cap;
    slot *head, *tail;
    int n_slots;
    int close_after; /* stop reading; close once everything queued is written */
    int want_out;
} conn;

typedef struct {
    int fd;
    uint32_t gen;
    uint64_t due_ns;
} timer_entry;

static int n_ports;
static int ports[MAX_PORTS];
static int listen_fds[MAX_PORTS];
static uint64_t accepted[MAX_PORTS], served[MAX_PORTS], keys_served[MAX_PORTS];
static uint64_t open_now[MAX_PORTS]; /* connections open now (not zeroed by a reset) */
static int64_t in_flight[MAX_PORTS], max_conc[MAX_PORTS];
static int64_t in_flight_all, max_conc_all;

static int epfd, tfd;
static uint64_t delay_ns = 2000000;
/* -r: every answer carries a load report and Server-Timing, as the serving middleware's. */
static int with_reports = 0;
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

static void *xrealloc(void *p, size_t n) {
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

static void conn_close(conn *c) {
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

static void set_events(conn *c) {
    struct epoll_event ev;
    ev.events = (c->close_after ? 0 : EPOLLIN) | (c->want_out ? EPOLLOUT : 0) | EPOLLRDHUP;
    ev.data.u64 = ev_data(K_CONN, c->gen, c->fd);
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Write what is ready; returns 0 if the connection was closed. */
static int conn_flush(conn *c) {
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

static slot *add_slot(conn *c, char *data, size_t len, int delayed) {
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

/* ---- building answers ------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap < b->len + n + 1) ncap *= 2;
        b->p = xrealloc(b->p, ncap);
        b->cap = ncap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt_u(sbuf *b, uint64_t v) {
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_put(b, tmp, (size_t)n);
}

/* A whole response (status line, headers, body); takes ownership of body->p. */
static char *response(int status, const char *reason, sbuf *body, int closing, size_t *len) {
    sbuf r = {0};
    char head[512];
    char extra[256] = "";
    if (with_reports)
        snprintf(extra, sizeof extra,
                 "endpoint-load-metrics: TEXT application_utilization=0.41, rps_fractional=120, "
                 "eps=0, named_metrics.occupancy=0.82\r\nServer-Timing: app;dur=%.3f\r\n",
                 (double)delay_ns / 1e6);
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n%s%s\r\n",
                     status, reason, body->len, closing ? "Connection: close\r\n" : "", extra);
    sb_put(&r, head, (size_t)n);
    if (body->len) sb_put(&r, body->p, body->len);
    free(body->p);
    *len = r.len;
    return r.p;
}

static void json_escape(sbuf *b, const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = s[i];
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            sb_put(b, e, 2);
        } else if (ch < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", ch);
            sb_put(b, e, 6);
        } else {
            sb_put(b, (const char *)&ch, 1);
        }
    }
}

static int hexval(int ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static void key_object(sbuf *b, const char *raw_json, size_t n, int port) {
    sb_str(b, "{\"key\":\"");
    sb_put(b, raw_json, n);
    sb_str(b, "\",\"pod\":");
    sb_fmt_u(b, (uint64_t)port);
    sb_str(b, "}");
}

/* Scan a JSON string starting after its opening quote; returns the index of the closing
 * quote or -1 if malformed. The content between is kept as it is (already valid JSON). */
static long scan_string(const char *s, size_t i, size_t n) {
    while (i < n) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"') return (long)i;
        if (ch < 0x20) return -1;
        if (ch == '\\') {
            if (i + 1 >= n) return -1;
            char e = s[i + 1];
            if (e == 'u') {
                if (i + 5 >= n) return -1;
                for (int k = 2; k < 6; k++)
                    if (hexval(s[i + k]) < 0) return -1;
                i += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e)) return -1;
            i += 2;
            continue;
        }
        i++;
    }
    return -1;
}

static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

/* POST /batch body -> the answer's JSON array; 0 if the body is not an array of strings. */
static int batch_body(sbuf *out, const char *s, size_t n, int port, uint64_t *count) {
    size_t i = 0;
    while (i < n && is_ws(s[i])) i++;
    if (i >= n || s[i] != '[') return 0;
    i++;
    sb_str(out, "[");
    *count = 0;
    while (i < n && is_ws(s[i])) i++;
    if (i < n && s[i] == ']') {
        i++;
    } else {
        for (;;) {
            while (i < n && is_ws(s[i])) i++;
            if (i >= n || s[i] != '"') return 0;
            long end = scan_string(s, i + 1, n);
            if (end < 0) return 0;
            if (*count) sb_str(out, ",");
            key_object(out, s + i + 1, (size_t)end - i - 1, port);
            (*count)++;
            i = (size_t)end + 1;
            while (i < n && is_ws(s[i])) i++;
            if (i < n && s[i] == ',') {
                i++;
                continue;
            }
            if (i < n && s[i] == ']') {
                i++;
                break;
            }
            return 0;
        }
    }
    while (i < n && is_ws(s[i])) i++;
    if (i != n) return 0;
    sb_str(out, "]");
    return 1;
}

static void counter_obj(sbuf *b, const char *name, const uint64_t *per, uint64_t total) {
    sb_str(b, "\"");
    sb_str(b, name);
    sb_str(b, "\":{\"total\":");
    sb_fmt_u(b, total);
    for (int i = 0; i < n_ports; i++) {
        sb_str(b, ",\"");
        sb_fmt_u(b, (uint64_t)ports[i]);
        sb_str(b, "\":");
        sb_fmt_u(b, per[i]);
    }
    sb_str(b, "}");
}

static void stats_body(sbuf *b) {
    uint64_t tot_a = 0, tot_s = 0, tot_k = 0, tot_o = 0, mc[MAX_PORTS], inf[MAX_PORTS];
    for (int i = 0; i < n_ports; i++) {
        tot_a += accepted[i];
        tot_o += open_now[i];
        tot_s += served[i];
        tot_k += keys_served[i];
        mc[i] = (uint64_t)max_conc[i];
        inf[i] = (uint64_t)in_flight[i];
    }
    sb_str(b, "{\"ports\":[");
    for (int i = 0; i < n_ports; i++) {
        if (i) sb_str(b, ",");
        sb_fmt_u(b, (uint64_t)ports[i]);
    }
    sb_str(b, "],\"service_ms\":");
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%.6g", (double)delay_ns / 1e6);
    sb_str(b, tmp);
    sb_str(b, ",");
    counter_obj(b, "accepted", accepted, tot_a);
    sb_str(b, ",");
    counter_obj(b, "served", served, tot_s);
    sb_str(b, ",");
    counter_obj(b, "keys", keys_served, tot_k);
    sb_str(b, ",");
    counter_obj(b, "max_concurrent", mc, (uint64_t)max_conc_all);
    sb_str(b, ",");
    counter_obj(b, "in_flight", inf, (uint64_t)in_flight_all);
    sb_str(b, ",");
    counter_obj(b, "open", open_now, tot_o);
    sb_str(b, "}");
}

static void reset_counters(void) {
    for (int i = 0; i < n_ports; i++) {
        accepted[i] = served[i] = keys_served[i] = 0;
        max_conc[i] = in_flight[i];
    }
    max_conc_all = in_flight_all;
}

static slot *answer(conn *c, int status, const char *reason, sbuf *body, int closing,
                    int delayed) {
    size_t len = 0;
    char *r = response(status, reason, body, closing, &len);
    return add_slot(c, r, len, delayed);
}

/* ---- parsing ---------------------------------------------------------------------- */

static const char *find_crlf2(const char *s, size_t n) {
    for (size_t i = 0; i + 3 < n; i++)
        if (s[i] == '\r' && s[i + 1] == '\n' && s[i + 2] == '\r' && s[i + 3] == '\n')
            return s + i;
    return NULL;
}

static void error_answer(conn *c, int status, const char *reason) {
    sbuf body = {0};
    sb_str(&body, "{\"error\":\"");
    sb_str(&body, reason);
    sb_str(&body, "\"}");
    answer(c, status, reason, &body, 1, 0);
    c->close_after = 1;
}

/* Parse and answer every complete request in c->in; returns 0 if c was closed. */
static int conn_parse(conn *c) {
    size_t off = 0;
    int port = ports[c->port_ix];
    while (!c->close_after && off < c->in_len) {
        const char *s = c->in + off;
        size_t n = c->in_len - off;
        const char *end = find_crlf2(s, n < MAX_HEADER ? n : MAX_HEADER);
        if (!end) {
            if (n >= MAX_HEADER) error_answer(c, 431, "Request Header Fields Too Large");
            break;
        }
        size_t head_len = (size_t)(end - s) + 4;
        /* request line */
        const char *line_end = memchr(s, '\r', head_len);
        const char *sp1 = memchr(s, ' ', (size_t)(line_end - s));
        const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(line_end - sp1 - 1)) : NULL;
        if (!sp1 || !sp2 || sp2 + 9 > line_end || memcmp(sp2 + 1, "HTTP/1.", 7) != 0) {
            error_answer(c, 400, "Bad Request");
            break;
        }
        size_t mlen = (size_t)(sp1 - s);
        const char *target = sp1 + 1;
        size_t tlen = (size_t)(sp2 - target);
        int http10 = sp2[8] == '0';
        /* headers */
        long long clen = 0;
        int has_clen = 0, conn_close_hdr = 0, keep_alive_hdr = 0, bad = 0;
        const char *h = line_end + 2;
        while (h < end) {
            const char *he = memchr(h, '\r', (size_t)(end + 2 - h));
            if (!he || he[1] != '\n') {
                bad = 1;
                break;
            }
            const char *colon = memchr(h, ':', (size_t)(he - h));
            if (!colon) {
                bad = 1;
                break;
            }
            size_t nlen = (size_t)(colon - h);
            const char *v = colon + 1;
            while (v < he && (*v == ' ' || *v == '\t')) v++;
            size_t vlen = (size_t)(he - v);
            if (nlen == 14 && !strncasecmp(h, "Content-Length", 14)) {
                if (has_clen || !vlen || vlen > 9) {
                    bad = 1;
                    break;
                }
                clen = 0;
                for (size_t k = 0; k < vlen; k++) {
                    if (v[k] == ' ' || v[k] == '\t') break;
                    if (v[k] < '0' || v[k] > '9') {
                        bad = 1;
                        break;
                    }
                    clen = clen * 10 + (v[k] - '0');
                }
                has_clen = 1;
            } else if (nlen == 17 && !strncasecmp(h, "Transfer-Encoding", 17)) {
                bad = 1; /* chunked bodies are not spoken here */
            } else if (nlen == 10 && !strncasecmp(h, "Connection", 10)) {
                if (vlen >= 5 && !strncasecmp(v, "close", 5)) conn_close_hdr = 1;
                if (vlen >= 10 && !strncasecmp(v, "keep-alive", 10)) keep_alive_hdr = 1;
            }
            if (bad) break;
            h = he + 2;
        }
        if (bad) {
            error_answer(c, 400, "Bad Request");
            break;
        }
        if (clen > MAX_BODY) {
            error_answer(c, 413, "Content Too Large");
            break;
        }
        if (n < head_len + (size_t)clen) break; /* body not all here yet */
        const char *body = s + head_len;
        int closing = conn_close_hdr || (http10 && !keep_alive_hdr);
        off += head_len + (size_t)clen;

        int is_get = mlen == 3 && !memcmp(s, "GET", 3);
        int is_post = mlen == 4 && !memcmp(s, "POST", 4);
        sbuf out = {0};
        if (is_get && tlen == 7 && !memcmp(target, "/_stats", 7)) {
            stats_body(&out);
            answer(c, 200, "OK", &out, closing, 0);
        } else if (is_post && tlen == 7 && !memcmp(target, "/_reset", 7)) {
            reset_counters();
            sb_str(&out, "{\"reset\":true}");
            answer(c, 200, "OK", &out, closing, 0);
        } else if (is_post && tlen == 6 && !memcmp(target, "/batch", 6)) {
            uint64_t count = 0;
            if (!batch_body(&out, body, (size_t)clen, port, &count)) {
                free(out.p);
                error_answer(c, 400, "Bad Request");
                break;
            }
            answer(c, 200, "OK", &out, closing, 1)->keys = count;
        } else if (is_get && tlen > 1 && target[0] == '/' && target[1] != '_') {
            /* the key: the path after '/', up to a '?', %-decoded */
            size_t kl = 1;
            while (kl < tlen && target[kl] != '?') kl++;
            sbuf key = {0};
            int kbad = 0;
            for (size_t k = 1; k < kl; k++) {
                if (target[k] == '%') {
                    int hi = k + 2 < kl ? hexval(target[k + 1]) : -1;
                    int lo = k + 2 < kl ? hexval(target[k + 2]) : -1;
                    if (hi < 0 || lo < 0) {
                        kbad = 1;
                        break;
                    }
                    char ch = (char)(hi * 16 + lo);
                    sb_put(&key, &ch, 1);
                    k += 2;
                } else {
                    sb_put(&key, target + k, 1);
                }
            }
            if (kbad || !key.len) {
                free(key.p);
                error_answer(c, 400, "Bad Request");
                break;
            }
            sbuf esc = {0};
            json_escape(&esc, (const unsigned char *)key.p, key.len);
            key_object(&out, esc.p, esc.len, port);
            free(key.p);
            free(esc.p);
            answer(c, 200, "OK", &out, closing, 1)->keys = 1;
        } else {
            sb_str(&out, "{\"error\":\"Not Found\"}");
            answer(c, 404, "Not Found", &out, closing, 0);
        }
        if (closing) c->close_after = 1;
        if (c->n_slots > MAX_SLOTS) {
            conn_close(c);
            return 0;
        }
    }
    if (off) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    if (c->close_after) set_events(c);
    return conn_flush(c);
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
