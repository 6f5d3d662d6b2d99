/* cache.c: the response cache. Every rank runs the same responses in the same order and
 * updates its cache from them alone, so slot numbers agree on every rank without messages;
 * a slot number is the bit a rank sets to say "ready" on the fast path. Least recently used
 * entries are evicted. bg thread only. */
#include <stdlib.h>
#include <string.h>
#include "cache.h"

struct hvl_cache {
    int capacity;
    hvl_response *slots;     /* slots[i].name == NULL: empty */
    int64_t *last_used;      /* tick of last put/touch, for LRU */
    int64_t tick;
    hvl_strmap by_name;      /* name -> slot index + 1 (keys borrowed from slots[]) */
};

int hvl__cache_create(hvl_cache **out, int capacity)
{
    hvl_cache *c = calloc(1, sizeof(*c));
    if (!c) return hvl__oom("the response cache");
    c->capacity = capacity;
    c->slots = calloc((size_t)(capacity ? capacity : 1), sizeof(hvl_response));
    c->last_used = calloc((size_t)(capacity ? capacity : 1), sizeof(int64_t));
    if (!c->slots || !c->last_used) { hvl__cache_destroy(c); return hvl__oom("the response cache"); }
    *out = c;
    return HVL_OK;
}

static void clear_slot(hvl_cache *c, int i)
{
    if (!c->slots[i].d.name) return;
    hvl__strmap_del(&c->by_name, c->slots[i].d.name);
    free(c->slots[i].d.name);
    free(c->slots[i].error);
    memset(&c->slots[i], 0, sizeof(hvl_response));
}

void hvl__cache_destroy(hvl_cache *c)
{
    if (!c) return;
    for (int i = 0; c->slots && i < c->capacity; i++) clear_slot(c, i);
    hvl__strmap_free(&c->by_name);
    free(c->slots);
    free(c->last_used);
    free(c);
}

int hvl__cache_capacity(const hvl_cache *c) { return c->capacity; }

int hvl__cache_find(const hvl_cache *c, const hvl_desc *d)
{
    intptr_t v = (intptr_t)hvl__strmap_get(&c->by_name, d->name);
    if (!v) return -1;
    return hvl__desc_matches(&c->slots[v - 1].d, d) ? (int)(v - 1) : -1;
}

const hvl_response *hvl__cache_slot(const hvl_cache *c, int slot)
{
    return slot >= 0 && slot < c->capacity && c->slots[slot].d.name ? &c->slots[slot] : NULL;
}

void hvl__cache_touch(hvl_cache *c, int slot) { c->last_used[slot] = ++c->tick; }

int hvl__cache_put(hvl_cache *c, const hvl_response *r)
{
    /* Whole-job ops are never cached: set changes are one-off, and a cached join would sit on the
     * bit path, unseen by rank 0, while the other ranks wait for the joined rank to stand in for
     * their tensors. */
    if (c->capacity == 0 || r->status != HVL_OK || hvl__op_is(r->d.op, HVL_OPF_WHOLE_JOB)) return HVL_OK;
    hvl__cache_erase(c, r->d.name);
    int victim = 0;
    for (int i = 0; i < c->capacity; i++) {
        if (!c->slots[i].d.name) { victim = i; break; }
        if (c->last_used[i] < c->last_used[victim]) victim = i;
    }
    clear_slot(c, victim);
    hvl_response *s = &c->slots[victim];
    *s = *r;
    s->error = NULL;
    s->d.name = strdup(r->d.name);
    if (!s->d.name) return hvl__oom("a response cache entry");
    c->last_used[victim] = ++c->tick;
    return hvl__strmap_put(&c->by_name, s->d.name, (void *)(intptr_t)(victim + 1));
}

void hvl__cache_erase(hvl_cache *c, const char *name)
{
    intptr_t v = (intptr_t)hvl__strmap_get(&c->by_name, name);
    if (v) clear_slot(c, (int)(v - 1));
}

void hvl__cache_erase_set(hvl_cache *c, int set)
{
    for (int i = 0; i < c->capacity; i++)
        if (c->slots[i].d.name && c->slots[i].d.process_set == set) clear_slot(c, i);
}
