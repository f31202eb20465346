/* The fake CUDA runtime's knobs (fake_cudart.c), for its test
 * (test_cuda.c): one list of prototypes for both. */
#ifndef VG_TEST_FAKE_CUDART_H
#define VG_TEST_FAKE_CUDART_H

#include <stddef.h>
#include <stdint.h>

/* Where the last event was recorded: its device, its stream's, and the
 * current device at the time. */
typedef struct fake_record {
    int event_device, stream_device, current;
} fake_record;

void fake_reset(void);
void fake_fail_malloc(int err, int sticky);
void fake_fail_set_device(int device, int err);
void fake_fail_device_count(int err);
void fake_fail_mem_info(int err);   /* every call until reset; 0: none */
void fake_fail_synchronize(int err); /* the same */
void fake_events_wait(int on);
void fake_complete(int device);
unsigned fake_mallocs(int device);
unsigned fake_syncs(int device);
int fake_current(void);
fake_record fake_last_record(void);
uintptr_t fake_stream(int device, unsigned n);
unsigned fake_frees(void);
unsigned fake_event_queries(void);
unsigned fake_event_records(void);
int fake_capture_mode(void);
int fake_malloc_capture_mode(void);
size_t fake_used(int device);

#endif
