/*
 * batcher.h — the dynamic batcher of general engines (ONNX-built, tb_exec),
 * as Triton's: requests for one model wait in one queue; a worker per
 * instance (its own tb_exec, the threads split between instances) takes up
 * to max_batch_size rows of requests whose non-batch dims match, prefers a
 * preferred size, waits at most max_queue_delay_us (from the oldest request)
 * for more, concatenates the inputs along dim 0, runs the engine once and
 * splits the outputs back by rows. docs/BATCHING.md describes it for users.
 *
 *   tb_batcher_config c;  tb_batcher_config_default(&c);  c.max_batch_size = 8; ...
 *   tb_batcher *b;        tb_batcher_create(engine, &c, &b);
 *   tb_batcher_result r;  tb_batcher_infer(b, inputs, n_in, 0, &r);   // blocks
 *   ... r.outputs[i] ...; tb_batcher_result_free(&r);
 *   tb_batcher_free(b);   // runs what is queued, then stops
 *
 * Ownership: the engine outlives the batcher (the batcher does not free
 * it); a request's input tensors are read only while tb_batcher_infer runs
 * (the caller keeps them); a result's outputs own their memory until
 * tb_batcher_result_free. tb_batcher_infer may be called from any number of
 * threads at once; tb_batcher_free must not race with them (the server
 * stops taking requests first), but callers already waiting are served.
 */
#ifndef TB_SERVE_BATCHER_H
#define TB_SERVE_BATCHER_H

#include <stdint.h>

#include "turbine/turbine.h"

#define TB_BATCHER_MAX_IO 16           /* inputs and outputs of one engine   */
#define TB_BATCHER_MAX_PREFERRED 16    /* entries of preferred_batch_size    */
#define TB_BATCHER_MAX_BATCH 4096      /* max_batch_size bound               */
#define TB_BATCHER_MAX_INSTANCES 64
#define TB_BATCHER_WARMUP_MAX 64       /* batch sizes warm-up runs at most   */

typedef struct {
    /* Rows (dim 0, summed over merged requests) of one engine call; 0 or 1:
     * requests never merged, each run as it came. Forced to 1 when the
     * engine's dim 0 is not dynamic in its profile, and lowered to the
     * profile's largest dim 0 (tb_batcher_note says so). */
    int max_batch_size;
    /* Sizes worth sending at once without waiting for the delay (Triton's
     * preferred_batch_size); each in [1, max_batch_size]. */
    int preferred_batch_size[TB_BATCHER_MAX_PREFERRED];
    int n_preferred;
    /* How long the oldest waiting request may wait for others to join it
     * before a smaller batch is sent; 0: send what is there at once. */
    int64_t max_queue_delay_us;
    /* Requests waiting (not yet running) at most; beyond it a request is
     * refused at once with TB_ERR_QUEUE_FULL. 0: no limit. */
    int max_queue_size;
    /* A request's deadline when tb_batcher_infer gets timeout_us 0; 0: none. */
    int64_t default_timeout_us;
    int instance_count;        /* workers, a tb_exec each; default 1          */
    int threads_per_instance;  /* 0: the cores divided among the instances    */
    const char *device;        /* NULL: the backend the engine was built for  */
    /* Before the workers start, each instance runs every batch size a merged
     * call can have (1..max_batch_size, at most TB_BATCHER_WARMUP_MAX of
     * them) twice with zero inputs (non-batch dims: the profile's opt), so
     * that no request pays for a shape's first run (a GPU captures each
     * shape's CUDA graph, on its second run). -1 (default): on for GPU
     * instances, off on the CPU; 0 off; 1 on. */
    int warmup;
} tb_batcher_config;

/* max_batch_size 8, no preferred sizes, 0 delay, queue 1024, no timeout,
 * one instance, threads and device from the machine and the engine, warm-up
 * on GPUs. */
void tb_batcher_config_default(tb_batcher_config *c);

typedef struct tb_batcher tb_batcher;

/* Makes the instances (tb_exec_create each) and starts their workers.
 * TB_ERR_INVALID_ARG for a config out of range (the message names the
 * field), TB_ERR_UNSUPPORTED for an LLM engine (served by the scheduler). */
