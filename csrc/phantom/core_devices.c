/* The fake devices: how many, their memory and compute capability (from
 * the environment, read once on first use), and their primary contexts.
 *
 *   VG_FAKECUDA_DEVICES=2              number of devices (default: one per
 *                                      VG_FAKECUDA_MEM entry, else 1; 0 = none)
 *   VG_FAKECUDA_MEM=1GiB,512MiB        each device's memory; the last entry
 *                                      repeats (default 16GiB)
 *   VG_FAKECUDA_CC=9.0                 compute capability (default 9.0)
 *   VG_FAKECUDA_NAME="..."             device name
 *   VG_FAKECUDA_SMS=132                multiprocessor count (default 132)
 *   VG_FAKECUDA_L2=4MiB                L2 cache size (default 50MiB, an
 *                                      H100's): Inductor's benchmarks
 *                                      allocate a buffer of this size to
 *                                      flush it, so it is device memory
 *                                      a compiled program's peak can hold
 *   VG_FAKECUDA_CONTEXT=0              device memory the CUDA context takes
 *                                      on each device from the start, so that
 *                                      free memory reads as on a real card
 *                                      (default 0: tests assert exact bytes)
 *   VG_FAKECUDA_PHANTOM=1              the phantom GPU: device memory has no
 *                                      host pages (core_memory.c)
 *
 * A malformed value aborts with a message: a test that silently ran on a
 * different device than it asked for would prove nothing.
 */
#include "core.h"

#include <cuda.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_MEM (16ull << 30)
#define DEFAULT_L2 ((size_t)50 << 20)

struct CUctx_st {
    int device;
};

static struct {
    int count;
    size_t capacity[VGFC_MAX_DEVICES];
    size_t context, l2;
    int cc_major, cc_minor, sm_count, phantom;
    char name[256];
} cfg;

static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static struct CUctx_st primary[VGFC_MAX_DEVICES];
static int ctx_refs[VGFC_MAX_DEVICES];
static int runtime_retained[VGFC_MAX_DEVICES];
static _Thread_local struct CUctx_st *current;

static void config_error(const char *var, const char *value, const char *why)
{
    fprintf(stderr, "vg_fakecuda: %s=\"%s\": %s\n", var, value, why);
    abort();
}

/* "512MiB", "1GiB", "16G", "1048576": bytes, units in powers of 1024. */
static int parse_size(const char *text, size_t *out)
{
    static const struct { const char *suffix; unsigned shift; } units[] = {
        {"", 0}, {"B", 0}, {"K", 10}, {"KiB", 10}, {"M", 20}, {"MiB", 20},
        {"G", 30}, {"GiB", 30}, {"T", 40}, {"TiB", 40},
    };
    char *end;
    errno = 0;
    unsigned long long n = strtoull(text, &end, 10);
    if (end == text || errno || *text == '-')
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            if (units[i].shift && n > (~0ull >> units[i].shift))
                return -1;
            *out = (size_t)(n << units[i].shift);
            return 0;
        }
    }
    return -1;
}

/* Fills capacity[] from the comma-separated list; returns its length. */
static int parse_mem_list(const char *list)
{
    char buf[512];
    if (strlen(list) >= sizeof buf)
        config_error("VG_FAKECUDA_MEM", list, "too long");
    strcpy(buf, list);
    int n = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == VGFC_MAX_DEVICES)
            config_error("VG_FAKECUDA_MEM", list, "more entries than devices the fake supports (16)");
        if (parse_size(tok, &cfg.capacity[n]) != 0)
            config_error("VG_FAKECUDA_MEM", list,
                         "want sizes like 1GiB,512MiB (units B K KiB M MiB G GiB T TiB)");
        n++;
    }
    if (n == 0)
        config_error("VG_FAKECUDA_MEM", list, "no sizes");
    return n;
}

static void read_config(void)
{
    const char *mem = getenv("VG_FAKECUDA_MEM");
    const char *devices = getenv("VG_FAKECUDA_DEVICES");
    const char *cc = getenv("VG_FAKECUDA_CC");
    const char *name = getenv("VG_FAKECUDA_NAME");
    const char *sms = getenv("VG_FAKECUDA_SMS");
    const char *context = getenv("VG_FAKECUDA_CONTEXT");
    const char *phantom = getenv("VG_FAKECUDA_PHANTOM");
    const char *l2 = getenv("VG_FAKECUDA_L2");

    int listed = 1;
    cfg.capacity[0] = DEFAULT_MEM;
    if (mem && *mem)
        listed = parse_mem_list(mem);
    cfg.count = listed;
    if (devices && *devices) {
        char *end;
        long n = strtol(devices, &end, 10);
        if (*end || n < 0 || n > VGFC_MAX_DEVICES)
            config_error("VG_FAKECUDA_DEVICES", devices, "want 0 to 16");
        cfg.count = (int)n;
    }
    for (int i = listed; i < VGFC_MAX_DEVICES; i++)
        cfg.capacity[i] = cfg.capacity[listed - 1];

    cfg.cc_major = 9;
    cfg.cc_minor = 0;
    if (cc && *cc) {
        char dot, extra;
        if (sscanf(cc, "%d%c%d%c", &cfg.cc_major, &dot, &cfg.cc_minor, &extra) != 3 || dot != '.' ||
            cfg.cc_major < 1 || cfg.cc_minor < 0 || cfg.cc_minor > 9)
            config_error("VG_FAKECUDA_CC", cc, "want major.minor, like 8.6");
    }
    snprintf(cfg.name, sizeof cfg.name, "%s", name && *name ? name : "vramguard fake GPU");
    cfg.sm_count = 132;
    if (sms && *sms) {
        char *end;
        long n = strtol(sms, &end, 10);
        if (*end || n < 1 || n > 1024)
            config_error("VG_FAKECUDA_SMS", sms, "want 1 to 1024");
        cfg.sm_count = (int)n;
    }
    if (context && *context && parse_size(context, &cfg.context) != 0)
        config_error("VG_FAKECUDA_CONTEXT", context, "want a size like 400MiB");
    cfg.l2 = DEFAULT_L2;
    /* the attribute is an int: at most 1 GiB, far above any card's */
    if (l2 && *l2 && (parse_size(l2, &cfg.l2) != 0 || cfg.l2 == 0 || cfg.l2 > (1u << 30)))
        config_error("VG_FAKECUDA_L2", l2, "want a size from 1 byte to 1GiB, like 4MiB");
    if (phantom && *phantom) {
        if (strcmp(phantom, "0") != 0 && strcmp(phantom, "1") != 0)
            config_error("VG_FAKECUDA_PHANTOM", phantom, "want 0 or 1");
        cfg.phantom = phantom[0] == '1';
    }
    for (int i = 0; i < VGFC_MAX_DEVICES; i++)
        primary[i].device = i;
}

