/* What tests turn: per-function call counters, injected faults, a sticky
 * error, tracing. Every faked function passes through vgfc_enter first,
 * every stub through vgfc_unsupported.
 *
 * From the environment, for faults that must hit while PyTorch starts up,
 * before a test could reach the C functions:
 *
 *   VG_FAKECUDA_FAIL=cudaMalloc:3:2,cudaFree:1:cudaErrorIllegalAddress:-1
 *                         api:nth:code[:count], as vg_fakecuda_fail_calls
 *   VG_FAKECUDA_STICKY=700    a sticky error from the start
 *   VG_FAKECUDA_TRACE=1       every call, and every error returned, on stderr
 */
#include "core.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    int sticky;
} apis[VGFC_API_COUNT] = {
#define VGFC_API_ENTRY(name, sticky) {#name, sticky},
    VGFC_RUNTIME_APIS(VGFC_API_ENTRY)
    VGFC_DRIVER_APIS(VGFC_API_ENTRY)
#undef VGFC_API_ENTRY
};

struct fault {
    long skip;      /* calls still to pass before the first failure */
    long remaining; /* failures still to give; < 0: no end */
    int code;       /* 0: no fault pending */
};

static long calls[VGFC_API_COUNT];
static struct fault faults[VGFC_API_COUNT];
static int faults_pending; /* lets calls skip the lock when no fault is set */
static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;
static int sticky;
static int tracing;
static long unsupported;
static char last_unsupported[128];
static pthread_mutex_t unsupported_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static int api_index(const char *name)
{
    for (int i = 0; i < VGFC_API_COUNT; i++)
        if (name && strcmp(apis[i].name, name) == 0)
            return i;
    return -1;
}

static int set_fault(const char *api, long nth, long count, int code);

static void env_error(const char *var, const char *value, const char *why)
{
    fprintf(stderr, "vg_fakecuda: %s=\"%s\": %s\n", var, value, why);
    abort();
}

/* One "api:nth:code[:count]" entry of VG_FAKECUDA_FAIL. */
static void parse_fault(char *spec, const char *whole)
{
    char *fields[4] = {0};
    int n = 0;
    for (char *save, *tok = strtok_r(spec, ":", &save); tok && n < 4; tok = strtok_r(NULL, ":", &save))
        fields[n++] = tok;
    if (n < 3)
        env_error("VG_FAKECUDA_FAIL", whole, "want api:nth:code[:count], comma-separated");
    char *end;
    long nth = strtol(fields[1], &end, 10);
    long count = n == 4 ? strtol(fields[3], &end, 10) : 1;
    int code = vgfc_parse_error(fields[2]);
    if (code <= 0)
        env_error("VG_FAKECUDA_FAIL", whole, "the code is neither a number nor an error name");
    if (set_fault(fields[0], nth, count, code) != 0)
        env_error("VG_FAKECUDA_FAIL", whole, "unknown function (see csrc/phantom/apis.h) or nth < 1");
}

static void read_env(void)
{
    const char *trace = getenv("VG_FAKECUDA_TRACE");
    tracing = trace && *trace && strcmp(trace, "0") != 0;
    const char *stick = getenv("VG_FAKECUDA_STICKY");
    if (stick && *stick) {
        int code = vgfc_parse_error(stick);
        if (code < 0)
            env_error("VG_FAKECUDA_STICKY", stick, "neither a number nor an error name");
        vg_fakecuda_set_sticky_error(code);
    }
    const char *fail = getenv("VG_FAKECUDA_FAIL");
    if (fail && *fail) {
        char buf[1024];
        if (strlen(fail) >= sizeof buf)
            env_error("VG_FAKECUDA_FAIL", fail, "too long");
        strcpy(buf, fail);
        for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            parse_fault(tok, fail);
    }
}

int vgfc_tracing(void)
{
    pthread_once(&env_once, read_env);
    return tracing;
}

void vgfc_trace(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "vg_fakecuda: %s\n", line);
}

/* The injected fault's code if this call is one to fail, else 0. */
static int take_fault(int api)
{
    int code = 0;
    pthread_mutex_lock(&fault_lock);
    struct fault *f = &faults[api];
    if (f->code) {
        if (f->skip > 0) {
            f->skip--;
        } else {
            code = f->code;
            if (f->remaining > 0 && --f->remaining == 0) {
                f->code = 0;
                __atomic_sub_fetch(&faults_pending, 1, __ATOMIC_RELAXED);
            }
        }
    }
    pthread_mutex_unlock(&fault_lock);
    return code;
}

