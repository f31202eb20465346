/* The heap's lock: a test-and-test-and-set spinlock that yields the CPU
 * after a short spin. Critical sections are tens of nanoseconds except on
 * the slow path (a device call), where yielding keeps a waiting thread from
 * burning its core. An uncontended lock + unlock is one atomic exchange and
 * one release store, cheaper than a pthread mutex. */
#ifndef VG_LOCK_H
#define VG_LOCK_H

#include <sched.h>
#include <stdatomic.h>

typedef struct vg_lock {
    atomic_int held;
} vg_lock;

static inline void vg_lock_init(vg_lock *l)
{
    atomic_init(&l->held, 0);
}

static inline void vg_lock_acquire(vg_lock *l)
{
    for (;;) {
        if (!atomic_exchange_explicit(&l->held, 1, memory_order_acquire)) return;
        for (int spin = 0; atomic_load_explicit(&l->held, memory_order_relaxed); spin++) {
            if (spin >= 64) {
                sched_yield();
                spin = 0;
            }
        }
    }
}

static inline void vg_lock_release(vg_lock *l)
{
    atomic_store_explicit(&l->held, 0, memory_order_release);
}

#endif
