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
 *
 * Each fat binary also knows the shared object that registered it (dladdr
 * on nvcc's wrapper, which lives in that object's data), and each library
 * counts the launches of its kernels: a dry run names the extensions whose
 * kernels ran (bitsandbytes' when a script quantizes, not when it merely
 * imports it), read through the vg_fakecuda_kernel_library* knobs.
 */
#include "rt_fatbin.h"

#include <dlfcn.h>
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

/* A shared object that registered fat binaries, and its kernels' launches. */
typedef struct {
    char *path; /* dladdr's name for it; "" when it has none */
    long launches;
    long kernels_launched; /* distinct kernels launched at least once */
} library;

struct rt_fatbin {
    arch_set archs;
    int library; /* index in libraries, -1 when unknown */
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
    long launches;
} kernel_slot;

/* Guards the kernels and the libraries. */
static pthread_mutex_t kernels_lock = PTHREAD_MUTEX_INITIALIZER;
static kernel_slot *kernels;
static size_t kernels_cap, kernels_used;

/* More libraries than a process loads with kernels: past it, a fat binary's
 * launches are not attributed. */
#define MAX_LIBRARIES 256
static library libraries[MAX_LIBRARIES];
static int nlibraries;

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

/* The index of the library named `path`, added on first sight; -1 when
 * the table or memory is full. Callers hold kernels_lock. */
static int library_index(const char *path)
{
    for (int i = 0; i < nlibraries; i++)
        if (strcmp(libraries[i].path, path) == 0) return i;
    if (nlibraries == MAX_LIBRARIES) return -1;
    char *copy = strdup(path);
    if (!copy) return -1;
    libraries[nlibraries] = (library){copy, 0, 0};
    return nlibraries++;
}

/* The shared object whose memory holds `address` ("" when none does). */
static const char *object_of(const void *address)
{
    Dl_info info;
    if (address && dladdr(address, &info) && info.dli_fname) return info.dli_fname;
    return "";
}

rt_fatbin *rt_fatbin_register(const void *wrapper)
{
    rt_fatbin *fb = calloc(1, sizeof *fb);
    const fatbin_wrapper *w = wrapper;
    if (fb && w && w->magic == WRAPPER_MAGIC) read_archs(w->data, &fb->archs);
    if (fb) {
        const char *path = object_of(wrapper); /* dladdr takes the loader's lock: not under ours */
        pthread_mutex_lock(&kernels_lock);
        fb->library = library_index(path);
        pthread_mutex_unlock(&kernels_lock);
    }
    return fb; /* kept while the process runs: a kernel may be asked about until then */
}

void rt_fatbin_add_kernel(rt_fatbin *fatbin, const void *stub)
{
    if (!fatbin || !stub) return;
    pthread_mutex_lock(&kernels_lock);
    if ((kernels_used + 1) * 2 <= kernels_cap || grow()) {
        size_t i = slot_of(kernels, kernels_cap, stub);
        if (!kernels[i].stub) kernels_used++;
        kernels[i] = (kernel_slot){stub, fatbin, 0};
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

void rt_fatbin_count_launch(const void *stub)
{
    pthread_mutex_lock(&kernels_lock);
    if (kernels_cap && stub) {
        kernel_slot *slot = &kernels[slot_of(kernels, kernels_cap, stub)];
        int lib = slot->stub ? slot->fatbin->library : -1;
        if (lib >= 0) {
            libraries[lib].kernels_launched += slot->launches++ == 0;
            libraries[lib].launches++;
        }
    }
    pthread_mutex_unlock(&kernels_lock);
}

/* ---- the knobs (fakecuda.h) -------------------------------------------- */

int vg_fakecuda_kernel_libraries(void)
{
    pthread_mutex_lock(&kernels_lock);
    int n = nlibraries;
    pthread_mutex_unlock(&kernels_lock);
    return n;
}

/* Paths are never freed nor moved once added: the pointer stays valid. */
const char *vg_fakecuda_kernel_library(int index)
{
    pthread_mutex_lock(&kernels_lock);
    const char *path = index >= 0 && index < nlibraries ? libraries[index].path : NULL;
    pthread_mutex_unlock(&kernels_lock);
    return path;
}

long vg_fakecuda_kernel_library_launches(int index)
{
    pthread_mutex_lock(&kernels_lock);
    long n = index >= 0 && index < nlibraries ? libraries[index].launches : -1;
    pthread_mutex_unlock(&kernels_lock);
    return n;
}

long vg_fakecuda_kernel_library_kernels(int index)
{
    pthread_mutex_lock(&kernels_lock);
    long n = index >= 0 && index < nlibraries ? libraries[index].kernels_launched : -1;
    pthread_mutex_unlock(&kernels_lock);
    return n;
}
