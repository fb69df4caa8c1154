/* indexer._native: the index's hot primitives, compiled.
 *
 * - xxh64 (the reference xxhash.h, vendored in third_party/) and the gateway's chained
 *   block hashing (hash definition 2, see hashing.py): identical to the pure-Python
 *   path, which calls the xxhash package.
 * - U64Map: an insertion-ordered mapping that stores 64-bit unsigned int keys and int
 *   values unboxed (16 bytes an item instead of a dict entry plus two int objects), with
 *   any other key or value kept as an object reference; an optional column of float
 *   "stamps" (a block's last access) shares its keys. Iteration order, deletion and
 *   re-insertion behave as a dict's, so both paths of the index give identical answers.
 * - match_walk: the prefix match's walk over a U64Map of holder masks.
 * - held_from_ends: the tokens each candidate holds, from a match's ends.
 *
 * Memory comes from PyMem_* so tracemalloc (the benchmarks' measure) sees all of it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define KV_BIG_ENDIAN 1
#else
#define KV_BIG_ENDIAN 0
#endif

/* -- xxh64 ---------------------------------------------------------------------------- */

/* The reference implementation, vendored unmodified (indexer/third_party/README.md says
 * which release): every function static inline in this file, and only XXH64 of it. */
#define XXH_INLINE_ALL
#define XXH_NO_XXH3
#define XXH_NO_STREAM
#include "third_party/xxhash.h"

/* -- int conversion ------------------------------------------------------------------- */

/* An exact int in [0, 2**64) as a u64: 1, else 0 (no exception set). The common case
 * (a non-negative int of at most two 30-bit digits on 3.11) reads the digits directly. */
static inline int as_u64(PyObject *o, uint64_t *out) {
    if (!PyLong_CheckExact(o)) {
        return 0;
    }
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
    Py_ssize_t size = Py_SIZE(o);
    const digit *d = ((PyLongObject *)o)->ob_digit;
    if (size == 0) {
        *out = 0;
        return 1;
    }
    if (size == 1) {
        *out = d[0];
        return 1;
    }
    if (size == 2) {
        *out = (uint64_t)d[0] | ((uint64_t)d[1] << 30);
        return 1;
    }
    if (size < 0) {
        return 0;
    }
#endif
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

/* -- chained block hashing ------------------------------------------------------------ */

#define TOKEN_RANGE "token ids must be integers in [0, 2**32)"

/* A token id as array('I') reads it (the pure path packs the tokens with it, so both
 * paths take the same inputs): what array('I') refuses with TypeError or OverflowError
 * becomes the ValueError the pure path turns those into; anything else an __index__
 * raises goes through, as it does there. */
static int token_value(PyObject *item, uint32_t *out) {
    uint64_t v;
    if (as_u64(item, &v)) {
        if (v <= 0xFFFFFFFFULL) {
            *out = (uint32_t)v;
            return 0;
        }
        PyErr_SetString(PyExc_ValueError, TOKEN_RANGE ": unsigned int is greater than maximum");
        return -1;
    }
    /* __index__ is Python code that may drop the item from the caller's list: hold it. */
    Py_INCREF(item);
    PyObject *index = PyNumber_Index(item);
    if (index == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         TOKEN_RANGE ": '%.100s' object cannot be interpreted as an integer",
                         Py_TYPE(item)->tp_name);
        }
        Py_DECREF(item);
        return -1;
    }
    Py_DECREF(item);
    unsigned long long big = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    if (big == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            return -1;
        }
        PyErr_Clear();
        big = (unsigned long long)-1; /* negative or past 64 bits: out of range below */
    }
    if (big > 0xFFFFFFFFULL) {
        PyErr_SetString(PyExc_ValueError, TOKEN_RANGE ": out of range");
        return -1;
    }
    *out = (uint32_t)big;
    return 0;
}

/* chain's parent: an int in [0, 2**64) (TypeError for a non-int, ValueError out of range,
 * as PrefixHasher.chain checks on the pure path). */
static int parent_value(PyObject *o, uint64_t *out) {
    if (as_u64(o, out)) {
        return 0;
    }
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "parent hash must be an int, not '%.100s'",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o); /* an int subclass (bool) */
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "parent hash must be an unsigned 64-bit integer");
        }
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* chain's block size: an int >= 1; one past Py_ssize_t is larger than any sequence, so it
 * makes no block (the pure path's `len(token_ids) // size` is 0 as well). */
static int block_size_value(PyObject *o, Py_ssize_t *out) {
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "block_size must be an int, not '%.100s'",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow > 0 || v > PY_SSIZE_T_MAX) {
        v = PY_SSIZE_T_MAX;
    }
    if (overflow < 0 || v < 1) {
        PyErr_SetString(PyExc_ValueError, "block_size must be >= 1 token");
        return -1;
    }
    *out = (Py_ssize_t)v;
    return 0;
}

#define STACK_TOKENS 4096

static PyObject *native_chain(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "chain(parent, token_ids, block_size)");
        return NULL;
    }
    uint64_t parent;
    Py_ssize_t size;
    if (parent_value(args[0], &parent) < 0 || block_size_value(args[2], &size) < 0) {
        return NULL;
    }
    PyObject *tokens = args[1];
    if (PyBytes_Check(tokens) || PyByteArray_Check(tokens)) {
        /* array('I', bytes) would read raw machine words: refused on both paths. */
        PyErr_SetString(PyExc_ValueError, TOKEN_RANGE ", not bytes");
        return NULL;
    }
    if (!PySequence_Check(tokens)) {
        PyErr_Format(PyExc_TypeError, "token ids must be a sequence, not '%.100s'",
                     Py_TYPE(tokens)->tp_name);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(tokens, "token ids must be a sequence");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t blocks = PySequence_Fast_GET_SIZE(seq) / size;
    PyObject *out = PyList_New(blocks);
    if (out == NULL || blocks == 0) {
        Py_DECREF(seq);
        return out;
    }
    Py_ssize_t count = blocks * size;
    uint32_t stack[STACK_TOKENS];
    uint32_t *raw = stack;
    if (count > STACK_TOKENS) {
        raw = PyMem_Malloc((size_t)count * sizeof(uint32_t));
        if (raw == NULL) {
            Py_DECREF(seq);
            Py_DECREF(out);
            return PyErr_NoMemory();
        }
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < count; i++) {
        uint32_t v;
        uint64_t wide;
        if (as_u64(items[i], &wide) && wide <= 0xFFFFFFFFULL) {
            v = (uint32_t)wide;
        } else {
            if (token_value(items[i], &v) < 0) {
                goto fail;
            }
            /* A token's __index__ ran Python code that may have resized a list
             * (PySequence_Fast returns a list itself, not a copy): read it afresh. */
            if (PySequence_Fast_GET_SIZE(seq) < count) {
                PyErr_SetString(PyExc_ValueError,
                                TOKEN_RANGE ": the token list changed while read");
                goto fail;
            }
            items = PySequence_Fast_ITEMS(seq);
        }
#if KV_BIG_ENDIAN
        v = __builtin_bswap32(v);
#endif
        raw[i] = v;
    }
    const uint8_t *bytes = (const uint8_t *)raw;
    size_t step = (size_t)size * 4;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        parent = XXH64(bytes + (size_t)b * step, step, parent);
        PyObject *h = PyLong_FromUnsignedLongLong(parent);
        if (h == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(out, b, h);
    }
    if (raw != stack) {
        PyMem_Free(raw);
    }
    Py_DECREF(seq);
    return out;
fail:
    if (raw != stack) {
        PyMem_Free(raw);
    }
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}

