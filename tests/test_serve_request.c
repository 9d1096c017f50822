/*
 * test_serve_request.c — the scheduler's per-request state, without an engine:
 *
 *  - memory: a request takes memory for what is in flight (its prompt and a
 *    few events), not for its max_tokens. 64 choices of a chat request that
 *    may run to a 32k context must not take max_tokens-sized buffers each
 *    (counted with mallinfo2, which sees allocations whether or not their
 *    pages were touched).
 *  - timed waits: tb_request_wait's timeout is measured on a monotonic clock.
 *    This program replaces clock_gettime so that CLOCK_REALTIME reads an hour
 *    behind the kernel's (as after the wall clock was stepped): a wait timed
 *    on the wall clock would end at once instead of after its timeout.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "serve/scheduler.h"
#include "tb_test.h"

/* The wall clock as this process reads it lags the kernel's by this much;
 * other clocks are read unchanged (through the system call, not the vDSO). */
static long g_realtime_shift_s = 0;

int clock_gettime(clockid_t id, struct timespec *ts) {
    long r = syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && id == CLOCK_REALTIME) ts->tv_sec -= g_realtime_shift_s;
    return (int)r;
}

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t heap_in_use(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd; /* heap chunks in use + mmapped chunks */
}

#define VOCAB 512
#define CONTEXT 32768
#define CHOICES 64
#define PROMPT 8
#define PER_REQUEST_BOUND (32 * 1024) /* bytes: what a request in flight may hold before it generates */

/* an engine without end tokens, as far as the requests see it */
static const tb_engine_info info = {.vocab_size = VOCAB, .max_seq_len = CONTEXT, .bos_id = -1,
                                    .eos_ids = {-1, -1, -1, -1}};

static void test_memory(void) {
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++) prompt[i] = i + 1;
    for (int streaming = 0; streaming <= 1; streaming++) {
        tb_request_params p = {0};
        p.max_tokens = CONTEXT - PROMPT; /* a chat request without max_tokens */
        p.logprobs = TB_MAX_TOP_LOGPROBS;
        p.max_buffered = streaming ? 1024 : 0;
        tb_sampling_params_default(&p.sampling);
        tb_request *r[CHOICES];
        size_t before = heap_in_use();
        for (int i = 0; i < CHOICES; i++) {
            r[i] = tb_request_new(prompt, PROMPT, &p, &info);
            CHECK(r[i] != NULL);
        }
        size_t used = heap_in_use() - before;
        if (used == 0) { /* 64 requests take something: this allocator is not the one mallinfo2 reports on */
            printf("memory: not measured (malloc is replaced, as under AddressSanitizer)\n");
            for (int i = 0; i < CHOICES; i++) tb_request_release(r[i]);
            return;
        }
        CHECK_MSG(used <= (size_t)CHOICES * PER_REQUEST_BOUND,
                  "%s: %d requests with max_tokens %d took %zu bytes (%zu each; bound %d): sized by max_tokens",
                  streaming ? "streaming" : "non-streaming", CHOICES, p.max_tokens, used, used / CHOICES,
                  PER_REQUEST_BOUND);
        printf("%s: %d requests with max_tokens %d hold %zu bytes (%zu each)\n",
               streaming ? "streaming" : "non-streaming", CHOICES, p.max_tokens, used, used / CHOICES);
        for (int i = 0; i < CHOICES; i++) tb_request_release(r[i]);
    }
}

static void test_monotonic_wait(void) {
    int32_t prompt[2] = {1, 2};
    tb_request_params p = {0};
    p.max_tokens = 4;
    p.logprobs = -1;
    tb_sampling_params_default(&p.sampling);
    tb_request *r = tb_request_new(prompt, 2, &p, &info);
    CHECK(r != NULL);
    if (!r) return;
    const double timeout = 0.3;
    for (int shifted = 0; shifted <= 1; shifted++) {
        g_realtime_shift_s = shifted ? 3600 : 0;
        tb_finish_reason fr = TB_FINISH_NONE;
        tb_token_event ev[1];
        double t0 = mono_now();
        int n = tb_request_wait(r, ev, 1, &fr, timeout);
        double dt = mono_now() - t0;
        CHECK(n == 0);
        CHECK(fr == TB_FINISH_NONE);
        CHECK_MSG(dt >= timeout * 0.9 && dt < timeout + 5,
                  "a %.1f s wait with the wall clock %s lasted %.3f s", timeout,
                  shifted ? "an hour off" : "unchanged", dt);
    }
    g_realtime_shift_s = 0;
    tb_request_release(r);
}

int main(void) {
    test_memory();
    test_monotonic_wait();
    return tb_test_finish("test_serve_request");
}
