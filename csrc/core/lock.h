/* The heap's lock: a mutex that spins briefly, then sleeps in the kernel.
 *
 * The rule that makes it safe to wait for from Python: no holder of a heap
 * lock ever runs Python or waits for the GIL. Walks copy what they need
 * while locked and build Python objects after the release (see
 * csrc/python/py_convert.c), and nothing else a holder calls is Python. So a
 * thread may wait for this lock with the GIL held without a deadlock.
 *
 * A holder may wait for the device in cudaMalloc or cudaFree, though, for
 * milliseconds (a synchronize is waited for with the lock released:
 * deferred_free.c, wait_for_device): a waiter spins
 * for a bounded hundred pauses (a few microseconds, many hot-path critical
 * sections), then sleeps on a futex instead of burning its core.
 *
 * States: 0 free, 1 held, 2 held and a waiter may be asleep (the third mutex
 * of Drepper's "Futexes Are Tricky"). Uncontended, taking is one
 * compare-exchange and giving back one exchange: no syscall. */
#ifndef VG_LOCK_H
#define VG_LOCK_H

#include <stdatomic.h>

typedef struct vg_lock {
    atomic_int state;
} vg_lock;

/* lock.c: the contended paths, out of line. */
void vg__lock_wait(vg_lock *l);
void vg__lock_wake(vg_lock *l);

static inline void vg_lock_init(vg_lock *l)
{
    atomic_init(&l->state, 0);
}

static inline void vg_lock_acquire(vg_lock *l)
{
    int expected = 0;
    if (__builtin_expect(atomic_compare_exchange_strong_explicit(
                             &l->state, &expected, 1, memory_order_acquire, memory_order_relaxed),
                         1))
        return;
    vg__lock_wait(l);
}

static inline void vg_lock_release(vg_lock *l)
{
    if (__builtin_expect(atomic_exchange_explicit(&l->state, 0, memory_order_release) == 2, 0))
        vg__lock_wake(l);
}

#endif
