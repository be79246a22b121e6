/* trace.c: sg_prof_write_trace: a window's records as a Chrome trace-event JSON file, which
 * Perfetto (ui.perfetto.dev) and chrome://tracing open. Host side: process 1, "host", one track
 * per thread holding its named ranges and CUDA calls (nested by time); device side: process
 * 2 + device id, "GPU 0", one track per stream. Pure C, so it is compiled in every build. */
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

/* Length of the valid UTF-8 sequence at u, or 0 (Unicode's table 3-7: no overlong forms, no
 * surrogates, nothing past U+10FFFF), so that every name is valid JSON text. */
static size_t utf8_len(const unsigned char *u)
{
    unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
    size_t n;
    if (u[0] >= 0xC2 && u[0] <= 0xDF) {
        n = 2;
    } else if (u[0] >= 0xE0 && u[0] <= 0xEF) {
        n = 3;
        if (u[0] == 0xE0) lo = 0xA0; /* not overlong */
        if (u[0] == 0xED) hi = 0x9F; /* not a surrogate */
    } else if (u[0] >= 0xF0 && u[0] <= 0xF4) {
        n = 4;
        if (u[0] == 0xF0) lo = 0x90; /* not overlong */
        if (u[0] == 0xF4) hi = 0x8F; /* not past U+10FFFF */
    } else {
        return 0;
    }
    if (u[1] < lo || u[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (u[i] < 0x80 || u[i] > 0xBF) return 0;
    return n;
}

/* s as a JSON string: quotes, backslashes and control characters escaped, bytes that are not
 * UTF-8 written as U+FFFD. */
static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *u = (const unsigned char *)s; *u;) {
        if (*u == '"' || *u == '\\') {
            fputc('\\', f);
            fputc(*u++, f);
        } else if (*u == '\n') {
            fputs("\\n", f), u++;
        } else if (*u == '\t') {
            fputs("\\t", f), u++;
        } else if (*u < 0x20) {
            fprintf(f, "\\u%04x", *u++);
        } else if (*u < 0x80) {
            fputc(*u++, f);
        } else {
            size_t n = utf8_len(u);
            if (n) fwrite(u, 1, n, f), u += n;
            else fputs("\\ufffd", f), u++;
        }
    }
    fputc('"', f);
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

/* Microseconds from t0 with nanosecond digits, exactly (no rounding through a double). */
static void put_us(FILE *f, uint64_t ns)
{
    fprintf(f, "%llu.%03u", (unsigned long long)(ns / 1000), (unsigned)(ns % 1000));
}

static void put_event(FILE *f, const sg_prof_record *r, const trace_event *ev, uint64_t t0)
{
    char buf[256];
    const char *name = r->name;
    if (!name) name = r->kind == SG_PROF_KIND_API ? "(unnamed CUDA call)" : "(unnamed)";
    const char *shown = r->kind == SG_PROF_KIND_KERNEL ? display_name(name, buf, sizeof buf)
                        : r->kind == SG_PROF_KIND_API  ? api_display_name(name, buf, sizeof buf)
                                                       : name;
    fputs(",\n{\"name\":", f);
    put_string(f, shown);
    fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":", kind_category(r->kind));
    put_us(f, ev->s - t0);
    fputs(",\"dur\":", f);
    put_us(f, ev->e - ev->s);
    fprintf(f, ",\"pid\":%u,\"tid\":%u,\"args\":{", ev->pid, ev->tid);
    switch (r->kind) {
    case SG_PROF_KIND_KERNEL:
    case SG_PROF_KIND_MEMCPY:
    case SG_PROF_KIND_MEMSET:
        fprintf(f, "\"correlation\":%u,\"device\":%u,\"stream\":%u", r->correlation_id,
                r->device_id, r->stream_id);
        if (r->graph_id) fprintf(f, ",\"graph\":%u", r->graph_id);
        if (shown != name) {
            fputs(",\"mangled\":", f);
            put_string(f, name);
        }
        break;
    case SG_PROF_KIND_API:
        fprintf(f, "\"correlation\":%u,\"class\":\"%s\",\"depth\":%d", r->correlation_id,
                api_class_name(r->api), r->depth);
        break;
    case SG_PROF_KIND_RANGE: fprintf(f, "\"depth\":%d", r->depth); break;
    }
    fputs("}}", f);
}

/* Names the tracks that events use: a process per side (and device), a thread per track. */
static void put_metadata(FILE *f, const trace_event *ev, size_t n, bool *first)
{
    for (size_t i = 0; i < n; i++) {
        bool new_pid = i == 0 || ev[i].pid != ev[i - 1].pid;
        if (new_pid) {
            fputs(*first ? "\n" : ",\n", f);
            *first = false;
            if (ev[i].pid == TRACE_PID_HOST)
                fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,"
                           "\"args\":{\"name\":\"host\"}}", ev[i].pid);
            else
                fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,"
                           "\"args\":{\"name\":\"GPU %u\"}}",
                        ev[i].pid, ev[i].pid - TRACE_PID_GPU0);
            fprintf(f, ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,"
                       "\"args\":{\"sort_index\":%u}}", ev[i].pid, ev[i].pid);
        }
        if (new_pid || ev[i].tid != ev[i - 1].tid)
            fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":%u,"
                       "\"args\":{\"name\":\"%s %u\"}}", ev[i].pid, ev[i].tid,
                    ev[i].pid == TRACE_PID_HOST ? "thread" : "stream", ev[i].tid);
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
    fputs("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[", f);
    bool first = true;
    put_metadata(f, ev, m, &first);
    for (size_t i = 0; i < m; i++) put_event(f, &r[ev[i].index], &ev[i], t0);
    fputs("\n]}\n", f);
    free(ev);
    int err = ferror(f) ? EIO : 0;
    if (fclose(f) != 0 && !err) err = errno;
    if (err) {
        remove(path); /* no half-written trace left behind */
        return sg_fail(ctx, SG_ERR_IO, "sg_prof_write_trace: writing '%s' failed: %s", path,
                       strerror(err));
    }
    return SG_OK;
}
