/* A minimal test harness: TEST functions registered in a table, CHECK
 * macros that report the file and line and fail the current test, and a
 * closing "N passed, N failed" line. */
#ifndef VG_HARNESS_H
#define VG_HARNESS_H

#include <stdio.h>
#include <string.h>

static int harness_failed_checks;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
            harness_failed_checks++;                                             \
            return;                                                              \
        }                                                                        \
    } while (0)

#define CHECK_EQ(a, b)                                                           \
    do {                                                                         \
        unsigned long long va_ = (unsigned long long)(a), vb_ = (unsigned long long)(b); \
        if (va_ != vb_) {                                                        \
            fprintf(stderr, "  %s:%d: %s == %llu, expected %s == %llu\n", __FILE__, \
                    __LINE__, #a, va_, #b, vb_);                                 \
            harness_failed_checks++;                                             \
            return;                                                              \
        }                                                                        \
    } while (0)

/* The heap's own invariants, after every step that matters. */
#define CHECK_HEAP(h)                                                            \
    do {                                                                         \
        const char *err_ = vg_heap_check(h);                                     \
        if (err_) {                                                              \
            fprintf(stderr, "  %s:%d: heap check: %s\n", __FILE__, __LINE__, err_); \
            harness_failed_checks++;                                             \
            return;                                                              \
        }                                                                        \
    } while (0)

typedef struct harness_test {
    const char *name;
    void (*fn)(void);
} harness_test;

static int harness_run(const harness_test *tests, size_t n, const char *only)
{
    int passed = 0, failed = 0;
    for (size_t i = 0; i < n; i++) {
        if (only && !strstr(tests[i].name, only)) continue;
        int before = harness_failed_checks;
        tests[i].fn();
        if (harness_failed_checks == before) {
            passed++;
            printf("ok   %s\n", tests[i].name);
        } else {
            failed++;
            printf("FAIL %s\n", tests[i].name);
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

#endif
