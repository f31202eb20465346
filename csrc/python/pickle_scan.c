/* A pickle's opcodes walked once before the unpickler runs, to refuse what
 * would crash it or run code: a tuple nested 200,000 deep is 400 KB of
 * pickle, and the unpickler hashes it as a dict key by recursing once per
 * level in C, past the end of the stack.
 *
 * The walk keeps a model of the unpickler's stack in which each object is
 * only the depth of its tuple nesting (0 for anything that is not a tuple
 * or a frozenset: lists, dicts and sets cannot be hashed, so hashing stops
 * at them). It follows CPython's unpickler (Modules/_pickle.c): marks fence
 * the stack, the memo maps keys to objects, MEMOIZE uses the count of keys.
 * Wherever the model is unsure, or the unpickler would fail anyway, the
 * walk refuses: it may refuse a pickle the unpickler would read, never
 * accept one holding a deeper tuple than it says.
 *
 * It also refuses memo keys larger than the pickle: CPython's unpickler
 * sizes its memo array from the largest key it is given. */
#include "pickle_scan.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char ERR_NOMEM[] = "out of host memory";
static const char ERR_TRUNCATED[] = "truncated pickle (no STOP opcode)";
static const char ERR_UNDERFLOW[] = "unpickling stack underflow";
static const char ERR_CLASS[] =
    "refers to a class, a persistent id or an out-of-band buffer; only plain data is read";

/* ------------------------------------------------------------------ */
/* The memo: key -> tuple depth, open addressing                       */
/* ------------------------------------------------------------------ */

typedef struct memo_map {
    uint64_t *keys;   /* key + 1; 0 = empty slot */
    uint32_t *depths;
    size_t mask, count;
} memo_map;

static bool memo_grow(memo_map *m)
{
    size_t cap = m->mask ? (m->mask + 1) * 2 : 64;
    uint64_t *keys = calloc(cap, sizeof *keys);
    uint32_t *depths = calloc(cap, sizeof *depths);
    if (!keys || !depths) {
        free(keys);
        free(depths);
        return false;
    }
    for (size_t i = 0; m->mask && i <= m->mask; i++) {
        if (!m->keys[i]) continue;
        size_t j = (size_t)(m->keys[i] * 0x9E3779B97F4A7C15ull) & (cap - 1);
        while (keys[j]) j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i];
        depths[j] = m->depths[i];
    }
    free(m->keys);
    free(m->depths);
    m->keys = keys;
    m->depths = depths;
    m->mask = cap - 1;
    return true;
}

/* The slot of `key`, or the empty slot where it would go. */
static size_t memo_slot(const memo_map *m, uint64_t key)
{
    size_t j = (size_t)((key + 1) * 0x9E3779B97F4A7C15ull) & m->mask;
    while (m->keys[j] && m->keys[j] != key + 1) j = (j + 1) & m->mask;
    return j;
}

static const char *memo_put(memo_map *m, uint64_t key, uint32_t depth)
{
    if ((m->count + 1) * 2 > m->mask + 1 && !memo_grow(m)) return ERR_NOMEM;
    size_t j = memo_slot(m, key);
    if (!m->keys[j]) {
        m->keys[j] = key + 1;
        m->count++;
    }
    m->depths[j] = depth;
    return NULL;
}

static bool memo_get(const memo_map *m, uint64_t key, uint32_t *depth)
{
    if (!m->mask) return false;
    size_t j = memo_slot(m, key);
    if (!m->keys[j]) return false;
    *depth = m->depths[j];
    return true;
}

/* ------------------------------------------------------------------ */
/* The stack model                                                     */
/* ------------------------------------------------------------------ */

typedef struct scanner {
    const uint8_t *data;
    size_t n, pos;
    uint32_t *stack;  /* tuple depth of each object */
    size_t len, cap;
    size_t *marks;    /* stack lengths at each MARK */
    size_t nmarks, marks_cap;
    memo_map memo;
    unsigned max_depth;
} scanner;

static size_t fence(const scanner *sc)
{
    return sc->nmarks ? sc->marks[sc->nmarks - 1] : 0;
}

static const char *push(scanner *sc, uint32_t depth)
{
    if (sc->len == sc->cap) {
        size_t cap = sc->cap ? sc->cap * 2 : 256;
        uint32_t *grown = realloc(sc->stack, cap * sizeof *grown);
        if (!grown) return ERR_NOMEM;
        sc->stack = grown;
        sc->cap = cap;
    }
    sc->stack[sc->len++] = depth;
    return NULL;
}

static const char *pop(scanner *sc, uint32_t *depth)
{
    if (sc->len <= fence(sc)) return ERR_UNDERFLOW;
    *depth = sc->stack[--sc->len];
    return NULL;
}

static const char *mark(scanner *sc)
{
    if (sc->nmarks == sc->marks_cap) {
        size_t cap = sc->marks_cap ? sc->marks_cap * 2 : 64;
        size_t *grown = realloc(sc->marks, cap * sizeof *grown);
        if (!grown) return ERR_NOMEM;
        sc->marks = grown;
        sc->marks_cap = cap;
    }
    sc->marks[sc->nmarks++] = sc->len;
    return NULL;
}

