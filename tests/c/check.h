/* Tiny assertion helpers shared by the C tests. */
#ifndef REDLOCK_MUX_TEST_CHECK_H
#define REDLOCK_MUX_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redlock_mux.h"

static int checks_run = 0;

/* Fails the program, naming the line, when `cond` is false. */
#define CHECK(cond)                                                                         \
    do {                                                                                    \
        checks_run++;                                                                       \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);        \
            exit(100);                                                                      \
        }                                                                                   \
    } while (0)

/* Fails the program, naming both codes and the last error message, unless `call` returns
 * `want`. */
#define CHECK_RESULT(call, want)                                                            \
    do {                                                                                    \
        redlock_mux_result got_ = (call);                                                   \
        checks_run++;                                                                       \
        if (got_ != (want)) {                                                               \
            char msg_[1024] = "";                                                           \
            size_t n_ = 0;                                                                  \
            redlock_mux_last_error_message(msg_, sizeof msg_, &n_);                         \
            fprintf(stderr, "%s:%d: %s returned %u (%s), expected %u (%s); last error: %s\n", \
                    __FILE__, __LINE__, #call, (unsigned)got_, redlock_mux_result_text(got_), \
                    (unsigned)(want), redlock_mux_result_text(want), msg_);                 \
            exit(100);                                                                      \
        }                                                                                   \
    } while (0)

#define CHECK_OK(call) CHECK_RESULT(call, REDLOCK_MUX_OK)

/* The message of the last failure on this thread (static buffer). */
static const char *last_error(void) {
    static char buf[4096];
    size_t n = 0;
    if (redlock_mux_last_error_message(buf, sizeof buf, &n) != REDLOCK_MUX_OK) {
        return "(no message)";
    }
    return buf;
}

/* A client over the given URLs, or exits. The node timeout is generous because the tests also
 * run under valgrind, which makes every reply slow to arrive. */
static redlock_mux_client *make_client(int count, char **urls, uint64_t wait_timeout_ms) {
    redlock_mux_client_builder *b = NULL;
    redlock_mux_client *c = NULL;
    int i;
    CHECK_OK(redlock_mux_client_builder_new(&b));
    for (i = 0; i < count; i++) {
        CHECK_OK(redlock_mux_client_builder_add_node(b, urls[i], strlen(urls[i])));
    }
    CHECK_OK(redlock_mux_client_builder_set_wait_timeout_ms(b, wait_timeout_ms));
    CHECK_OK(redlock_mux_client_builder_set_node_timeout_ms(b, 1000));
    CHECK_OK(redlock_mux_client_builder_build(b, &c));
    redlock_mux_client_builder_free(b);
    return c;
}

#endif
