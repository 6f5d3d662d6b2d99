/* cache.h: the response cache (cache.c), private to the negotiation (negotiate.c). Every rank
 * updates its cache from the agreed responses alone, so slot numbers agree everywhere. bg only. */
#ifndef HVLITE_CACHE_H
#define HVLITE_CACHE_H

#include "request.h"

typedef struct hvl_cache hvl_cache;
int hvl__cache_create(hvl_cache **out, int capacity);
void hvl__cache_destroy(hvl_cache *c);                              /* NULL is fine */
int hvl__cache_capacity(const hvl_cache *c);
int hvl__cache_find(const hvl_cache *c, const hvl_desc *d);        /* slot or -1 (same name, matches) */
const hvl_response *hvl__cache_slot(const hvl_cache *c, int slot); /* NULL if empty */
void hvl__cache_touch(hvl_cache *c, int slot);
int hvl__cache_put(hvl_cache *c, const hvl_response *r);           /* copies r; OK responses only */
void hvl__cache_erase(hvl_cache *c, const char *name);
void hvl__cache_erase_set(hvl_cache *c, int set);                  /* every response of a set */

#endif /* HVLITE_CACHE_H */
