/* libFuzzer harness: the pickle pre-check on any bytes. It must stay in
 * bounds (ASan), report an offset inside the input, give the same answer
 * twice, and be monotonic in its depth limit: what a limit accepts, a
 * higher one accepts too. That what it accepts is safe to unpickle is
 * checked by the Python readers' fuzzing (tests/fuzz/fuzz_readers.py, and
 * the seeded mutations in tests/test_fuzz_readers.py), which runs the real
 * unpickler. */
#include "fuzz_input.h"
#include "pickle_scan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t offset = SIZE_MAX, again = SIZE_MAX;
    const char *err = vg_pickle_scan(data, size, VG_PICKLE_MAX_TUPLE_DEPTH, &offset);
    FUZZ_ASSERT(!err || offset <= size, "offset %zu of %zu", offset, size);
    const char *err2 = vg_pickle_scan(data, size, VG_PICKLE_MAX_TUPLE_DEPTH, &again);
    FUZZ_ASSERT(err == err2 && (!err || offset == again), "two answers");
    const char *shallow = vg_pickle_scan(data, size, 2, NULL);
    const char *deep = vg_pickle_scan(data, size, 10 * VG_PICKLE_MAX_TUPLE_DEPTH, NULL);
    FUZZ_ASSERT(!(shallow == NULL && err != NULL), "limit 2 accepts what limit 100 refuses: %s", err);
    FUZZ_ASSERT(!(err == NULL && deep != NULL), "limit 1000 refuses what limit 100 accepts: %s", deep);
    return 0;
}
