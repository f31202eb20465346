/* A pre-check of a pickle before Python's unpickler builds it: the opcodes
 * walked once, nothing built (pickle_scan.c). No Python API, so that the
 * fuzz harness links it alone. */
#ifndef VG_PICKLE_SCAN_H
#define VG_PICKLE_SCAN_H

#include <stddef.h>
#include <stdint.h>

/* Tuples nested deeper than this are refused: hashing a tuple recurses in C
 * once per level, with no recursion limit, and the unpickler hashes every
 * dict key and set element it builds. Snapshots hold no tuples at all. */
#define VG_PICKLE_MAX_TUPLE_DEPTH 100

/* NULL when the pickle holds plain data only (no classes, no persistent
 * ids, no out-of-band buffers), no tuple nested deeper than `max_depth` and
 * no memo key larger than `n`; else a static message and *offset the byte
 * of the opcode at fault. Runs in time linear in `n`; its memory is bounded
 * by `n` too. */
const char *vg_pickle_scan(const uint8_t *data, size_t n, unsigned max_depth, size_t *offset);

#endif