int vgfc_enter(enum vgfc_api api)
{
    if (vgfc_tracing())
        vgfc_trace("%s", apis[api].name);
    __atomic_add_fetch(&calls[api], 1, __ATOMIC_RELAXED);
    int code = __atomic_load_n(&sticky, __ATOMIC_RELAXED);
    if (code && apis[api].sticky)
        return code;
    if (__atomic_load_n(&faults_pending, __ATOMIC_RELAXED))
        return take_fault(api);
    return 0;
}

/* The stubs a phantom has named on stderr already: a user's dry run that
 * fails in a call no one modelled must say which call, once (PyTorch's own
 * message is only "operation not supported"). The names are the stubs'
 * string literals, so a pointer compares them; past the table's size,
 * every later stub is still counted, only not named again. */
#define NAMED_STUBS 64
static const char *named[NAMED_STUBS];
static int nnamed;

/* 1 when `name` is named for the first time (callers hold unsupported_lock). */
static int first_naming(const char *name)
{
    for (int i = 0; i < nnamed; i++)
        if (named[i] == name)
            return 0;
    if (nnamed < NAMED_STUBS)
        named[nnamed++] = name;
    return 1;
}

int vgfc_unsupported(const char *name)
{
    if (vgfc_tracing())
        vgfc_trace("%s: not supported by the fake", name);
    pthread_mutex_lock(&unsupported_lock);
    unsupported++;
    snprintf(last_unsupported, sizeof last_unsupported, "%s", name);
    int say = vgfc_phantom() && first_naming(name);
    pthread_mutex_unlock(&unsupported_lock);
    if (say)
        fprintf(stderr, "vramguard phantom GPU: %s is not modelled; it returns \"operation not "
                        "supported\" (the error that follows comes from it)\n", name);
    int code = __atomic_load_n(&sticky, __ATOMIC_RELAXED);
    return code ? code : VGFC_NOT_SUPPORTED;
}

/* ---- the knobs --------------------------------------------------------- */

static int set_fault(const char *api, long nth, long count, int code)
{
    int i = api_index(api);
    if (i < 0 || nth < 1 || code == 0 || count == 0)
        return -1;
    pthread_mutex_lock(&fault_lock);
    if (!faults[i].code)
        __atomic_add_fetch(&faults_pending, 1, __ATOMIC_RELAXED);
    faults[i] = (struct fault){nth - 1, count, code};
    pthread_mutex_unlock(&fault_lock);
    return 0;
}

/* The environment's faults are read first, so they cannot later replace
 * this one. */
int vg_fakecuda_fail_calls(const char *api, long nth, long count, int code)
{
    pthread_once(&env_once, read_env);
    return set_fault(api, nth, count, code);
}

int vg_fakecuda_fail_call(const char *api, long nth, int code)
{
    return vg_fakecuda_fail_calls(api, nth, 1, code);
}

int vg_fakecuda_fail_malloc(long nth, int code)
{
    return vg_fakecuda_fail_calls("cudaMalloc", nth, 1, code);
}

void vg_fakecuda_set_sticky_error(int code)
{
    __atomic_store_n(&sticky, code, __ATOMIC_RELAXED);
}

int vg_fakecuda_sticky_error(void)
{
    return __atomic_load_n(&sticky, __ATOMIC_RELAXED);
}

long vg_fakecuda_calls(const char *api)
{
    int i = api_index(api);
    return i < 0 ? -1 : __atomic_load_n(&calls[i], __ATOMIC_RELAXED);
}

long vg_fakecuda_malloc_calls(void)
{
    return vg_fakecuda_calls("cudaMalloc");
}

long vg_fakecuda_free_calls(void)
{
    return vg_fakecuda_calls("cudaFree");
}

long vg_fakecuda_unsupported_calls(void)
{
    pthread_mutex_lock(&unsupported_lock);
    long n = unsupported;
    pthread_mutex_unlock(&unsupported_lock);
    return n;
}

const char *vg_fakecuda_last_unsupported(void)
{
    return last_unsupported; /* a test reads it between calls */
}

void vg_fakecuda_reset(void)
{
    pthread_once(&env_once, read_env); /* a later first call must not re-arm the env's faults */
    pthread_mutex_lock(&fault_lock);
    memset(faults, 0, sizeof faults);
    __atomic_store_n(&faults_pending, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&fault_lock);
    for (int i = 0; i < VGFC_API_COUNT; i++)
        __atomic_store_n(&calls[i], 0, __ATOMIC_RELAXED);
    vg_fakecuda_set_sticky_error(0);
    pthread_mutex_lock(&unsupported_lock);
    unsupported = 0;
    last_unsupported[0] = 0;
    pthread_mutex_unlock(&unsupported_lock);
    vgfc_mem_reset_peaks();
    vgfc_work_reset();
}
