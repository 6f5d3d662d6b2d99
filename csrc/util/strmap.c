/* strmap.c: an open-addressing hash map from C strings to pointers. Not thread-safe: each map
 * is guarded by its owner (each names its lock). The map borrows keys; they must outlive the entry. */
#include <stdlib.h>
#include <string.h>
#include "util.h"

static const char tombstone[] = "";  /* marks a deleted slot; compared by address */

static size_t hash(const char *s) { return (size_t)hvl__hash(s, strlen(s), HVL_HASH_SEED); }

int hvl__strmap_live(const hvl_strmap *m, size_t i)
{
    return m->slots[i].key != NULL && m->slots[i].key != tombstone;
}

/* Index of key's slot, or of the slot where it would go (first tombstone or empty). */
static size_t probe(const hvl_strmap *m, const char *key)
{
    size_t mask = m->cap - 1, i = hash(key) & mask, free_slot = (size_t)-1;
    for (;; i = (i + 1) & mask) {
        const char *k = m->slots[i].key;
        if (k == NULL) return free_slot != (size_t)-1 ? free_slot : i;
        if (k == tombstone) { if (free_slot == (size_t)-1) free_slot = i; continue; }
        if (strcmp(k, key) == 0) return i;
    }
}

static int rehash(hvl_strmap *m, size_t cap)
{
    hvl_strmap next = {calloc(cap, sizeof(hvl_strmap_slot)), cap, 0, 0};
    if (!next.slots) return hvl__oom("growing a hash map");
    for (size_t i = 0; i < m->cap; i++)
        if (hvl__strmap_live(m, i)) next.slots[probe(&next, m->slots[i].key)] = m->slots[i], next.count++;
    free(m->slots);
    *m = next;
    return HVL_OK;
}

int hvl__strmap_put(hvl_strmap *m, const char *key, void *value)
{
    if ((m->count + m->tombstones + 1) * 4 >= m->cap * 3)
        HVL_CHECK(rehash(m, m->cap < 16 ? 16 : (m->count * 2 >= m->cap ? m->cap * 2 : m->cap)));
    size_t i = probe(m, key);
    if (!hvl__strmap_live(m, i)) {
        if (m->slots[i].key == tombstone) m->tombstones--;
        m->count++;
    }
    m->slots[i].key = key;
    m->slots[i].value = value;
    return HVL_OK;
}

void *hvl__strmap_get(const hvl_strmap *m, const char *key)
{
    if (m->count == 0) return NULL;
    size_t i = probe(m, key);
    return hvl__strmap_live(m, i) ? m->slots[i].value : NULL;
}

void *hvl__strmap_del(hvl_strmap *m, const char *key)
{
    if (m->count == 0) return NULL;
    size_t i = probe(m, key);
    if (!hvl__strmap_live(m, i)) return NULL;
    void *old = m->slots[i].value;
    m->slots[i].key = tombstone;
    m->slots[i].value = NULL;
    m->count--;
    m->tombstones++;
    return old;
}

void hvl__strmap_free(hvl_strmap *m)
{
    free(m->slots);
    memset(m, 0, sizeof(*m));
}
