/* What the fuzz harnesses share: reading numbers off the fuzzer's bytes
 * (zeros once they run out, so every input is a complete program), and a
 * failure that stops the fuzzer with a message. */
#ifndef VG_FUZZ_INPUT_H
#define VG_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fuzz_input {
    const uint8_t *data;
    size_t size, pos;
} fuzz_input;

static inline int fuzz_more(const fuzz_input *in)
{
    return in->pos < in->size;
}

/* `width` bytes, little-endian. */
static inline uint64_t fuzz_take(fuzz_input *in, unsigned width)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < width; i++) {
        uint64_t byte = in->pos < in->size ? in->data[in->pos++] : 0;
        v |= byte << (8 * i);
    }
    return v;
}

#define FUZZ_ASSERT(cond, ...)                                                   \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                 \
            abort();                                                             \
        }                                                                        \
    } while (0)

#endif
