/*
 * podserver.h: what the pod server's two parts share (see podserver.c for what it does).
 *
 * podserver.c      the process: arguments, listening sockets, the epoll loop, the timer
 *                  queue, connections and their ordered answer queues;
 * podserver_http.c HTTP/1.1: parsing requests, building the answers (keys, batches,
 *                  the counters' JSON).
 */
#ifndef PODSERVER_H
#define PODSERVER_H

#include <stddef.h>
#include <stdint.h>

#define MAX_PORTS 64
#define MAX_HEADER (16 * 1024)
#define MAX_BODY (1024 * 1024)
#define MAX_IN (MAX_HEADER + MAX_BODY)
#define MAX_SLOTS 4096
#define MAX_OUT (16 * 1024 * 1024)

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

typedef struct {
    char *p;
    size_t len, cap;
} sbuf;

/* ---- state shared by the loop and the HTTP side (defined in podserver.c) ---------- */

extern int n_ports;
extern int ports[MAX_PORTS];
extern uint64_t accepted[MAX_PORTS], served[MAX_PORTS], keys_served[MAX_PORTS];
extern uint64_t open_now[MAX_PORTS];
extern int64_t in_flight[MAX_PORTS], max_conc[MAX_PORTS];
extern int64_t in_flight_all, max_conc_all;
extern uint64_t delay_ns;
extern int with_reports;

/* podserver.c: memory, the connection's answer queue, closing and writing. */
void *xrealloc(void *p, size_t n);
slot *add_slot(conn *c, char *data, size_t len, int delayed);
void conn_close(conn *c);
void set_events(conn *c);
int conn_flush(conn *c);

/* podserver_http.c: parse and answer every complete request in c->in; 0 if c was closed. */
int conn_parse(conn *c);

#endif