/* Pop everything above the last mark, and the mark; *deepest gets the
 * deepest of what was popped (0 if nothing). *count how many. */
static const char *pop_mark(scanner *sc, uint32_t *deepest, size_t *count)
{
    if (!sc->nmarks) return "no MARK before an opcode that needs one";
    size_t base = sc->marks[--sc->nmarks];
    uint32_t d = 0;
    for (size_t i = base; i < sc->len; i++)
        if (sc->stack[i] > d) d = sc->stack[i];
    if (count) *count = sc->len - base;
    sc->len = base;
    if (deepest) *deepest = d;
    return NULL;
}

/* A tuple or frozenset over items of depth `deepest`. */
static const char *push_nested(scanner *sc, uint32_t deepest)
{
    if (deepest >= sc->max_depth) return "tuples nested too deep (hashing them would overflow the C stack)";
    return push(sc, deepest + 1);
}

/* ------------------------------------------------------------------ */
/* Arguments                                                           */
/* ------------------------------------------------------------------ */

static const char *skip(scanner *sc, uint64_t k)
{
    if (k > sc->n - sc->pos) return ERR_TRUNCATED;
    sc->pos += (size_t)k;
    return NULL;
}

static const char *read_uint(scanner *sc, unsigned width, uint64_t *out)
{
    if (width > sc->n - sc->pos) return ERR_TRUNCATED;
    uint64_t v = 0;
    for (unsigned i = 0; i < width; i++) v |= (uint64_t)sc->data[sc->pos + i] << (8 * i);
    sc->pos += width;
    *out = v;
    return NULL;
}

/* A length-prefixed argument: `width` bytes of length, then the data. A
 * signed 4-byte length that is negative is refused, as the unpickler does. */
static const char *skip_counted(scanner *sc, unsigned width, bool is_signed)
{
    uint64_t len;
    const char *err = read_uint(sc, width, &len);
    if (err) return err;
    if (is_signed && width == 4 && (len & 0x80000000u)) return "negative length";
    return skip(sc, len);
}

/* One text line (protocol 0); *start and *len exclude the newline. */
static const char *read_line(scanner *sc, const uint8_t **start, size_t *len)
{
    const uint8_t *p = sc->data + sc->pos;
    const uint8_t *nl = memchr(p, '\n', sc->n - sc->pos);
    if (!nl) return ERR_TRUNCATED;
    *start = p;
    *len = (size_t)(nl - p);
    sc->pos += *len + 1;
    return NULL;
}

/* A memo key written in decimal: digits only, below 2^32. */
static const char *read_decimal_key(scanner *sc, uint64_t *key)
{
    const uint8_t *s;
    size_t len;
    const char *err = read_line(sc, &s, &len);
    if (err) return err;
    if (len == 0 || len > 10) return "bad memo key";
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return "bad memo key";
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > UINT32_MAX) return "bad memo key";
    *key = v;
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Opcodes                                                             */
/* ------------------------------------------------------------------ */

static const char *do_get(scanner *sc, uint64_t key)
{
    uint32_t depth;
    if (!memo_get(&sc->memo, key, &depth)) return "memo key not found";
    return push(sc, depth);
}

static const char *do_put(scanner *sc, uint64_t key)
{
    if (sc->len <= fence(sc)) return ERR_UNDERFLOW;
    /* The unpickler sizes its memo array from the key (twice it, 8 bytes
     * each), and a pickler numbers keys from 0, one per object: a key past
     * the pickle's own length is 5 bytes asking for gigabytes. */
    if (key > sc->n) return "memo key larger than the pickle (would make the unpickler allocate for it)";
    return memo_put(&sc->memo, key, sc->stack[sc->len - 1]);
}

static const char *do_tuple_n(scanner *sc, int n)
{
    uint32_t deepest = 0, d;
    for (int i = 0; i < n; i++) {
        const char *err = pop(sc, &d);
        if (err) return err;
        if (d > deepest) deepest = d;
    }
    return push_nested(sc, deepest);
}

static const char *do_pops(scanner *sc, int n)
{
    uint32_t d;
    for (int i = 0; i < n; i++) {
        const char *err = pop(sc, &d);
        if (err) return err;
    }
    /* The container the items went into stays, and must be there. */
    return sc->len > fence(sc) ? NULL : ERR_UNDERFLOW;
}

/* Pop to the mark into the container below it (APPENDS, SETITEMS,
 * ADDITEMS); SETITEMS needs key-value pairs. */
static const char *do_extend(scanner *sc, bool pairs)
{
    size_t count;
    const char *err = pop_mark(sc, NULL, &count);
    if (err) return err;
    if (pairs && count % 2) return "odd number of items for SETITEMS";
    return sc->len > fence(sc) ? NULL : ERR_UNDERFLOW;
}

static const char *do_pop(scanner *sc)
{
    uint32_t d;
    /* With nothing above the last mark, POP takes the mark itself. */
    if (sc->len <= fence(sc) && sc->nmarks) {
        sc->nmarks--;
        return NULL;
    }
    return pop(sc, &d);
}