static void config(void)
{
    pthread_once(&cfg_once, read_config);
}

int vgfc_device_count(void)
{
    config();
    return cfg.count;
}

int vgfc_valid_device(int dev)
{
    return dev >= 0 && dev < vgfc_device_count();
}

size_t vgfc_capacity(int dev)
{
    config();
    return vgfc_valid_device(dev) ? __atomic_load_n(&cfg.capacity[dev], __ATOMIC_RELAXED) : 0;
}

int vg_fakecuda_set_capacity(int dev, long long bytes)
{
    if (!vgfc_valid_device(dev) || bytes < 0)
        return -1;
    __atomic_store_n(&cfg.capacity[dev], (size_t)bytes, __ATOMIC_RELAXED);
    return 0;
}

long long vg_fakecuda_capacity(int dev)
{
    return vgfc_valid_device(dev) ? (long long)vgfc_capacity(dev) : -1;
}

int vg_fakecuda_device_count(void)
{
    return vgfc_device_count();
}

int vgfc_cc_major(void)
{
    config();
    return cfg.cc_major;
}

int vgfc_cc_minor(void)
{
    config();
    return cfg.cc_minor;
}

int vgfc_sm_count(void)
{
    config();
    return cfg.sm_count;
}

int vgfc_phantom(void)
{
    config();
    return cfg.phantom;
}

size_t vgfc_context_bytes(void)
{
    config();
    return cfg.context;
}

int vgfc_l2_bytes(void)
{
    config();
    return (int)cfg.l2;
}

const char *vgfc_device_name(void)
{
    config();
    return cfg.name;
}

/* The driver is as new as the headers the fake was built from: the
 * runtime never finds it too old. */
int vgfc_driver_version(void)
{
    return CUDA_VERSION;
}

/* Recognisable in nvidia-smi style listings: "vgfakecu" then the ordinal. */
void vgfc_device_uuid(int dev, unsigned char uuid[16])
{
    static const char tag[] = "vgfakecu";
    memset(uuid, 0, 16);
    memcpy(uuid, tag, 8);
    uuid[15] = (unsigned char)dev;
}

/* Device n sits on PCI bus n + 1, domain 0, device 0. */
int vgfc_pci_bus(int dev)
{
    return dev + 1;
}

/* ---- contexts ---------------------------------------------------------- */

struct CUctx_st *vgfc_primary_ctx(int dev)
{
    return vgfc_valid_device(dev) ? &primary[dev] : NULL;
}

int vgfc_ctx_device(const struct CUctx_st *ctx)
{
    if (ctx < primary || ctx >= primary + vgfc_device_count())
        return -1;
    return ctx->device;
}

struct CUctx_st *vgfc_current_ctx(void)
{
    return current;
}

void vgfc_set_current_ctx(struct CUctx_st *ctx)
{
    current = ctx;
}

int vgfc_current_device(void)
{
    return current ? current->device : 0;
}

void vgfc_ctx_retain(int dev)
{
    pthread_mutex_lock(&ctx_lock);
    ctx_refs[dev]++;
    pthread_mutex_unlock(&ctx_lock);
}

int vgfc_ctx_release(int dev)
{
    int err = VGFC_SUCCESS;
    pthread_mutex_lock(&ctx_lock);
    if (ctx_refs[dev] > 0)
        ctx_refs[dev]--;
    else
        err = VGFC_INVALID_VALUE;
    pthread_mutex_unlock(&ctx_lock);
    return err;
}

int vgfc_ctx_active(int dev)
{
    pthread_mutex_lock(&ctx_lock);
    int active = ctx_refs[dev] > 0;
    pthread_mutex_unlock(&ctx_lock);
    return active;
}

/* Every runtime call on the device comes here: the lock only the first time. */
void vgfc_use_device(int dev)
{
    if (!__atomic_load_n(&runtime_retained[dev], __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&ctx_lock);
        if (!runtime_retained[dev]) {
            ctx_refs[dev]++;
            __atomic_store_n(&runtime_retained[dev], 1, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&ctx_lock);
    }
    current = &primary[dev];
}

double vgfc_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* For the knobs the cuBLAS stand-in reads itself (cublas.c). */
int vgfc_parse_size(const char *text, size_t *out)
{
    return parse_size(text, out);
}