static PyObject *native_xxh64(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "xxh64(data, seed)");
        return NULL;
    }
    uint64_t seed;
    if (!as_u64(args[1], &seed)) {
        PyErr_SetString(PyExc_ValueError, "seed must be an unsigned 64-bit integer");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    uint64_t h = XXH64(view.buf, (size_t)view.len, seed);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

/* -- U64Map --------------------------------------------------------------------------- */

#define F_KEYOBJ 1u /* the item's key is a PyObject* (not a u64) */
#define F_VALOBJ 2u /* the item's value is a PyObject* */
#define F_DELETED 4u

#define IX_EMPTY 0u
#define IX_DUMMY 1u /* a deleted item's slot: probing goes on past it */

/* An index slot holds item + 2 in 32 bits. */
#define MAX_ITEMS ((Py_ssize_t)Py_MIN((size_t)UINT32_MAX - 2, (size_t)PY_SSIZE_T_MAX / sizeof(Item)))

/* find_obj / lookup: the key is absent, an __eq__ or __hash__ raised, or an __eq__ changed
 * the map so that the probe must start again (as dict lookups do). */
#define FOUND_NONE (-1)
#define FOUND_ERROR (-2)
#define FOUND_STALE (-3)

#if defined(PyHASH_MODULUS)
#define KV_HASH_MODULUS ((uint64_t)PyHASH_MODULUS)
#else
#define KV_HASH_MODULUS ((uint64_t)_PyHASH_MODULUS)
#endif

typedef struct {
    uint64_t key;
    uint64_t val;
} Item;

typedef struct {
    PyObject_HEAD
    Item *items;       /* dense, in insertion order, deleted ones flagged */
    uint8_t *flags;    /* per item */
    double *stamps;    /* per item, allocated on first use */
    Py_hash_t *hashes; /* per item, allocated with the first object key: that key's hash,
                          taken once (as a dict does), so that growing the map runs no
                          Python code and a key whose hash changes cannot corrupt it */
    uint32_t *index;   /* open addressing (linear probing): IX_EMPTY, IX_DUMMY or item + 2 */
    Py_ssize_t index_size; /* a power of two, or 0 */
    int shift;             /* 64 - log2(index_size) */
    Py_ssize_t nitems;     /* items used in `items`, deleted ones included */
    Py_ssize_t capacity;   /* items allocated */
    Py_ssize_t used;       /* live items */
    Py_ssize_t filled;     /* index slots not IX_EMPTY */
    Py_ssize_t objkeys;    /* live items with an object key */
    Py_ssize_t numkeys;    /* of those, keys that may equal an int in [0, 2**64) (True, 1.0) */
    Py_ssize_t objvals;    /* live items with an object value */
    uint64_t changes;      /* bumped when items come or go or move: iterators and lookups
                              that ran Python code check it */
} U64Map;

static PyTypeObject U64MapType;
static PyTypeObject StampViewType;
static PyTypeObject U64MapIterType;

/* Engines choose their block hashes, and u64 keys are placed by their value: with a
 * fixed mix, keys chosen to share a slot would make every insertion walk all of them
 * (quadratic). A secret drawn when the module loads makes such keys unguessable; the
 * iteration order is the insertion order, so nothing observable depends on it. */
static uint64_t slot_secret;
static int slot_secret_set;

static inline size_t slot_of(uint64_t h, int shift) {
    h ^= slot_secret;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return (size_t)(h >> shift);
}

/* Whether an object key could compare equal to an int in [0, 2**64) (True == 1, 1.0 == 1,
 * an int subclass): a dict takes such a key for that int, so the map must find one from
 * the other although it stores them differently. */
static inline int may_equal_u64(PyObject *key) {
    return !(PyLong_CheckExact(key) || PyBytes_CheckExact(key) || PyUnicode_CheckExact(key) ||
             PyTuple_CheckExact(key) || key == Py_None);
}

static inline Py_ssize_t find_u64(U64Map *m, uint64_t key) {
    if (m->index_size == 0) {
        return FOUND_NONE;
    }
    size_t mask = (size_t)m->index_size - 1;
    size_t i = slot_of(key, m->shift);
    for (;;) {
        uint32_t ix = m->index[i];
        if (ix == IX_EMPTY) {
            return FOUND_NONE;
        }
        if (ix != IX_DUMMY) {
            Py_ssize_t pos = (Py_ssize_t)ix - 2;
            if (m->items[pos].key == key && (m->objkeys == 0 || !(m->flags[pos] & F_KEYOBJ))) {
                return pos;
            }
        }
        i = (i + 1) & mask;
    }
}

/* An object key's position, compared as a dict does (hash, identity, then __eq__). */
static Py_ssize_t find_obj(U64Map *m, PyObject *key, Py_hash_t hash) {
    if (m->index_size == 0 || m->objkeys == 0) {
        return FOUND_NONE;
    }
    size_t mask = (size_t)m->index_size - 1;
    size_t i = slot_of((uint64_t)hash, m->shift);
    for (;;) {
        uint32_t ix = m->index[i];
        if (ix == IX_EMPTY) {
            return FOUND_NONE;
        }
        if (ix != IX_DUMMY) {
            Py_ssize_t pos = (Py_ssize_t)ix - 2;
            if ((m->flags[pos] & F_KEYOBJ) && m->hashes[pos] == hash) {
                PyObject *stored = (PyObject *)(uintptr_t)m->items[pos].key;
                if (stored == key) {
                    return pos;
                }
                uint64_t changes = m->changes;
                Py_INCREF(stored);
                int eq = PyObject_RichCompareBool(stored, key, Py_EQ);
                Py_DECREF(stored);
                if (eq < 0) {
                    return FOUND_ERROR;
                }
                if (m->changes != changes) {
                    return FOUND_STALE; /* `pos` and `i` may mean nothing any more */
                }
                if (eq) {
                    return pos;
                }
            }
        }
        i = (i + 1) & mask;
    }
}

/* A u64 key equal to the object `key` of hash `hash`: an int n >= 0 hashes to n mod the
 * hash modulus, so only n = hash + j * modulus can be (nine of them below 2**64). */
static Py_ssize_t find_equal_u64(U64Map *m, PyObject *key, Py_hash_t hash, uint64_t *found) {
    if (hash < 0) {
        return FOUND_NONE;
    }
    for (uint64_t n = (uint64_t)hash;; n += KV_HASH_MODULUS) {
        Py_ssize_t pos = find_u64(m, n);
        if (pos >= 0) {
            PyObject *candidate = PyLong_FromUnsignedLongLong(n);
            if (candidate == NULL) {
                return FOUND_ERROR;
            }
            uint64_t changes = m->changes;
            int eq = PyObject_RichCompareBool(candidate, key, Py_EQ);
            Py_DECREF(candidate);
            if (eq < 0) {
                return FOUND_ERROR;
            }
            if (m->changes != changes) {
                return FOUND_STALE;
            }
            if (eq) {
                *found = n;
                return pos;
            }
        }
        if (n > UINT64_MAX - KV_HASH_MODULUS || KV_HASH_MODULUS < ((uint64_t)1 << 40)) {
            return FOUND_NONE; /* (a 32-bit hash: too many candidates, exact ints only) */
        }
    }
}

/* A key's position, FOUND_NONE or FOUND_ERROR. `*is_u64`/`*u` say how the key would be
 * stored; `*hash` is where it is (or would be) placed in the index. When this returns no
 * Python code has run since the positions were read, and the caller runs none before it
 * uses them. */
static Py_ssize_t lookup(U64Map *m, PyObject *key, int *is_u64, uint64_t *u, uint64_t *hash) {
    Py_ssize_t pos;
    if (as_u64(key, u)) {
        *is_u64 = 1;
        for (;;) {
            *hash = *u;
            pos = find_u64(m, *u);
            if (pos != FOUND_NONE || m->numkeys == 0) {
                return pos;
            }
            Py_hash_t h = PyObject_Hash(key); /* an exact int's: no Python code, no error */
            if (h == -1 && PyErr_Occurred()) {
                return FOUND_ERROR;
            }
            pos = find_obj(m, key, h);
            if (pos >= 0) {
                *hash = (uint64_t)h;
                return pos;
            }
            if (pos != FOUND_STALE) {
                return pos;
            }
        }
    }
    *is_u64 = 0;
    Py_hash_t h = PyObject_Hash(key);
    if (h == -1 && PyErr_Occurred()) {
        return FOUND_ERROR;
    }
    for (;;) {
        *hash = (uint64_t)h;
        pos = find_obj(m, key, h);
        if (pos == FOUND_STALE) {
            continue;
        }
        if (pos != FOUND_NONE || m->used == m->objkeys || !may_equal_u64(key)) {
            return pos;
        }
        pos = find_equal_u64(m, key, h, hash);
        if (pos != FOUND_STALE) {
            return pos;
        }
    }
}

static PyObject *item_value(U64Map *m, Py_ssize_t pos) {
    if (m->objvals && (m->flags[pos] & F_VALOBJ)) {
        PyObject *v = (PyObject *)(uintptr_t)m->items[pos].val;
        Py_INCREF(v);
        return v;
    }
    return PyLong_FromUnsignedLongLong(m->items[pos].val);
}

static PyObject *item_key(U64Map *m, Py_ssize_t pos) {
    if (m->objkeys && (m->flags[pos] & F_KEYOBJ)) {
        PyObject *k = (PyObject *)(uintptr_t)m->items[pos].key;
        Py_INCREF(k);
        return k;
    }
    return PyLong_FromUnsignedLongLong(m->items[pos].key);
}

static inline uint64_t slot_hash(U64Map *m, Py_ssize_t pos) {
    return (m->flags[pos] & F_KEYOBJ) ? (uint64_t)m->hashes[pos] : m->items[pos].key;
}

/* Rebuild the index for `index_size` slots, dropping deleted items (order kept). Fails
 * (MemoryError) before it changes anything; runs no Python code. */
static int rebuild(U64Map *m, Py_ssize_t index_size) {
    uint32_t *index = PyMem_Calloc((size_t)index_size, sizeof(uint32_t));
    if (index == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int shift = 64;
    for (Py_ssize_t s = index_size; s > 1; s >>= 1) {
        shift--;
    }
    size_t mask = (size_t)index_size - 1;
    Py_ssize_t out = 0;
    for (Py_ssize_t pos = 0; pos < m->nitems; pos++) {
        uint8_t f = m->flags[pos];
        if (f & F_DELETED) {
            continue;
        }
        uint64_t h = slot_hash(m, pos);
        if (out != pos) {
            m->items[out] = m->items[pos];
            m->flags[out] = f;
            if (m->stamps) {
                m->stamps[out] = m->stamps[pos];
            }
            if (m->hashes) {
                m->hashes[out] = m->hashes[pos];
            }
        }
        size_t i = slot_of(h, shift);
        while (index[i] != IX_EMPTY) {
            i = (i + 1) & mask;
        }
        index[i] = (uint32_t)(out + 2);
        out++;
    }
    PyMem_Free(m->index);
    m->index = index;
    m->index_size = index_size;
    m->shift = shift;
    m->nitems = out;
    m->filled = out;
    m->changes++;
    return 0;
}

static Py_ssize_t index_size_for(Py_ssize_t items) {
    Py_ssize_t size = 8;
    while (size * 3 < (items + 1) * 4) { /* at most 3/4 full */
        size <<= 1;
    }
    return size;
}

/* Each column is grown in turn: one that fails leaves the map as it was, `capacity`
 * being the smallest of them. */
static int grow_items(U64Map *m, Py_ssize_t capacity) {
    Item *items = PyMem_Realloc(m->items, (size_t)capacity * sizeof(Item));
    if (items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    m->items = items;
    uint8_t *flags = PyMem_Realloc(m->flags, (size_t)capacity);
    if (flags == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    m->flags = flags;
    if (m->stamps) {
        double *stamps = PyMem_Realloc(m->stamps, (size_t)capacity * sizeof(double));
        if (stamps == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        m->stamps = stamps;
    }
    if (m->hashes) {
        Py_hash_t *hashes = PyMem_Realloc(m->hashes, (size_t)capacity * sizeof(Py_hash_t));
        if (hashes == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        m->hashes = hashes;
    }
    m->capacity = capacity;
    return 0;
}

/* Room for one more item: a new slot in the index and in `items`. */
static int make_room(U64Map *m) {
    if ((m->filled + 1) * 4 > m->index_size * 3) {
        /* Many deleted slots: rebuilding at the same size is enough. */
        if (rebuild(m, index_size_for(m->used + 1)) < 0) {
            return -1;
        }
    }
    if (m->nitems == m->capacity) {
        if (m->nitems - m->used > m->nitems / 4) {
            if (rebuild(m, index_size_for(m->used + 1)) < 0) {
                return -1;
            }
        }
        if (m->nitems == m->capacity) {
            if (m->capacity >= MAX_ITEMS) {
                PyErr_SetString(PyExc_MemoryError, "U64Map is full");
                return -1;
            }
            Py_ssize_t capacity = m->capacity < 8 ? 8 : m->capacity + (m->capacity >> 1);
            if (grow_items(m, Py_MIN(capacity, MAX_ITEMS)) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

static int ensure_stamps(U64Map *m) {
    if (m->stamps == NULL && m->capacity) {
        m->stamps = PyMem_Calloc((size_t)m->capacity, sizeof(double));
        if (m->stamps == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

static int ensure_hashes(U64Map *m) {
    if (m->hashes == NULL && m->capacity) {
        m->hashes = PyMem_Calloc((size_t)m->capacity, sizeof(Py_hash_t));
        if (m->hashes == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

static void set_value(U64Map *m, Py_ssize_t pos, PyObject *value) {
    PyObject *old = NULL;
    if (m->flags[pos] & F_VALOBJ) {
        old = (PyObject *)(uintptr_t)m->items[pos].val;
        m->flags[pos] &= (uint8_t)~F_VALOBJ;
        m->objvals--;
    }
    uint64_t v;
    if (as_u64(value, &v)) {
        m->items[pos].val = v;
    } else {
        Py_INCREF(value);
        m->items[pos].val = (uint64_t)(uintptr_t)value;
        m->flags[pos] |= F_VALOBJ;
        m->objvals++;
    }
    /* Last: the old value's finalizer may run Python code that changes the map. */
    Py_XDECREF(old);
}

/* Insert a key known to be absent; returns its position or -1. Runs no Python code. */
static Py_ssize_t insert_new(U64Map *m, PyObject *key, int is_u64, uint64_t u, uint64_t hash) {
    if (make_room(m) < 0) {
        return -1;
    }
    if (m->index_size == 0 && rebuild(m, 8) < 0) {
        return -1;
    }
    if (!is_u64 && ensure_hashes(m) < 0) {
        return -1;
    }
    Py_ssize_t pos = m->nitems++;
    size_t mask = (size_t)m->index_size - 1;
    size_t i = slot_of(hash, m->shift);
    while (m->index[i] != IX_EMPTY && m->index[i] != IX_DUMMY) {
        i = (i + 1) & mask;
    }
    if (m->index[i] == IX_EMPTY) {
        m->filled++;
    }
    m->index[i] = (uint32_t)(pos + 2);
    m->flags[pos] = 0;
    m->items[pos].val = 0;
    if (m->stamps) {
        m->stamps[pos] = 0.0;
    }
    if (is_u64) {
        m->items[pos].key = u;
    } else {
        Py_INCREF(key);
        m->items[pos].key = (uint64_t)(uintptr_t)key;
        m->hashes[pos] = (Py_hash_t)hash;
        m->flags[pos] = F_KEYOBJ;
        m->objkeys++;
        m->numkeys += may_equal_u64(key);
    }
    m->used++;
    m->changes++;
    return pos;
}

/* The references the map held go last: their finalizers see a consistent map. */
static void free_columns(U64Map *m) {
    PyMem_Free(m->index);
    PyMem_Free(m->stamps);
    PyMem_Free(m->hashes);
    m->index = NULL;
    m->items = NULL;
    m->flags = NULL;
    m->stamps = NULL;
    m->hashes = NULL;
    m->index_size = m->nitems = m->capacity = m->filled = 0;
}

static void delete_at(U64Map *m, Py_ssize_t pos, uint64_t hash) {
    size_t mask = (size_t)m->index_size - 1;
    size_t i = slot_of(hash, m->shift);
    while (m->index[i] != (uint32_t)(pos + 2)) {
        i = (i + 1) & mask;
    }
    m->index[i] = IX_DUMMY;
    uint8_t f = m->flags[pos];
    m->flags[pos] = F_DELETED;
    m->used--;
    m->changes++;
    PyObject *key = NULL, *val = NULL;
    if (f & F_KEYOBJ) {
        key = (PyObject *)(uintptr_t)m->items[pos].key;
        m->objkeys--;
        m->numkeys -= may_equal_u64(key);
    }
    if (f & F_VALOBJ) {
        val = (PyObject *)(uintptr_t)m->items[pos].val;
        m->objvals--;
    }
    if (m->used == 0 && m->nitems > 64) {
        /* Emptied (a pod cleared): give the memory back rather than keep the holes. */
        Item *items = m->items;
        uint8_t *flags = m->flags;
        free_columns(m);
        PyMem_Free(items);
        PyMem_Free(flags);
    }
    Py_XDECREF(key);
    Py_XDECREF(val);
}

static void map_clear_all(U64Map *m) {
    Item *items = m->items;
    uint8_t *flags = m->flags;
    Py_ssize_t nitems = m->nitems;
    int had_objects = m->objkeys || m->objvals;
    free_columns(m);
    m->used = m->objkeys = m->numkeys = m->objvals = 0;
    m->changes++;
    if (had_objects) {
        for (Py_ssize_t pos = 0; pos < nitems; pos++) {
            uint8_t f = flags[pos];
            if (f & F_DELETED) {
                continue;
            }
            if (f & F_KEYOBJ) {
                Py_DECREF((PyObject *)(uintptr_t)items[pos].key);
            }
            if (f & F_VALOBJ) {
                Py_DECREF((PyObject *)(uintptr_t)items[pos].val);
            }
        }
    }
    PyMem_Free(items);
    PyMem_Free(flags);
}

static PyObject *U64Map_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "U64Map() takes no arguments");
        return NULL;
    }
    U64Map *m = PyObject_GC_New(U64Map, type);
    if (m == NULL) {
        return NULL;
    }
    m->items = NULL;
    m->flags = NULL;
    m->stamps = NULL;
    m->hashes = NULL;
    m->index = NULL;
    m->index_size = m->nitems = m->capacity = m->used = m->filled = 0;
    m->shift = 64;
    m->objkeys = m->numkeys = m->objvals = 0;
    m->changes = 0;
    PyObject_GC_Track(m);
    return (PyObject *)m;
}

static int U64Map_traverse(U64Map *m, visitproc visit, void *arg) {
    if (m->objkeys == 0 && m->objvals == 0) {
        return 0;
    }
    for (Py_ssize_t pos = 0; pos < m->nitems; pos++) {
        uint8_t f = m->flags[pos];
        if (f & F_DELETED) {
            continue;
        }
        if (f & F_KEYOBJ) {
            Py_VISIT((PyObject *)(uintptr_t)m->items[pos].key);
        }
        if (f & F_VALOBJ) {
            Py_VISIT((PyObject *)(uintptr_t)m->items[pos].val);
        }
    }
    return 0;
}

static int U64Map_tp_clear(U64Map *m) {
    map_clear_all(m);
    return 0;
}

static void U64Map_dealloc(U64Map *m) {
    PyObject_GC_UnTrack(m);
    /* Maps nested in maps (a value of one being another) free one another recursively:
     * the trashcan defers past a depth, as for dicts, instead of overflowing the C stack. */
    Py_TRASHCAN_BEGIN(m, U64Map_dealloc)
    map_clear_all(m);
    PyObject_GC_Del(m);
    Py_TRASHCAN_END
}

static Py_ssize_t U64Map_length(U64Map *m) { return m->used; }

/* KeyError(key) as a dict raises it: a tuple key is one argument, not several. */
static void set_key_error(PyObject *key) {
    PyObject *args = PyTuple_Pack(1, key);
    if (args != NULL) {
        PyErr_SetObject(PyExc_KeyError, args);
        Py_DECREF(args);
    }
}

static PyObject *U64Map_subscript(U64Map *m, PyObject *key) {
    int is_u64;
    uint64_t u, hash;
    Py_ssize_t pos = lookup(m, key, &is_u64, &u, &hash);
    if (pos == FOUND_ERROR) {
        return NULL;
    }
    if (pos < 0) {
        set_key_error(key);
        return NULL;
    }
    return item_value(m, pos);
}

static int U64Map_ass_subscript(U64Map *m, PyObject *key, PyObject *value) {
    int is_u64;
    uint64_t u, hash;
    Py_ssize_t pos = lookup(m, key, &is_u64, &u, &hash);
    if (pos == FOUND_ERROR) {
        return -1;
    }
    if (value == NULL) {
        if (pos < 0) {
            set_key_error(key);
            return -1;
        }
        delete_at(m, pos, hash);
        return 0;
    }
    if (pos < 0) {
        pos = insert_new(m, key, is_u64, u, hash);
        if (pos < 0) {
            return -1;
        }
    }
    set_value(m, pos, value);
    return 0;
}

static int U64Map_contains(U64Map *m, PyObject *key) {
    int is_u64;
    uint64_t u, hash;
    Py_ssize_t pos = lookup(m, key, &is_u64, &u, &hash);
    if (pos == FOUND_ERROR) {
        return -1;
    }
    return pos >= 0;
}

static PyObject *U64Map_get(U64Map *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    int is_u64;
    uint64_t u, hash;
    Py_ssize_t pos = lookup(m, args[0], &is_u64, &u, &hash);
    if (pos == FOUND_ERROR) {
        return NULL;
    }
    if (pos < 0) {
        PyObject *fallback = nargs == 2 ? args[1] : Py_None;
        Py_INCREF(fallback);
        return fallback;
    }
    return item_value(m, pos);
}

static PyObject *U64Map_pop(U64Map *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(key[, default])");
        return NULL;
    }
    int is_u64;
    uint64_t u, hash;
    Py_ssize_t pos = lookup(m, args[0], &is_u64, &u, &hash);
    if (pos == FOUND_ERROR) {
        return NULL;
    }
    if (pos < 0) {
        if (nargs == 2) {
            Py_INCREF(args[1]);
            return args[1];
        }
        set_key_error(args[0]);
        return NULL;
    }
    PyObject *value = item_value(m, pos);
    if (value == NULL) {
        return NULL;
    }
    delete_at(m, pos, hash);
    return value;
}

static PyObject *U64Map_clear_method(U64Map *m, PyObject *unused) {
    map_clear_all(m);
    Py_RETURN_NONE;
}

enum { ITER_KEYS, ITER_VALUES, ITER_ITEMS };

typedef struct {
    PyObject_HEAD
    U64Map *map; /* NULL once exhausted: it then stays so, as a dict's iterator */
    Py_ssize_t pos;
    uint64_t changes;
    int kind;
} U64MapIter;

/* Iterators and stamp views refer to their map, which may hold them (m[k] = iter(m)): they
 * take part in the cycle collector, or such a cycle would never be freed. */
static PyObject *make_iter(U64Map *m, int kind) {
    U64MapIter *it = PyObject_GC_New(U64MapIter, &U64MapIterType);
    if (it == NULL) {
        return NULL;
    }
    Py_INCREF(m);
    it->map = m;
    it->pos = 0;
    it->changes = m->changes;
    it->kind = kind;
    PyObject_GC_Track(it);
    return (PyObject *)it;
}

static int U64MapIter_traverse(U64MapIter *it, visitproc visit, void *arg) {
    Py_VISIT(it->map);
    return 0;
}

static int U64MapIter_clear(U64MapIter *it) {
    Py_CLEAR(it->map);
    return 0;
}

static void U64MapIter_dealloc(U64MapIter *it) {
    PyObject_GC_UnTrack(it);
    Py_XDECREF(it->map);
    PyObject_GC_Del(it);
}

static PyObject *U64MapIter_next(U64MapIter *it) {
    U64Map *m = it->map;
    if (m == NULL) {
        return NULL;
    }
    if (it->changes != m->changes) {
        PyErr_SetString(PyExc_RuntimeError, "U64Map changed size during iteration");
        return NULL;
    }
    while (it->pos < m->nitems && (m->flags[it->pos] & F_DELETED)) {
        it->pos++;
    }
    if (it->pos >= m->nitems) {
        Py_CLEAR(it->map);
        return NULL;
    }
    Py_ssize_t pos = it->pos++;
    if (it->kind == ITER_KEYS) {
        return item_key(m, pos);
    }
    if (it->kind == ITER_VALUES) {
        return item_value(m, pos);
    }
    PyObject *k = item_key(m, pos);
    if (k == NULL) {
        return NULL;
    }
    PyObject *v = item_value(m, pos);
    if (v == NULL) {
        Py_DECREF(k);
        return NULL;
    }
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) {
        Py_DECREF(k);
        Py_DECREF(v);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, k);
    PyTuple_SET_ITEM(pair, 1, v);
    return pair;
}

static PyObject *U64Map_iter(U64Map *m) { return make_iter(m, ITER_KEYS); }

static PyObject *U64Map_keys(U64Map *m, PyObject *unused) { return make_iter(m, ITER_KEYS); }

static PyObject *U64Map_values(U64Map *m, PyObject *unused) {
    return make_iter(m, ITER_VALUES);
}

static PyObject *U64Map_items(U64Map *m, PyObject *unused) { return make_iter(m, ITER_ITEMS); }

static PyObject *U64Map_repr(U64Map *m) {
    int busy = Py_ReprEnter((PyObject *)m);
    if (busy != 0) { /* the map holds itself, somewhere down: as a dict shows it */
        return busy > 0 ? PyUnicode_FromString("U64Map(...)") : NULL;
    }
    PyObject *r = NULL;
    PyObject *d = PyDict_New();
    if (d == NULL) {
        goto done;
    }
    /* PyDict_SetItem runs the keys' __hash__/__eq__: `pos` and `nitems` are read afresh. */
    for (Py_ssize_t pos = 0; pos < m->nitems; pos++) {
        if (m->flags[pos] & F_DELETED) {
            continue;
        }
        PyObject *k = item_key(m, pos);
        PyObject *v = k ? item_value(m, pos) : NULL;
        if (v == NULL || PyDict_SetItem(d, k, v) < 0) {
            Py_XDECREF(k);
            Py_XDECREF(v);
            goto done;
        }
        Py_DECREF(k);
        Py_DECREF(v);
    }
    r = PyUnicode_FromFormat("U64Map(%R)", d);
done:
    Py_XDECREF(d);
    Py_ReprLeave((PyObject *)m);
    return r;
}

static PyObject *U64Map_stamps(U64Map *m, PyObject *unused);

typedef struct {
    double stamp;
    Py_ssize_t pos;
} Aged;

/* A total order, as qsort needs: a NaN stamp (no usable time) counts as the oldest. */
static int compare_aged(const void *a, const void *b) {
    const Aged *x = a, *y = b;
    int x_nan = x->stamp != x->stamp, y_nan = y->stamp != y->stamp;
    if (x_nan != y_nan) {
        return x_nan ? -1 : 1;
    }
    if (!x_nan) {
        if (x->stamp < y->stamp) {
            return -1;
        }
        if (x->stamp > y->stamp) {
            return 1;
        }
    }
    /* Equally old: the newest inserted first (a chain goes tail first). */
    return (x->pos < y->pos) - (x->pos > y->pos);
}

static PyObject *U64Map_oldest(U64Map *m, PyObject *arg) {
    int overflow;
    long long wanted = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (wanted == -1 && PyErr_Occurred()) {
        return NULL;
    }
    /* heapq.nsmallest (the pure path's) takes any int: past the size, all of them. */
    Py_ssize_t count = overflow > 0 || wanted > (long long)m->used ? m->used
                       : overflow < 0 || wanted < 0                ? 0
                                                                   : (Py_ssize_t)wanted;
    /* The list first: allocating it may run the cycle collector, and so finalizers that
     * change the map, which must not happen between reading positions and using them. */
    PyObject *out = PyList_New(count);
    if (out == NULL || count == 0) {
        return out;
    }
    count = Py_MIN(count, m->used);
    Aged *aged = PyMem_Malloc((size_t)m->used * sizeof(Aged));
    if (aged == NULL) {
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    Py_ssize_t n = 0;
    for (Py_ssize_t pos = 0; pos < m->nitems; pos++) {
        if (!(m->flags[pos] & F_DELETED)) {
            aged[n].stamp = m->stamps ? m->stamps[pos] : 0.0;
            aged[n].pos = pos;
            n++;
        }
    }
    qsort(aged, (size_t)n, sizeof(Aged), compare_aged);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *k = item_key(m, aged[i].pos);
        if (k == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, k);
    }
    PyMem_Free(aged);
    if (out != NULL && PyList_GET_SIZE(out) > count) {
        /* The map shrank under the list's allocation: drop the unfilled tail. */
        if (PyList_SetSlice(out, count, PyList_GET_SIZE(out), NULL) < 0) {
            Py_CLEAR(out);
        }
    }
    return out;
}

static PyMethodDef U64Map_methods[] = {
    {"get", (PyCFunction)(void (*)(void))U64Map_get, METH_FASTCALL, NULL},
    {"pop", (PyCFunction)(void (*)(void))U64Map_pop, METH_FASTCALL, NULL},
    {"clear", (PyCFunction)U64Map_clear_method, METH_NOARGS, NULL},
    {"keys", (PyCFunction)U64Map_keys, METH_NOARGS, NULL},
    {"values", (PyCFunction)U64Map_values, METH_NOARGS, NULL},
    {"items", (PyCFunction)U64Map_items, METH_NOARGS, NULL},
    {"stamps", (PyCFunction)U64Map_stamps, METH_NOARGS, NULL},
    {"oldest", (PyCFunction)U64Map_oldest, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods U64Map_as_mapping = {
    (lenfunc)U64Map_length,
    (binaryfunc)U64Map_subscript,
    (objobjargproc)U64Map_ass_subscript,
};

static PySequenceMethods U64Map_as_sequence = {
    .sq_contains = (objobjproc)U64Map_contains,
};

static PyTypeObject U64MapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "indexer._native.U64Map",
    .tp_basicsize = sizeof(U64Map),
    .tp_dealloc = (destructor)U64Map_dealloc,
    .tp_repr = (reprfunc)U64Map_repr,
    .tp_as_sequence = &U64Map_as_sequence,
    .tp_as_mapping = &U64Map_as_mapping,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)U64Map_traverse,
    .tp_clear = (inquiry)U64Map_tp_clear,
    .tp_iter = (getiterfunc)U64Map_iter,
    .tp_methods = U64Map_methods,
    .tp_new = U64Map_new,
};

static PyTypeObject U64MapIterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "indexer._native.U64MapIterator",
    .tp_basicsize = sizeof(U64MapIter),
    .tp_dealloc = (destructor)U64MapIter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)U64MapIter_traverse,
    .tp_clear = (inquiry)U64MapIter_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)U64MapIter_next,
};

/* -- StampView: the stamps column as a mapping ---------------------------------------- */

typedef struct {
    PyObject_HEAD
    U64Map *map; /* NULL only after the cycle collector cleared the view */
} StampView;

static PyObject *U64Map_stamps(U64Map *m, PyObject *unused) {
    StampView *v = PyObject_GC_New(StampView, &StampViewType);
    if (v == NULL) {
        return NULL;
    }
    Py_INCREF(m);
    v->map = m;
    PyObject_GC_Track(v);
    return (PyObject *)v;
}

static int StampView_traverse(StampView *v, visitproc visit, void *arg) {
    Py_VISIT(v->map);
    return 0;
}

static int StampView_clear(StampView *v) {
    Py_CLEAR(v->map);
    return 0;
}

static void StampView_dealloc(StampView *v) {
    PyObject_GC_UnTrack(v);
    Py_XDECREF(v->map);
    PyObject_GC_Del(v);
}

/* A view the collector cleared (a finalizer may still reach it) has no map. */
static U64Map *view_map(StampView *v) {
    if (v->map == NULL) {
        PyErr_SetString(PyExc_ReferenceError, "the stamps' map is gone");
    }
    return v->map;
}

static Py_ssize_t StampView_length(StampView *v) {
    U64Map *m = view_map(v);
    return m == NULL ? -1 : m->used;
}

static PyObject *StampView_subscript(StampView *v, PyObject *key) {
    U64Map *m = view_map(v);
    if (m == NULL) {
        return NULL;
    }
    int is_u64;
    uint64_t u, hash;
    Py_ssize_t pos = lookup(m, key, &is_u64, &u, &hash);
    if (pos == FOUND_ERROR) {
        return NULL;
    }
    if (pos < 0) {
        set_key_error(key);
        return NULL;
    }
    return PyFloat_FromDouble(m->stamps ? m->stamps[pos] : 0.0);
}

/* Setting the stamp of an absent key adds it with the value 0 (the index then sets its
 * mask); deleting goes through the map. */
static int StampView_ass_subscript(StampView *v, PyObject *key, PyObject *value) {
    U64Map *m = view_map(v);
    if (m == NULL) {
        return -1;
    }
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "delete the key from the map, not its stamp");
        return -1;
    }
    double stamp = PyFloat_CheckExact(value) ? PyFloat_AS_DOUBLE(value) : PyFloat_AsDouble(value);
    if (stamp == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    /* The map is held: __float__ above and the key's __eq__ below may drop the view's. */
    Py_INCREF(m);
    int is_u64;
    uint64_t u, hash;
    Py_ssize_t pos = lookup(m, key, &is_u64, &u, &hash);
    if (pos == FOUND_NONE) {
        pos = insert_new(m, key, is_u64, u, hash);
    }
    if (pos < 0 || ensure_stamps(m) < 0) {
        Py_DECREF(m);
        return -1;
    }
    m->stamps[pos] = stamp;
    Py_DECREF(m);
    return 0;
}

static int StampView_contains(StampView *v, PyObject *key) {
    U64Map *m = view_map(v);
    return m == NULL ? -1 : U64Map_contains(m, key);
}

static PyMappingMethods StampView_as_mapping = {
    (lenfunc)StampView_length,
    (binaryfunc)StampView_subscript,
    (objobjargproc)StampView_ass_subscript,
};

static PySequenceMethods StampView_as_sequence = {
    .sq_contains = (objobjproc)StampView_contains,
};

static PyTypeObject StampViewType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "indexer._native.StampView",
    .tp_basicsize = sizeof(StampView),
    .tp_dealloc = (destructor)StampView_dealloc,
    .tp_as_sequence = &StampView_as_sequence,
    .tp_as_mapping = &StampView_as_mapping,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)StampView_traverse,
    .tp_clear = (inquiry)StampView_clear,
};

/* -- the match walk ------------------------------------------------------------------- */

#define WALK_STACK 512
/* Each end but the last drops at least one of the 64 bits of `alive`. */
#define MAX_ENDS 65

/* match_walk(held, prefix_hashes, alive, now) -> [(length, mask), ...] or None.
 *
 * The walk of match.match_prefix over a U64Map of holder masks: one lookup and an AND
 * per block while some candidate still matches, (length, mask of the pods that stop
 * there) for each length where some stop, the last being (matched, still matching); the
 * matched blocks' stamps set to `now`. None when the masks do not all fit in 64 bits
 * (then the caller walks in Python). The index slots of every block are fetched ahead of
 * the walk, so its cache misses overlap instead of queueing one per block.
 *
 * Whatever runs Python code (`now`'s __float__, iterating `prefix_hashes`, and any
 * allocation of an object, which may start the cycle collector and its finalizers) runs
 * before the map is read or after it was last touched, never between. */
static PyObject *native_match_walk(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyObject_TypeCheck(args[0], &U64MapType)) {
        PyErr_SetString(PyExc_TypeError, "match_walk(held: U64Map, hashes, alive, now)");
        return NULL;
    }
    U64Map *m = (U64Map *)args[0];
    uint64_t alive;
    if (!as_u64(args[2], &alive)) {
        Py_RETURN_NONE;
    }
    double now = PyFloat_AsDouble(args[3]);
    if (now == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "prefix hashes must be a sequence");
    if (seq == NULL) {
        return NULL;
    }
    PyObject *ends = PyList_New(0);
    if (ends == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    if (m->objvals || m->objkeys) {
        Py_DECREF(seq);
        Py_DECREF(ends);
        Py_RETURN_NONE;
    }
    Py_ssize_t total = PySequence_Fast_GET_SIZE(seq);
    PyObject **hashes = PySequence_Fast_ITEMS(seq);
    uint64_t stack[WALK_STACK];
    uint64_t *keys = stack;
    if (total > WALK_STACK) {
        keys = PyMem_Malloc((size_t)total * sizeof(uint64_t));
        if (keys == NULL) {
            Py_DECREF(seq);
            Py_DECREF(ends);
            return PyErr_NoMemory();
        }
    }
    Py_ssize_t usable = total; /* a hash that is no u64 is in no store: the walk ends there */
    for (Py_ssize_t i = 0; i < total; i++) {
        if (!as_u64(hashes[i], &keys[i])) {
            usable = i;
            break;
        }
    }
    if (m->index_size) {
        for (Py_ssize_t i = 0; i < usable; i++) {
            __builtin_prefetch(&m->index[slot_of(keys[i], m->shift)]);
        }
    }
    Py_ssize_t end_at[MAX_ENDS];
    uint64_t end_mask[MAX_ENDS];
    int nends = 0;
    Py_ssize_t matched = 0;
    for (; matched < usable; matched++) {
        Py_ssize_t pos = find_u64(m, keys[matched]);
        if (pos < 0) {
            break;
        }
        uint64_t still = m->items[pos].val & alive;
        if (still != alive) {
            if (!still) {
                break;
            }
            end_at[nends] = matched;
            end_mask[nends] = alive ^ still;
            nends++;
            alive = still;
        }
        keys[matched] = (uint64_t)pos; /* stamped below, once the walk is over */
    }
    end_at[nends] = matched;
    end_mask[nends] = alive;
    nends++;
    if (matched && ensure_stamps(m) < 0) {
        Py_CLEAR(ends);
        goto done;
    }
    for (Py_ssize_t i = 0; i < matched; i++) {
        m->stamps[keys[i]] = now;
    }
    for (int e = 0; e < nends; e++) {
        PyObject *end = Py_BuildValue("(nK)", end_at[e], (unsigned long long)end_mask[e]);
        if (end == NULL || PyList_Append(ends, end) < 0) {
            Py_XDECREF(end);
            Py_CLEAR(ends);
            goto done;
        }
        Py_DECREF(end);
    }
done:
    if (keys != stack) {
        PyMem_Free(keys);
    }
    Py_DECREF(seq);
    return ends;
}

/* spread_ends(table, names, ends) -> bool
 *
 * MatchedBlocks.table's loop: for each (length, mask) of a walk's ends with length > 0,
 * table[names[i]] = length for every bit i of mask. False (and nothing written) when a
 * mask does not fit in 64 bits or names a bit past `names`: the caller then loops in
 * Python. A name's __hash__/__eq__ or a length's __bool__ may change `names` and `ends`
 * meanwhile: each end is held while used and read again, and a name whose bit is now past
 * `names` raises RuntimeError. */
static int read_end(PyObject *end, uint64_t known, uint64_t *mask) {
    return PyTuple_Check(end) && PyTuple_GET_SIZE(end) == 2 &&
           as_u64(PyTuple_GET_ITEM(end, 1), mask) && !(*mask & ~known);
}

static PyObject *native_spread_ends(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyDict_Check(args[0]) || !PyList_Check(args[1]) ||
        !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "spread_ends(table: dict, names: list, ends: list)");
        return NULL;
    }
    PyObject *table = args[0], *names = args[1], *ends = args[2];
    Py_ssize_t count = PyList_GET_SIZE(names);
    uint64_t known = count >= 64 ? ~0ULL : ((1ULL << count) - 1);
    uint64_t mask;
    for (Py_ssize_t e = 0; e < PyList_GET_SIZE(ends); e++) {
        if (!read_end(PyList_GET_ITEM(ends, e), known, &mask)) {
            Py_RETURN_FALSE;
        }
    }
    for (Py_ssize_t e = 0; e < PyList_GET_SIZE(ends); e++) {
        PyObject *end = PyList_GET_ITEM(ends, e);
        Py_INCREF(end);
        if (!read_end(end, ~0ULL, &mask)) {
            Py_DECREF(end);
            PyErr_SetString(PyExc_RuntimeError, "spread_ends: ends changed while read");
            return NULL;
        }
        PyObject *length = PyTuple_GET_ITEM(end, 0);
        int empty = PyObject_Not(length);
        if (empty < 0) {
            Py_DECREF(end);
            return NULL;
        }
        while (!empty && mask) {
            int bit = __builtin_ctzll(mask);
            mask &= mask - 1;
            if (bit >= PyList_GET_SIZE(names)) {
                Py_DECREF(end);
                PyErr_SetString(PyExc_RuntimeError, "spread_ends: names changed while read");
                return NULL;
            }
            PyObject *name = PyList_GET_ITEM(names, bit);
            if (name == Py_None) {
                continue;
            }
            Py_INCREF(name);
            int failed = PyDict_SetItem(table, name, length) < 0;
            Py_DECREF(name);
            if (failed) {
                Py_DECREF(end);
                return NULL;
            }
        }
        Py_DECREF(end);
    }
    Py_RETURN_TRUE;
}

/* held_from_ends(bits, ends, names, scale) -> list | None
 *
 * MatchedBlocks.held: per name, scale x the length of the first of a walk's ends
 * (length, mask), ascending, whose mask has the name's bit in `bits` (0.0 for an unknown
 * name or no such end), without building the candidates' table. None when a mask or a bit
 * does not fit in 64 bits (or is not an int): the caller then reads the table. `ends` and
 * `names` are read into a snapshot first; a looked-up bit is held while read. */
static PyObject *native_held_from_ends(PyObject *module, PyObject *const *args,
                                       Py_ssize_t nargs) {
    if (nargs != 4 || !PyDict_Check(args[0]) || !PyList_Check(args[1]) ||
        !(PyList_Check(args[2]) || PyTuple_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError,
                        "held_from_ends(bits: dict, ends: list, names: list | tuple, scale)");
        return NULL;
    }
    double scale = PyFloat_AsDouble(args[3]);
    if (scale == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *bits = args[0];
    PyObject *ends = PySequence_Tuple(args[1]);
    if (ends == NULL) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(ends);
    uint64_t *masks = PyMem_Malloc((size_t)(count ? count : 1) * sizeof(uint64_t));
    double *held = PyMem_Malloc((size_t)(count ? count : 1) * sizeof(double));
    PyObject *names = NULL, *out = NULL, *zero = NULL, *result = Py_None;
    if (masks == NULL || held == NULL) {
        result = PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t e = 0; e < count; e++) {
        PyObject *end = PyTuple_GET_ITEM(ends, e);
        uint64_t length;
        if (!PyTuple_Check(end) || PyTuple_GET_SIZE(end) != 2 ||
            !as_u64(PyTuple_GET_ITEM(end, 0), &length) ||
            !as_u64(PyTuple_GET_ITEM(end, 1), &masks[e])) {
            goto done; /* None: the Python path */
        }
        held[e] = (double)length * scale;
    }
    names = PySequence_Tuple(args[2]);
    zero = PyFloat_FromDouble(0.0);
    out = names == NULL ? NULL : PyList_New(PyTuple_GET_SIZE(names));
    if (out == NULL || zero == NULL) {
        result = NULL;
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *found = PyDict_GetItemWithError(bits, PyTuple_GET_ITEM(names, i));
        if (found == NULL && PyErr_Occurred()) {
            result = NULL;
            goto done;
        }
        uint64_t bit = 0;
        if (found != NULL) {
            Py_INCREF(found);
            int fits = as_u64(found, &bit);
            Py_DECREF(found);
            if (!fits) {
                goto done; /* None */
            }
        }
        double value = 0.0;
        for (Py_ssize_t e = 0; bit && e < count; e++) {
            if (masks[e] & bit) {
                value = held[e];
                break;
            }
        }
        PyObject *boxed = value == 0.0 ? Py_NewRef(zero) : PyFloat_FromDouble(value);
        if (boxed == NULL) {
            result = NULL;
            goto done;
        }
        PyList_SET_ITEM(out, i, boxed);
    }
    result = Py_NewRef(out);
done:
    if (result == Py_None) {
        Py_INCREF(Py_None);
    }
    PyMem_Free(masks);
    PyMem_Free(held);
    Py_DECREF(ends);
    Py_XDECREF(names);
    Py_XDECREF(out);
    Py_XDECREF(zero);
    return result;
}

/* -- module --------------------------------------------------------------------------- */

/* The compiled event loops' `start` (where a run starts; below 0: at 0) and the pod's
 * `bit` (a u64: a pod past the 64th bit is the Python loop's). */
static int read_run_start(PyObject *start_obj, PyObject *bit_obj, Py_ssize_t *start,
                          uint64_t *bit) {
    *start = PyLong_AsSsize_t(start_obj);
    if (*start == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (*start < 0) {
        *start = 0;
    }
    if (!as_u64(bit_obj, bit)) {
        PyErr_SetString(PyExc_ValueError, "bit must be an int in [0, 2**64)");
        return -1;
    }
    return 0;
}

/* release_run(entries, held, hashes, start, bit, tiers) -> (stop, known, dropped)
 *
 * Ingest.removed's common case, from hashes[start] on: an engine hash whose entry is one
 * gateway hash (a u64 value) of the pod's base store, a block held on GPU only (absent
 * from `tiers`, the store's tier masks). Its entry goes and `bit` leaves the block's mask
 * in `held`; the block goes with its last bit. The run stops at the first hash that is
 * not that case (no entry, an entry of another context, a block with tier masks, a mask
 * wider than 64 bits, a key that is neither an int nor bytes) and returns its index, for
 * the caller to apply in Python, with the entries removed and the (pod, block) pairs
 * dropped so far. Only ints and exact bytes are looked up, so no Python code runs here. */
static PyObject *native_release_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyObject_TypeCheck(args[0], &U64MapType) ||
        !PyObject_TypeCheck(args[1], &U64MapType) || !PyDict_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "release_run(entries: U64Map, held: U64Map, hashes, start, bit, tiers: dict)");
        return NULL;
    }
    U64Map *entries = (U64Map *)args[0];
    U64Map *held = (U64Map *)args[1];
    PyObject *tiers = args[5];
    Py_ssize_t start;
    uint64_t bit;
    if (read_run_start(args[3], args[4], &start, &bit) < 0) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[2], "block hashes must be a sequence");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t total = PySequence_Fast_GET_SIZE(seq);
    PyObject **hashes = PySequence_Fast_ITEMS(seq);
    Py_ssize_t i = start;
    Py_ssize_t known = 0, dropped = 0;
    for (; i < total; i++) {
        PyObject *key = hashes[i];
        if (!PyLong_CheckExact(key) && !PyBytes_CheckExact(key)) {
            break;
        }
        int is_u64;
        uint64_t u, hash;
        Py_ssize_t pos = lookup(entries, key, &is_u64, &u, &hash);
        if (pos == FOUND_ERROR) {
            Py_DECREF(seq);
            return NULL;
        }
        if (pos < 0 || (entries->objvals && (entries->flags[pos] & F_VALOBJ))) {
            break;
        }
        uint64_t target = entries->items[pos].val;
        if (PyDict_GET_SIZE(tiers)) {
            PyObject *boxed = PyLong_FromUnsignedLongLong(target);
            if (boxed == NULL) {
                Py_DECREF(seq);
                return NULL;
            }
            int tiered = PyDict_Contains(tiers, boxed);
            Py_DECREF(boxed);
            if (tiered < 0) {
                Py_DECREF(seq);
                return NULL;
            }
            if (tiered) {
                break;
            }
        }
        Py_ssize_t block = find_u64(held, target);
        if (block >= 0 && held->objvals && (held->flags[block] & F_VALOBJ)) {
            break;
        }
        delete_at(entries, pos, hash);
        known++;
        if (block < 0) {
            continue;
        }
        dropped++;
        uint64_t mask = held->items[block].val & ~bit;
        if (mask) {
            held->items[block].val = mask;
        } else {
            delete_at(held, block, target);
        }
    }
    Py_DECREF(seq);
    return Py_BuildValue("(nnn)", i, known, dropped);
}

/* store_run(entries, held, engine_hashes, gateway_hashes, start, bit, tiers, now)
 *   -> (stop, applied)
 *
 * Ingest.stored's common case, from engine_hashes[start] on, for an event of the pod's
 * base store on GPU whose engine blocks are gateway blocks (gateway_hashes[i] stands for
 * engine_hashes[i]): an engine hash new to the pod, for a block held on GPU only (absent
 * from `tiers`) that the pod does not hold yet. The entry is added, the block created if
 * new, its mask gains `bit` and its last access is `now`. The run stops, before writing
 * anything of it, at the first hash that is not that case (already an entry, a block with
 * tier masks or already held by the pod, a mask wider than 64 bits, a key that is neither
 * an int nor bytes) and returns its index for the caller to apply in Python, with the
 * entries added so far (each one a new (pod, block) pair). The caller checks the pod's room
 * for the whole event first. Only ints and exact bytes are looked up: no Python code runs
 * here. */
static PyObject *native_store_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyObject_TypeCheck(args[0], &U64MapType) ||
        !PyObject_TypeCheck(args[1], &U64MapType) || !PyList_CheckExact(args[3]) ||
        !PyDict_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "store_run(entries: U64Map, held: U64Map, engine_hashes, "
                        "gateway_hashes: list, start, bit, tiers: dict, now)");
        return NULL;
    }
    U64Map *entries = (U64Map *)args[0];
    U64Map *held = (U64Map *)args[1];
    PyObject *gateway = args[3];
    PyObject *tiers = args[6];
    Py_ssize_t start;
    uint64_t bit;
    if (read_run_start(args[4], args[5], &start, &bit) < 0) {
        return NULL;
    }
    double now = PyFloat_AsDouble(args[7]);
    if (now == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[2], "engine hashes must be a sequence");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t total = Py_MIN(PySequence_Fast_GET_SIZE(seq), PyList_GET_SIZE(gateway));
    PyObject **hashes = PySequence_Fast_ITEMS(seq);
    Py_ssize_t i = start;
    Py_ssize_t applied = 0;
    for (; i < total; i++) {
        PyObject *key = hashes[i];
        uint64_t gw;
        if ((!PyLong_CheckExact(key) && !PyBytes_CheckExact(key)) ||
            !as_u64(PyList_GET_ITEM(gateway, i), &gw)) {
            break;
        }
        int is_u64;
        uint64_t u, hash;
        Py_ssize_t pos = lookup(entries, key, &is_u64, &u, &hash);
        if (pos == FOUND_ERROR) {
            goto error;
        }
        if (pos >= 0) {
            break;
        }
        if (PyDict_GET_SIZE(tiers)) {
            PyObject *boxed = PyLong_FromUnsignedLongLong(gw);
            if (boxed == NULL) {
                goto error;
            }
            int tiered = PyDict_Contains(tiers, boxed);
            Py_DECREF(boxed);
            if (tiered < 0) {
                goto error;
            }
            if (tiered) {
                break;
            }
        }
        Py_ssize_t block = find_u64(held, gw);
        if (block >= 0 && ((held->objvals && (held->flags[block] & F_VALOBJ)) ||
                           (held->items[block].val & bit))) {
            break;
        }
        if (block < 0) {
            block = insert_new(held, NULL, 1, gw, gw);
            if (block < 0) {
                goto error;
            }
        }
        if (ensure_stamps(held) < 0) {
            goto error;
        }
        Py_ssize_t entry = insert_new(entries, key, is_u64, u, hash);
        if (entry < 0) {
            goto error;
        }
        entries->items[entry].val = gw;
        held->items[block].val |= bit;
        held->stamps[block] = now;
        applied++;
    }
    Py_DECREF(seq);
    return Py_BuildValue("(nn)", i, applied);
