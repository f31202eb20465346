/* The device heaps' last out-of-memory, for vramguard.last_oom(): the
 * failure's own record (filled under the heap's lock as it failed) and the
 * heap's state copied right after. Kept under a mutex of its own, never
 * held with a heap lock: the state is copied first, then stored. */
#include "vramguard/report.h"

#include <pthread.h>
#include <stdatomic.h>

static pthread_mutex_t last_mutex = PTHREAD_MUTEX_INITIALIZER;
static vg_oom_record last;
static _Atomic uint64_t last_seq;

void vg_devices_note_oom(vg_heap *h, const vg_oom_info *oom)
{
    /* Static: the state is a few KiB, and an OOM path should not need the
     * host's memory; the mutex serializes its users. */
    static vg_heap_state state;
    static pthread_mutex_t copy_mutex = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&copy_mutex);
    vg_heap_state_copy(h, &state);
    pthread_mutex_lock(&last_mutex);
    last.info = *oom;
    last.state = state;
    last.seq = atomic_load(&last_seq) + 1;
    atomic_store(&last_seq, last.seq);
    pthread_mutex_unlock(&last_mutex);
    pthread_mutex_unlock(&copy_mutex);
}

uint64_t vg_devices_last_oom(vg_oom_record *out)
{
    pthread_mutex_lock(&last_mutex);
    uint64_t seq = last.seq;
    if (seq) *out = last;
    pthread_mutex_unlock(&last_mutex);
    return seq;
}

uint64_t vg_devices_last_oom_seq(void)
{
    return atomic_load(&last_seq);
}
