/*
 * kserve_data.h — the "data" arrays of a KServe v2 infer request read
 * straight from the JSON text into the tensor's buffer, without jansson.
 *
 * jansson builds a json_t per element, which for an image-sized input
 * (150,528 floats) costs about a hundred times the engine call of a small
 * model. tb_ks_parse_infer (kserve.c) therefore first finds the spans of
 * the inputs[].data arrays (tb_ks_data_scan), hands jansson the rest of
 * the request with each such array replaced by [], and reads each span
 * itself: counted first (tb_ks_data_count: nothing is allocated before the
 * values are counted against the shape), then converted into the buffer
 * (tb_ks_data_fill) with the same values jansson would give (integers
 * through int64, reals through a correctly rounded decimal conversion) and
 * the same refusals (type, range, nesting, count).
 *
 * Anything the scanner does not expect (an escaped key, a key given twice,
 * nesting past its bound, broken syntax around a span) makes it give up,
 * and the whole request goes to jansson as before: the fast path never
 * decides whether a request is valid, the strict per-span reader and
 * jansson on the rest do.
 */
#ifndef TB_SERVE_KSERVE_DATA_H
#define TB_SERVE_KSERVE_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "serve/kserve.h"

typedef struct {
    size_t off, len; /* the array's bytes in the JSON text, '[' to ']' */
    int input;       /* its object's position in the "inputs" array */
} tb_ks_span;

#define TB_KS_MAX_DEPTH 512 /* nesting the scanner follows before giving up */

/* The spans of the inputs[].data arrays of the JSON object at the start of
 * text (n bytes; what follows the object is not read). Returns how many
 * (at most cap, in text order), or -1 when the text is not scanned (the
 * caller lets jansson read it all). */
int tb_ks_data_scan(const char *text, size_t n, tb_ks_span *spans, int cap);

/* The values in the array at p (n bytes, one JSON array, validated
 * strictly), nested at most `depth` arrays deep, into *count. Returns 200,
 * or 400 with the message in e (input `name` of type t): not valid JSON,
 * nested deeper than the shape, a value that is no number or true/false
 * (a string, null, an object). */
int tb_ks_data_count(const char *p, size_t n, int depth, const char *name, tb_dtype t, int64_t *count,
                     tb_ks_error *e);

/* Converts the `want` values of the array at p (counted before) into dst
 * as type t (a numeric type or BOOL; not BYTES). Returns 200, or 400 with
 * the message of the first value that is not of the type or out of its
 * range. */
int tb_ks_data_fill(const char *p, size_t n, const char *name, tb_dtype t, void *dst, int64_t want, tb_ks_error *e);

#endif
