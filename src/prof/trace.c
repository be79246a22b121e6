/* trace.c: sg_prof_write_trace: a window's records as a Chrome trace-event JSON file, which
 * Perfetto (ui.perfetto.dev) and chrome://tracing open. Host side: process 1, "host", one track
 * per thread holding its named ranges and CUDA calls (nested by time); device side: process
 * 2 + device id, "GPU 0", one track per stream. Written with sg_json (core/json.c), one event a
 * line. Pure C, so it is compiled in every build. */
#include "core/core.h"
#include "prof/prof.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#define TRACE_PID_HOST 1u
#define TRACE_PID_GPU0 2u /* device d is process 2 + d */

/* One event to write: its track, its time and the record it comes from. */
typedef struct trace_event {
    uint32_t pid, tid;
    uint64_t s, e;
    int rank;         /* at equal times: ranges before calls, outer before inner */
    size_t index;
} trace_event;

/* By track, then start; at equal starts the longer first, so that viewers nest correctly. */
static int event_order(const void *a, const void *b)
{
    const trace_event *x = a, *y = b;
    if (x->pid != y->pid) return (x->pid > y->pid) - (x->pid < y->pid);
    if (x->tid != y->tid) return (x->tid > y->tid) - (x->tid < y->tid);
    if (x->s != y->s) return (x->s > y->s) - (x->s < y->s);
    if (x->e != y->e) return (x->e < y->e) - (x->e > y->e);
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static bool on_host(const sg_prof_record *r)
{
    switch (r->kind) {
    case SG_PROF_KIND_API:
    case SG_PROF_KIND_RANGE: return true;
    case SG_PROF_KIND_KERNEL:
    case SG_PROF_KIND_MEMCPY:
    case SG_PROF_KIND_MEMSET: return false;
    }
    return false;
}

static const char *kind_category(sg_prof_kind k)
{
    switch (k) {
    case SG_PROF_KIND_KERNEL: return "kernel";
    case SG_PROF_KIND_MEMCPY: return "memcpy";
    case SG_PROF_KIND_MEMSET: return "memset";
    case SG_PROF_KIND_API: return "cuda_api";
    case SG_PROF_KIND_RANGE: return "range";
    }
    return "?";
}

static const char *api_class_name(sg_prof_api a)
{
    switch (a) {
    case SG_PROF_API_OTHER: return "other";
    case SG_PROF_API_LAUNCH: return "launch";
    case SG_PROF_API_GRAPH_LAUNCH: return "graph launch";
    case SG_PROF_API_MEMCPY: return "memcpy";
    case SG_PROF_API_MEMSET: return "memset";
    case SG_PROF_API_SYNC: return "sync";
    }
    return "?";
}

/* Appends s[0..n) to buf (of cap bytes, holding *len); false when it does not fit. */
static bool put_part(char *buf, size_t cap, size_t *len, const char *s, size_t n)
{
    if (*len + n + 1 > cap) return false;
    memcpy(buf + *len, s, n);
    *len += n;
    buf[*len] = '\0';
    return true;
}

/* A kernel name for display. For an Itanium-mangled name, its qualified name without the
 * parameters, template arguments (and what follows them) shown as "<...>":
 * "_Z11fill_kernelPfmf" -> "fill_kernel", "_ZN7cutlass7Kernel2I...EEvT_" ->
 * "cutlass::Kernel2<...>", "_ZL9my_kernelv" -> "my_kernel". Names it does not follow are
 * shown as given. (Full demangling needs a C++ runtime or libcufilt, which a CUDA install
 * need not have; the mangled name goes into the event's args.) */
static const char *display_name(const char *name, char *buf, size_t cap)
{
    if (strncmp(name, "_Z", 2) != 0) return name;
    const char *p = name + 2;
    size_t len = 0;
    buf[0] = '\0';
    bool nested = *p == 'N';
    if (nested) {
        p++;
        while (*p == 'r' || *p == 'V' || *p == 'K') p++; /* qualifiers of a member */
        if (*p == 'R' || *p == 'O') p++;
    }
    if (p[0] == 'S' && p[1] == 't') { /* std:: */
        if (!put_part(buf, cap, &len, "std::", 5)) return name;
        p += 2;
    }
    for (int part = 0;; part++) {
        if (*p == 'L') p++; /* internal linkage */
        if (!isdigit((unsigned char)*p)) return name;
        char *end;
        unsigned long n = strtoul(p, &end, 10);
        if (n == 0 || strnlen(end, n) < n) return name;
        if (part && !put_part(buf, cap, &len, "::", 2)) return name;
        if (!put_part(buf, cap, &len, end, n)) return name;
        p = end + n;
        if (!nested || *p == 'E' || *p == 'I') break;
    }
    if (*p == 'I' && !put_part(buf, cap, &len, "<...>", 5)) return name;
    return buf;
}

/* A CUDA call's name for display, as profilers show it: CUPTI's name without its version
 * suffix ("cudaLaunchKernel_v7000" -> "cudaLaunchKernel"; "_ptsz" stays). */
static const char *api_display_name(const char *name, char *buf, size_t cap)
{
    const char *v = strrchr(name, '_');
    if (!v || v == name || v[1] != 'v' || !isdigit((unsigned char)v[2])) return name;
    for (const char *d = v + 2; *d; d++)
        if (!isdigit((unsigned char)*d)) return name;
    size_t len = (size_t)(v - name);
    if (len + 1 > cap) return name;
    memcpy(buf, name, len);
    buf[len] = '\0';
    return buf;
}

/* Microseconds from t0 with nanosecond digits. Exact: ns / 1e3 is within half an ulp of the
 * three-decimal value, and printing it rounds back to that value, for any time below 2^53 ns
 * (104 days). */
static void put_us(sg_json *w, const char *key, uint64_t ns)
{
    sg_json_key(w, key);
    sg_json_fixed(w, (double)ns / 1e3, 3);
}

static void put_uint(sg_json *w, const char *key, uint64_t v)
{
    sg_json_key(w, key);
    sg_json_uint(w, v);
}

static void put_str(sg_json *w, const char *key, const char *v)
{
    sg_json_key(w, key);
    sg_json_string(w, v);
}

static void put_event(sg_json *w, const sg_prof_record *r, const trace_event *ev, uint64_t t0)
{
    char buf[256];
    const char *name = r->name;
    if (!name) name = r->kind == SG_PROF_KIND_API ? "(unnamed CUDA call)" : "(unnamed)";
    const char *shown = r->kind == SG_PROF_KIND_KERNEL ? display_name(name, buf, sizeof buf)
                        : r->kind == SG_PROF_KIND_API  ? api_display_name(name, buf, sizeof buf)
                                                       : name;
    sg_json_newline(w);
    sg_json_object_begin(w);
    put_str(w, "name", shown);
    put_str(w, "cat", kind_category(r->kind));
    put_str(w, "ph", "X");
    put_us(w, "ts", ev->s - t0);
    put_us(w, "dur", ev->e - ev->s);
    put_uint(w, "pid", ev->pid);
    put_uint(w, "tid", ev->tid);
    sg_json_key(w, "args");
    sg_json_object_begin(w);
    switch (r->kind) {
    case SG_PROF_KIND_KERNEL:
    case SG_PROF_KIND_MEMCPY:
    case SG_PROF_KIND_MEMSET:
        put_uint(w, "correlation", r->correlation_id);
        put_uint(w, "device", r->device_id);
        put_uint(w, "stream", r->stream_id);
        if (r->graph_id) put_uint(w, "graph", r->graph_id);
        if (shown != name) put_str(w, "mangled", name);
        break;
    case SG_PROF_KIND_API:
        put_uint(w, "correlation", r->correlation_id);
        put_str(w, "class", api_class_name(r->api));
        sg_json_key(w, "depth");
        sg_json_int(w, r->depth);
        break;
    case SG_PROF_KIND_RANGE:
        sg_json_key(w, "depth");
        sg_json_int(w, r->depth);
        break;
    }
    sg_json_object_end(w);
    sg_json_object_end(w);
}

/* A metadata event ("ph": "M") naming a track: {"name": what, ..., "args": {key: value}}. */
static void put_meta(sg_json *w, const char *what, uint32_t pid, uint32_t tid, const char *key,
                     const char *value, uint64_t number)
{
    sg_json_newline(w);
    sg_json_object_begin(w);
    put_str(w, "name", what);
    put_str(w, "ph", "M");
    put_uint(w, "pid", pid);
    put_uint(w, "tid", tid);
    sg_json_key(w, "args");
    sg_json_object_begin(w);
    if (value) put_str(w, key, value);
    else put_uint(w, key, number);
    sg_json_object_end(w);
    sg_json_object_end(w);
}

/* Names the tracks that events use: a process per side (and device), a thread per track. */
static void put_metadata(sg_json *w, const trace_event *ev, size_t n)
{
    char name[48];
    for (size_t i = 0; i < n; i++) {
        bool new_pid = i == 0 || ev[i].pid != ev[i - 1].pid;
        if (new_pid) {
            if (ev[i].pid == TRACE_PID_HOST) snprintf(name, sizeof name, "host");
            else snprintf(name, sizeof name, "GPU %u", ev[i].pid - TRACE_PID_GPU0);
            put_meta(w, "process_name", ev[i].pid, 0, "name", name, 0);
            put_meta(w, "process_sort_index", ev[i].pid, 0, "sort_index", NULL, ev[i].pid);
        }
        if (new_pid || ev[i].tid != ev[i - 1].tid) {
            snprintf(name, sizeof name, "%s %u", ev[i].pid == TRACE_PID_HOST ? "thread" : "stream", ev[i].tid);
            put_meta(w, "thread_name", ev[i].pid, ev[i].tid, "name", name, 0);
        }
    }
}

sg_status sg_prof_write_trace(sg_ctx *ctx, const sg_prof_record *r, size_t n, const char *path)
{
    if (!path) return sg_fail(ctx, SG_ERR_NULL, "sg_prof_write_trace: path is NULL");
    if (n && !r) return sg_fail(ctx, SG_ERR_NULL, "sg_prof_write_trace: records are NULL");
    /* Untimed records (CUPTI could not time them) have no place on a timeline. */
    trace_event *ev = malloc((n ? n : 1) * sizeof *ev);
    if (!ev)
        return sg_fail(ctx, SG_ERR_OOM, "sg_prof_write_trace: out of host memory (%zu records)", n);
    size_t m = 0;
    uint64_t t0 = UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        if ((r[i].start_ns == 0 && r[i].end_ns == 0) || r[i].end_ns < r[i].start_ns) continue;
        bool host = on_host(&r[i]);
        int rank = r[i].kind == SG_PROF_KIND_RANGE ? r[i].depth : 1000 + r[i].depth;
        ev[m++] = (trace_event){host ? TRACE_PID_HOST : TRACE_PID_GPU0 + r[i].device_id,
                                host ? r[i].thread_id : r[i].stream_id, r[i].start_ns, r[i].end_ns,
                                rank, i};
        if (r[i].start_ns < t0) t0 = r[i].start_ns;
    }
    qsort(ev, m, sizeof *ev, event_order);
    FILE *f = fopen(path, "w");
    if (!f) {
        int err = errno;
        free(ev);
        return sg_fail(ctx, SG_ERR_IO, "sg_prof_write_trace: cannot open '%s' for writing: %s",
                       path, strerror(err));
    }
    sg_json *w = NULL;
    sg_status st = sg_json_create_file(f, SG_JSON_COMPACT, &w);
    if (st == SG_OK) {
        sg_json_object_begin(w);
        put_str(w, "displayTimeUnit", "ns");
        sg_json_key(w, "traceEvents");
        sg_json_array_begin(w);
        put_metadata(w, ev, m);
        for (size_t i = 0; i < m; i++) put_event(w, &r[ev[i].index], &ev[i], t0);
        sg_json_newline(w);
        sg_json_array_end(w);
        sg_json_object_end(w);
        sg_json_newline(w);
        st = sg_json_finish(w);
    }
    free(ev);
    int err = st == SG_ERR_OOM ? ENOMEM : st != SG_OK || ferror(f) ? EIO : 0;
    sg_json_destroy(w);
    if (fclose(f) != 0 && !err) err = errno;
    if (err) {
        remove(path); /* no half-written trace left behind */
        return sg_fail(ctx, SG_ERR_IO, "sg_prof_write_trace: writing '%s' failed: %s", path,
                       strerror(err));
    }
    return SG_OK;
}