static const char *do_dup(scanner *sc)
{
    if (sc->len <= fence(sc)) return ERR_UNDERFLOW;
    return push(sc, sc->stack[sc->len - 1]);
}

/* Opcodes that build something without a class, or move data. */
static const char *step(scanner *sc, uint8_t op, bool *stop)
{
    uint64_t v;
    uint32_t deepest;
    const uint8_t *line;
    size_t len;
    const char *err = NULL;
    switch (op) {
    case '.': *stop = true; return sc->len > fence(sc) ? NULL : ERR_UNDERFLOW;          /* STOP */
    case 0x80: return read_uint(sc, 1, &v);                                                /* PROTO */
    case 0x95: return read_uint(sc, 8, &v);                                                /* FRAME */
    case 'N': case 0x88: case 0x89: case ']': case '}': case 0x8f: return push(sc, 0);
    case ')': return push_nested(sc, 0);                                                  /* EMPTY_TUPLE */
    case 'K': err = skip(sc, 1); break;                                                  /* BININT1 */
    case 'M': err = skip(sc, 2); break;                                                  /* BININT2 */
    case 'J': err = skip(sc, 4); break;                                                  /* BININT */
    case 'G': err = skip(sc, 8); break;                                                  /* BINFLOAT */
    case 'I': case 'L': case 'F': case 'S': case 'V': err = read_line(sc, &line, &len); break;
    case 0x8a: case 'U': case 'C': case 0x8c: err = skip_counted(sc, 1, false); break;
    case 0x8b: case 'T': err = skip_counted(sc, 4, true); break;                        /* LONG4, BINSTRING */
    case 'B': case 'X': err = skip_counted(sc, 4, false); break;                        /* BINBYTES, BINUNICODE */
    case 0x8e: case 0x8d: case 0x96: err = skip_counted(sc, 8, false); break;            /* ...8 */
    case '(': return mark(sc);
    case '1': return pop_mark(sc, NULL, NULL);                                            /* POP_MARK */
    case '0': return do_pop(sc);
    case '2': return do_dup(sc);
    case 't': case 0x91:                                                                  /* TUPLE, FROZENSET */
        err = pop_mark(sc, &deepest, NULL);
        return err ? err : push_nested(sc, deepest);
    case 0x85: return do_tuple_n(sc, 1);
    case 0x86: return do_tuple_n(sc, 2);
    case 0x87: return do_tuple_n(sc, 3);
    case 'l': case 'd':                                                                   /* LIST, DICT */
        err = pop_mark(sc, NULL, NULL);
        return err ? err : push(sc, 0);
    case 'a': return do_pops(sc, 1);                                                      /* APPEND */
    case 's': return do_pops(sc, 2);                                                      /* SETITEM */
    case 'e': case 0x90: return do_extend(sc, false);                                     /* APPENDS, ADDITEMS */
    case 'u': return do_extend(sc, true);                                                 /* SETITEMS */
    case 'h': err = read_uint(sc, 1, &v); return err ? err : do_get(sc, v);               /* BINGET */
    case 'j': err = read_uint(sc, 4, &v); return err ? err : do_get(sc, v);               /* LONG_BINGET */
    case 'g': err = read_decimal_key(sc, &v); return err ? err : do_get(sc, v);           /* GET */
    case 'q': err = read_uint(sc, 1, &v); return err ? err : do_put(sc, v);               /* BINPUT */
    case 'r': err = read_uint(sc, 4, &v); return err ? err : do_put(sc, v);               /* LONG_BINPUT */
    case 'p': err = read_decimal_key(sc, &v); return err ? err : do_put(sc, v);           /* PUT */
    case 0x94: return do_put(sc, sc->memo.count);                                         /* MEMOIZE */
    /* GLOBAL, STACK_GLOBAL, INST, OBJ, REDUCE, BUILD, NEWOBJ, NEWOBJ_EX,
     * EXT1/2/4, PERSID, BINPERSID, NEXT_BUFFER, READONLY_BUFFER */
    case 'c': case 0x93: case 'i': case 'o': case 'R': case 'b': case 0x81: case 0x92:
    case 0x82: case 0x83: case 0x84: case 'P': case 'Q': case 0x97: case 0x98:
        return ERR_CLASS;
    default: return "unknown pickle opcode";
    }
    /* A scalar was read. */
    return err ? err : push(sc, 0);
}

const char *vg_pickle_scan(const uint8_t *data, size_t n, unsigned max_depth, size_t *offset)
{
    scanner sc = {.data = data, .n = n, .max_depth = max_depth};
    const char *err = NULL;
    bool stop = false;
    size_t at = 0;
    while (!err && !stop) {
        at = sc.pos;
        if (sc.pos >= sc.n) err = ERR_TRUNCATED;
        else err = step(&sc, sc.data[sc.pos++], &stop);
    }
    if (err && offset) *offset = at;
    free(sc.stack);
    free(sc.marks);
    free(sc.memo.keys);
    free(sc.memo.depths);
    return err;
}