error:
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"xxh64", (PyCFunction)(void (*)(void))native_xxh64, METH_FASTCALL, NULL},
    {"chain", (PyCFunction)(void (*)(void))native_chain, METH_FASTCALL, NULL},
    {"match_walk", (PyCFunction)(void (*)(void))native_match_walk, METH_FASTCALL, NULL},
    {"spread_ends", (PyCFunction)(void (*)(void))native_spread_ends, METH_FASTCALL, NULL},
    {"held_from_ends", (PyCFunction)(void (*)(void))native_held_from_ends, METH_FASTCALL,
     NULL},
    {"release_run", (PyCFunction)(void (*)(void))native_release_run, METH_FASTCALL, NULL},
    {"store_run", (PyCFunction)(void (*)(void))native_store_run, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "indexer._native",
    .m_doc = "The index's hot primitives, compiled (see indexer/native.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

/* Drawn once per process: maps built before a second initialisation (another
 * interpreter) must keep finding their keys. */
static int draw_slot_secret(void) {
    if (slot_secret_set) {
        return 0;
    }
    PyObject *os = PyImport_ImportModule("os");
    if (os == NULL) {
        return -1;
    }
    PyObject *raw = PyObject_CallMethod(os, "urandom", "i", (int)sizeof(slot_secret));
    Py_DECREF(os);
    if (raw == NULL) {
        return -1;
    }
    if (!PyBytes_Check(raw) || PyBytes_GET_SIZE(raw) != (Py_ssize_t)sizeof(slot_secret)) {
        Py_DECREF(raw);
        PyErr_SetString(PyExc_RuntimeError, "os.urandom returned something else than asked");
        return -1;
    }
    memcpy(&slot_secret, PyBytes_AS_STRING(raw), sizeof(slot_secret));
    Py_DECREF(raw);
    slot_secret_set = 1;
    return 0;
}

/* The interface this build implements (indexer/native.py: NATIVE_INTERFACE): bumped when a
 * function's arguments change, so that a build from an older source is not called. */
#define NATIVE_INTERFACE 4

PyMODINIT_FUNC PyInit__native(void) {
    if (draw_slot_secret() < 0 || PyType_Ready(&U64MapType) < 0 ||
        PyType_Ready(&U64MapIterType) < 0 || PyType_Ready(&StampViewType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) {
        return NULL;
    }
    Py_INCREF(&U64MapType);
    if (PyModule_AddObject(module, "U64Map", (PyObject *)&U64MapType) < 0) {
        Py_DECREF(&U64MapType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&StampViewType);
    if (PyModule_AddObject(module, "StampView", (PyObject *)&StampViewType) < 0) {
        Py_DECREF(&StampViewType);
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "INTERFACE", NATIVE_INTERFACE) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
