/* A call at the process's exit() (C's, not _exit): a dry run's child keeps
 * its figures when a library ends the process from C (bitsandbytes'
 * exit(1)), where no Python exit path runs.
 *
 * The handler is C so that it can decline without touching Python: a
 * process forked from the armed one inherits the registration, and a
 * process whose interpreter has already finalized must not call back into
 * it; only the armed process, while armed, calls `fn`.
 */
#include "core.h"

#include <stdlib.h>
#include <unistd.h>

static void (*exit_fn)(int status);
static pid_t exit_pid;

static void at_exit(int status, void *unused)
{
    (void)unused;
    void (*fn)(int) = __atomic_exchange_n(&exit_fn, NULL, __ATOMIC_ACQ_REL); /* once */
    if (fn && getpid() == __atomic_load_n(&exit_pid, __ATOMIC_ACQUIRE))
        fn(status);
}

/* Registered again by each call that arms it: exit() runs its handlers
 * last registered first, so the latest call's runs before the C++
 * destructors of what was made since (PyTorch's CUDA state, made when CUDA
 * starts, which `fn` reads); the earlier handlers then find nothing armed. */
void vg_fakecuda_call_at_exit(void (*fn)(int status))
{
    __atomic_store_n(&exit_pid, getpid(), __ATOMIC_RELEASE);
    __atomic_store_n(&exit_fn, fn, __ATOMIC_RELEASE);
    if (fn)
        on_exit(at_exit, NULL);
}
