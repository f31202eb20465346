/* Runtime API: which architectures each registered kernel was compiled for,
 * read from the fat binaries the libraries register as they load, so that
 * cudaFuncGetAttributes answers as the card would.
 *
 * Why it matters: a library asks a kernel's binaryVersion and ptxVersion to
 * pick the code path the card runs (CUB's radix sort, which PyTorch's
 * embedding backward calls, takes its tuning from them and refuses an
 * architecture it was not built for). PyTorch's wheels carry SASS for a
 * few architectures (sm_75, sm_80, sm_86, sm_90, ...); an L4 (8.9) runs the
 * sm_86 code, so its kernels report 86, not 89.
 *
 * A fat binary is a header (magic 0xBA55ED50, its size) and entries, each
 * a header (kind: 1 PTX, 2 SASS; its size; the architecture at byte 28)
 * and a payload. Only the headers are read, within the sizes they give.
 */
#include "rt_fatbin.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WRAPPER_MAGIC 0x466243b1u
#define FATBIN_MAGIC 0xBA55ED50u
#define ENTRY_PTX 1
#define ENTRY_SASS 2
#define ENTRY_ARCH_AT 28
#define ENTRY_HEADER_MIN 32
/* More entries than any real fat binary holds: a bound on a damaged one. */
#define MAX_ENTRIES 4096
#define MAX_ARCH 255

typedef struct {
    uint64_t sass[4], ptx[4]; /* bit a: compiled for sm_a / compute_a */
} arch_set;

/* nvcc's wrapper around a fat binary (what __cudaRegisterFatBinary gets). */
typedef struct {
    uint32_t magic;
    uint32_t version;
    const unsigned char *data;
    const void *filename_or_fatbins;
} fatbin_wrapper;

struct rt_fatbin {
    arch_set archs;
};

static void add_arch(uint64_t *set, uint32_t arch)
{
    if (arch <= MAX_ARCH) set[arch / 64] |= (uint64_t)1 << (arch % 64);
}

static int has_arch(const uint64_t *set, unsigned arch)
{
    return (set[arch / 64] >> (arch % 64)) & 1;
}

static uint16_t read16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint32_t read32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint64_t read64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The architectures of the fat binary at `data`; none when it is not one. */
static void read_archs(const unsigned char *data, arch_set *out)
{
    if (!data || read32(data) != FATBIN_MAGIC) return;
    uint64_t header = read16(data + 6), size = read64(data + 8);
    uint64_t at = 0;
    for (int n = 0; n < MAX_ENTRIES && at + ENTRY_HEADER_MIN <= size; n++) {
        const unsigned char *entry = data + header + at;
        uint32_t entry_header = read32(entry + 4);
        uint64_t payload = read64(entry + 8);
        if (entry_header < ENTRY_HEADER_MIN || payload > size) break;
        uint16_t kind = read16(entry);
        uint32_t arch = read32(entry + ENTRY_ARCH_AT);
        if (kind == ENTRY_SASS) add_arch(out->sass, arch);
        if (kind == ENTRY_PTX) add_arch(out->ptx, arch);
        at += entry_header + payload;
    }
}

/* ---- kernels: host stub -> its fat binary (open addressing) ----------- */

typedef struct {
    const void *stub;
    rt_fatbin *fatbin;
} kernel_slot;

static pthread_mutex_t kernels_lock = PTHREAD_MUTEX_INITIALIZER;
static kernel_slot *kernels;
static size_t kernels_cap, kernels_used;

static size_t slot_of(const kernel_slot *table, size_t cap, const void *stub)
{
    size_t i = ((uintptr_t)stub >> 4) * 0x9E3779B97F4A7C15ull & (cap - 1);
    while (table[i].stub && table[i].stub != stub) i = (i + 1) & (cap - 1);
    return i;
}

/* Doubles the table (or makes it); 0 when there is no memory for it, and
 * the kernel is then not recorded (it answers with the device's own arch). */
static int grow(void)
{
    size_t cap = kernels_cap ? kernels_cap * 2 : 1u << 14;
    kernel_slot *table = calloc(cap, sizeof *table);
    if (!table) return 0;
    for (size_t i = 0; i < kernels_cap; i++)
        if (kernels[i].stub) table[slot_of(table, cap, kernels[i].stub)] = kernels[i];
    free(kernels);
    kernels = table;
    kernels_cap = cap;
    return 1;
}

rt_fatbin *rt_fatbin_register(const void *wrapper)
{
    rt_fatbin *fb = calloc(1, sizeof *fb);
    const fatbin_wrapper *w = wrapper;
    if (fb && w && w->magic == WRAPPER_MAGIC) read_archs(w->data, &fb->archs);
    return fb; /* kept while the process runs: a kernel may be asked about until then */
}

void rt_fatbin_add_kernel(rt_fatbin *fatbin, const void *stub)
{
    if (!fatbin || !stub) return;
    pthread_mutex_lock(&kernels_lock);
    if ((kernels_used + 1) * 2 <= kernels_cap || grow()) {
        size_t i = slot_of(kernels, kernels_cap, stub);
        if (!kernels[i].stub) kernels_used++;
        kernels[i] = (kernel_slot){stub, fatbin};
    }
    pthread_mutex_unlock(&kernels_lock);
}

static int empty(const uint64_t *set)
{
    return !(set[0] | set[1] | set[2] | set[3]);
}

int rt_fatbin_versions(const void *stub, int major, int minor, int *binary, int *ptx)
{
    unsigned device = (unsigned)(major * 10 + minor);
    arch_set archs = {{0}, {0}};
    pthread_mutex_lock(&kernels_lock);
    if (kernels_cap && stub) {
        const kernel_slot *slot = &kernels[slot_of(kernels, kernels_cap, stub)];
        if (slot->stub) archs = slot->fatbin->archs;
    }
    pthread_mutex_unlock(&kernels_lock);
    *binary = *ptx = (int)device;
    if (empty(archs.sass) && empty(archs.ptx)) return 0; /* not known: as if built for this device */
    /* SASS runs on the architecture it was built for and later minors of
     * its major; PTX is compiled for the device from any earlier version. */
    for (unsigned a = device; a + 1 > (unsigned)major * 10 && device <= MAX_ARCH; a--) {
        if (has_arch(archs.sass, a)) {
            *binary = *ptx = (int)a;
            return 0;
        }
        if (a == 0) break;
    }
    for (unsigned a = device > MAX_ARCH ? MAX_ARCH : device; a > 0; a--) {
        if (has_arch(archs.ptx, a)) {
            *ptx = (int)a;
            return 0;
        }
    }
    return cudaErrorNoKernelImageForDevice;
}
