/*
 * podserver_http.c: the pod server's HTTP/1.1 side (see podserver.c for the protocol):
 * requests parsed from a connection's input, answers built and queued on it in request
 * order, delayed ones (keys, batches) by the service time, the counters' ones at once.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "podserver.h"

/* ---- building answers ------------------------------------------------------------- */

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
int conn_parse(conn *c) {
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