tb_status tb_batcher_create(tb_engine *e, const tb_batcher_config *c, tb_batcher **out);
/* Stops taking requests, runs every queued one (their callers get their
 * results), joins the workers and frees the instances. NULL is fine. */
void tb_batcher_free(tb_batcher *b);

/* What the batcher runs with after the engine was looked at. */
int tb_batcher_max_batch_size(const tb_batcher *b);  /* 1: no merging        */
/* Why max_batch_size was changed from the config's ("" when it was not). */
const char *tb_batcher_note(const tb_batcher *b);
int tb_batcher_n_inputs(const tb_batcher *b);
int tb_batcher_n_outputs(const tb_batcher *b);
/* The engine's inputs / outputs (names, dtypes, profile ranges) for metadata. */
tb_status tb_batcher_input_info(const tb_batcher *b, int i, tb_io_info *out);
tb_status tb_batcher_output_info(const tb_batcher *b, int i, tb_io_info *out);

typedef struct {
    int n_outputs;
    /* The request's rows of each output: (rows, ...) where the engine call
     * had the merged rows; data malloc'ed, owned by the result. */
    tb_tensor outputs[TB_BATCHER_MAX_IO];
    int batch_size;            /* rows of the engine call it ran in           */
    int n_requests;            /* requests merged into that call              */
    int64_t queue_us;          /* from tb_batcher_infer to the call's start   */
    int64_t compute_us;        /* the call: concatenation, run and split      */
    void *block_;              /* the one allocation behind outputs[].data    */
} tb_batcher_result;

/* Runs one request and blocks until its result. in: the engine's inputs in
 * order, dtypes as the engine's; dim 0 of each is the request's rows (the
 * same for all inputs) when the engine batches. timeout_us: the deadline
 * from now before the request starts running (0: the config's default,
 * negative: none). Errors (r is zeroed): TB_ERR_INVALID_ARG / TB_ERR_RANGE
 * for inputs the engine cannot take (checked before queueing),
 * TB_ERR_QUEUE_FULL, TB_ERR_TIMEOUT, or the engine's own error. A merged
 * call that fails is run again one request at a time, so a request fails
 * only for its own sake. */
tb_status tb_batcher_infer(tb_batcher *b, const tb_tensor *in, int n_in, int64_t timeout_us,
                           tb_batcher_result *r);
void tb_batcher_result_free(tb_batcher_result *r);

/* Histograms: counts per bucket (not cumulative); bucket i holds values <=
 * TB_BATCHER_US_BOUNDS[i] and above the previous bound, the last one the
 * rest. Batch sizes: bucket i counts engine calls of exactly i rows for
 * i < TB_BATCHER_BATCH_BUCKETS - 1, the last one every larger call. */
#define TB_BATCHER_US_BUCKETS 15
extern const int64_t TB_BATCHER_US_BOUNDS[TB_BATCHER_US_BUCKETS - 1];
#define TB_BATCHER_BATCH_BUCKETS 65

typedef struct {
    uint64_t requests;         /* accepted into the queue                     */
    uint64_t success;          /* requests that got outputs                   */
    uint64_t failures;         /* engine errors                               */
    uint64_t timeouts;         /* TB_ERR_TIMEOUT                              */
    uint64_t rejected;         /* TB_ERR_QUEUE_FULL                           */
    uint64_t invalid;          /* refused before queueing (bad inputs)        */
    uint64_t inferences;       /* rows computed (Triton's inference count)    */
    uint64_t executions;       /* engine calls (Triton's execution count)     */
    uint64_t direct;           /* run on their caller's thread: alone in the
                                  queue, due at once, an instance idle        */
    int pending;               /* waiting in the queue now                    */
    int running;               /* in an engine call now                       */
    uint64_t queue_us_hist[TB_BATCHER_US_BUCKETS];
    uint64_t compute_us_hist[TB_BATCHER_US_BUCKETS];
    uint64_t queue_us_sum, compute_us_sum; /* over successful requests        */
    uint64_t batch_hist[TB_BATCHER_BATCH_BUCKETS]; /* per engine call         */
    uint64_t warmup_runs;      /* engine calls of the warm-up (not above)     */
} tb_batcher_stats;

/* A consistent snapshot of the counters since create. */
void tb_batcher_get_stats(tb_batcher *b, tb_batcher_stats *out);

#endif
