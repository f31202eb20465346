/* The heap lock's contended paths (the fast paths are inline, in lock.h):
 * a bounded spin, then sleep on a futex until the holder wakes us. Where
 * there is no futex, the sleep is a yield. */
#include "lock.h"

#include <sched.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* A pause costs 10 to 140 cycles depending on the CPU (26 ns on the AMD
 * EPYC this was measured on): 100 of them outlast many hot-path critical
 * sections (tens of ns) and are far shorter than a device call. */
#define VG_LOCK_SPINS 100

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void sleep_while_contended(vg_lock *l)
{
#ifdef __linux__
    /* Returns at once if the state is no longer 2; spurious wakes are fine:
     * the caller looks again. */
    syscall(SYS_futex, (int *)&l->state, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
#else
    (void)l;
    sched_yield();
#endif
}

void vg__lock_wait(vg_lock *l)
{
    for (int spin = 0; spin < VG_LOCK_SPINS; spin++) {
        cpu_relax();
        if (atomic_load_explicit(&l->state, memory_order_relaxed) != 0) continue;
        int expected = 0;
        if (atomic_compare_exchange_weak_explicit(&l->state, &expected, 1, memory_order_acquire,
                                                  memory_order_relaxed))
            return;
    }
    /* Say that someone may sleep, then sleep until the lock is ours. Taking
     * it this way leaves the state at 2: one wake too many at worst. */
    while (atomic_exchange_explicit(&l->state, 2, memory_order_acquire) != 0)
        sleep_while_contended(l);
}

void vg__lock_wake(vg_lock *l)
{
#ifdef __linux__
    syscall(SYS_futex, (int *)&l->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
#else
    (void)l;
#endif
}
