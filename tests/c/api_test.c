/*
 * Tests of the C API against real redis-server processes, whose URLs are the arguments.
 * Prints "N passed, 0 failed" and exits 0, or names the failing check and exits non-zero.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep, inet_pton, clock_gettime */

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

/* Distinct addresses the library must leave untouched when a call fails. */
static int sentinel_storage[4];
#define SENTINEL(type, i) ((type *)(void *)&sentinel_storage[i])

static const uint8_t KEY[] = {'c', '-', 'a', 'p', 'i', 0, 'k', 'e', 'y'}; /* binary, with NUL */

static void test_static_text(void) {
    char version[64];
    CHECK(strcmp(redlock_mux_result_text(REDLOCK_MUX_OK), "ok") == 0);
    CHECK(strstr(redlock_mux_result_text(REDLOCK_MUX_CONTENDED), "contended") != NULL);
    CHECK(strstr(redlock_mux_result_text(REDLOCK_MUX_UNSUPPORTED), "not supported") != NULL);
    CHECK(strcmp(redlock_mux_result_text(12345), "unknown result code") == 0);
    /* The library loaded is the one this header came with. */
    snprintf(version, sizeof version, "%d.%d.%d", REDLOCK_MUX_VERSION_MAJOR,
             REDLOCK_MUX_VERSION_MINOR, REDLOCK_MUX_VERSION_PATCH);
    CHECK(strcmp(redlock_mux_version(), version) == 0);
    /* The numbers are part of the ABI. */
    CHECK(REDLOCK_MUX_OK == 0 && REDLOCK_MUX_NULL_PARAMETER == 1 &&
          REDLOCK_MUX_INVALID_ARGUMENT == 2 && REDLOCK_MUX_CONTENDED == 3 &&
          REDLOCK_MUX_QUORUM_UNREACHABLE == 4 && REDLOCK_MUX_VALIDITY_EXPIRED == 5 &&
          REDLOCK_MUX_IO == 6 && REDLOCK_MUX_BUFFER_TOO_SMALL == 7 && REDLOCK_MUX_RELEASED == 8 &&
          REDLOCK_MUX_PANIC == 9 && REDLOCK_MUX_CONFIG == 10 && REDLOCK_MUX_CANCELLED == 11 &&
          REDLOCK_MUX_UNSUPPORTED == 12);
    CHECK(REDLOCK_MUX_DEADLINE_NONE == 0 && REDLOCK_MUX_DEADLINE_WAIT_TIMEOUT == 1 &&
          REDLOCK_MUX_DEADLINE_RETRY_COUNT == 2 && REDLOCK_MUX_DEADLINE_VALIDITY == 3 &&
          REDLOCK_MUX_DEADLINE_NODE_TIMEOUT == 4);
    CHECK(REDLOCK_MUX_KIND_MUTEX == 1 && REDLOCK_MUX_KIND_READ == 2 && REDLOCK_MUX_KIND_WRITE == 3 &&
          REDLOCK_MUX_KIND_ALL == 4 && REDLOCK_MUX_KIND_FENCED_MUTEX == 5 &&
          REDLOCK_MUX_KIND_FENCED_WRITE == 6 && REDLOCK_MUX_KIND_SEMAPHORE == 7);
}

static void test_null_parameters(redlock_mux_client *client) {
    redlock_mux_client_builder *b = SENTINEL(redlock_mux_client_builder, 0);
    redlock_mux_client *c = SENTINEL(redlock_mux_client, 1);
    redlock_mux_lock *l = SENTINEL(redlock_mux_lock, 2);
    uint8_t buf[64];
    size_t n = 777;
    uint64_t ms = 777;
    const char url[] = "127.0.0.1:6379";

    CHECK_RESULT(redlock_mux_client_builder_new(NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK(strstr(last_error(), "out") != NULL);
    CHECK_RESULT(redlock_mux_client_builder_add_node(NULL, url, strlen(url)),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_builder_set_node_timeout_ms(NULL, 5), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_builder_set_connect_timeout_ms(NULL, 5),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_builder_set_retry_count(NULL, 5), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_builder_set_retry_delay_ms(NULL, 5), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_builder_set_wait_timeout_ms(NULL, 5), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_builder_set_drift_factor(NULL, 0.1), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_builder_set_fair(NULL, 1), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_builder_set_fair_after_ms(NULL, 5), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_builder_build(NULL, &c), REDLOCK_MUX_NULL_PARAMETER);
    CHECK(c == SENTINEL(redlock_mux_client, 1));

    CHECK_OK(redlock_mux_client_builder_new(&b));
    CHECK_RESULT(redlock_mux_client_builder_add_node(b, NULL, 0), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_builder_add_node(b, NULL, 5), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_OK(redlock_mux_client_builder_add_node(b, url, strlen(url)));
    CHECK_RESULT(redlock_mux_client_builder_build(b, NULL), REDLOCK_MUX_NULL_PARAMETER);
    redlock_mux_client_builder_free(b);

    CHECK_RESULT(redlock_mux_client_try_lock(NULL, KEY, sizeof KEY, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_lock(client, NULL, 3, 1000, &l), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_lock(NULL, KEY, sizeof KEY, 1000, NULL, &l), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_lock(client, NULL, 3, 1000, NULL, &l), REDLOCK_MUX_NULL_PARAMETER);
    CHECK(l == SENTINEL(redlock_mux_lock, 2));
    /* A NULL out is refused before the lock is taken: the key stays free. */
    CHECK_RESULT(redlock_mux_client_try_lock(client, KEY, sizeof KEY, 1000, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_lock(client, KEY, sizeof KEY, 1000, NULL, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);
    l = NULL;
    CHECK_OK(redlock_mux_client_try_lock(client, KEY, sizeof KEY, 5000, &l));

    CHECK_RESULT(redlock_mux_lock_extend(NULL, 1000), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_validity_ms(NULL, &ms), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_validity_ms(l, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_token(NULL, buf, sizeof buf, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_token(l, NULL, sizeof buf, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_token(l, buf, sizeof buf, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_release(NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK(ms == 777 && n == 777);
    CHECK_OK(redlock_mux_lock_release(l));
    redlock_mux_lock_free(l);

    CHECK_RESULT(redlock_mux_last_error_message(NULL, 10, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_last_error_message((char *)buf, sizeof buf, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);

    /* Every _free accepts NULL. */
    redlock_mux_client_builder_free(NULL);
    redlock_mux_client_free(NULL);
    redlock_mux_lock_free(NULL);
}

/* Builds a client from one URL and a tweak; returns the build result, checks `out` on failure. */
static redlock_mux_result build_one(const char *url, size_t url_len, int tweak) {
    redlock_mux_client_builder *b = NULL;
    redlock_mux_client *c = SENTINEL(redlock_mux_client, 3);
    redlock_mux_result r;
    CHECK_OK(redlock_mux_client_builder_new(&b));
    if (url != NULL) {
        r = redlock_mux_client_builder_add_node(b, url, url_len);
        if (r != REDLOCK_MUX_OK) {
            redlock_mux_client_builder_free(b);
            return r;
        }
    }
    switch (tweak) {
    case 1: CHECK_OK(redlock_mux_client_builder_set_drift_factor(b, 0.7)); break;
    case 2: CHECK_OK(redlock_mux_client_builder_set_node_timeout_ms(b, 0)); break;
    case 3: CHECK_OK(redlock_mux_client_builder_set_connect_timeout_ms(b, 0)); break;
    default: break;
    }
    r = redlock_mux_client_builder_build(b, &c);
    redlock_mux_client_builder_free(b);
    if (r == REDLOCK_MUX_OK) {
        redlock_mux_client_free(c);
    } else {
        CHECK(c == SENTINEL(redlock_mux_client, 3));
    }
    return r;
}

static void test_bad_arguments(redlock_mux_client *client) {
    redlock_mux_lock *l = SENTINEL(redlock_mux_lock, 0);
    uint8_t *big;
    char small[4];
    size_t n = 777;

    CHECK_RESULT(build_one(NULL, 0, 0), REDLOCK_MUX_INVALID_ARGUMENT); /* no nodes */
    CHECK(strstr(last_error(), "no nodes") != NULL);
    CHECK_RESULT(build_one("redis://127.0.0.1:notaport", 26, 0), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(strstr(last_error(), "notaport") != NULL);
    CHECK_RESULT(build_one("\xff\xfe:1", 4, 0), REDLOCK_MUX_INVALID_ARGUMENT); /* not UTF-8 */
    CHECK(strstr(last_error(), "UTF-8") != NULL);
    CHECK_RESULT(build_one("127.0.0.1:6379", 14, 1), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(strstr(last_error(), "drift_factor") != NULL);
    CHECK_RESULT(build_one("127.0.0.1:6379", 14, 2), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(strstr(last_error(), "node_timeout") != NULL);
    CHECK_RESULT(build_one("127.0.0.1:6379", 14, 3), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_OK(build_one("127.0.0.1:6379 trailing", 14, 0)); /* only url_len bytes are read */

    CHECK_RESULT(redlock_mux_client_try_lock(client, KEY, 0, 1000, &l), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(strstr(last_error(), "empty") != NULL);
    CHECK_RESULT(redlock_mux_client_try_lock(client, KEY, sizeof KEY, 0, &l),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(strstr(last_error(), "TTL") != NULL);
    CHECK_RESULT(redlock_mux_client_lock(client, KEY, sizeof KEY, 1, NULL, &l), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_RESULT(redlock_mux_client_try_lock(client, KEY, sizeof KEY, UINT64_MAX, &l),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    big = calloc(REDLOCK_MUX_MAX_KEY_LEN + 1, 1);
    CHECK(big != NULL);
    CHECK_RESULT(redlock_mux_client_try_lock(client, big, REDLOCK_MUX_MAX_KEY_LEN + 1, 1000, &l),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(strstr(last_error(), "long") != NULL);
    free(big);
    CHECK_RESULT(redlock_mux_client_try_lock(client, KEY, SIZE_MAX, 1000, &l),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(l == SENTINEL(redlock_mux_lock, 0));

    /* The message buffer must hold the message and a NUL, or nothing is written. */
    CHECK(redlock_mux_last_error_length() > sizeof small);
    memcpy(small, "abc", 4);
    CHECK_RESULT(redlock_mux_last_error_message(small, sizeof small, &n),
                 REDLOCK_MUX_BUFFER_TOO_SMALL);
    CHECK(n == 777 && strcmp(small, "abc") == 0);
    CHECK(strstr(last_error(), "long") != NULL); /* asking did not overwrite it */
    CHECK(strlen(last_error()) == redlock_mux_last_error_length());
}

static void test_lock_and_unlock(redlock_mux_client *client) {
    redlock_mux_lock *a = NULL, *b = SENTINEL(redlock_mux_lock, 1), *c = NULL;
    uint8_t token[REDLOCK_MUX_TOKEN_LEN], other[REDLOCK_MUX_TOKEN_LEN];
    uint8_t tiny[REDLOCK_MUX_TOKEN_LEN - 1];
    size_t n = 777, i;
    uint64_t ms = 0;

    CHECK_OK(redlock_mux_client_try_lock(client, KEY, sizeof KEY, 10000, &a));
    CHECK_OK(redlock_mux_lock_validity_ms(a, &ms));
    CHECK(ms > 9000 && ms <= 10000);
    CHECK_RESULT(redlock_mux_lock_token(a, tiny, sizeof tiny, &n), REDLOCK_MUX_BUFFER_TOO_SMALL);
    CHECK(n == 777);
    CHECK_OK(redlock_mux_lock_token(a, token, sizeof token, &n));
    CHECK(n == REDLOCK_MUX_TOKEN_LEN);
    for (i = 0; i < n; i++) {
        CHECK(strchr("0123456789abcdef", token[i]) != NULL && token[i] != 0);
    }

    /* Held: a second attempt, through the same client, is refused. */
    CHECK_RESULT(redlock_mux_client_try_lock(client, KEY, sizeof KEY, 10000, &b),
                 REDLOCK_MUX_CONTENDED);
    CHECK(b == SENTINEL(redlock_mux_lock, 1));
    CHECK(strstr(last_error(), "held elsewhere") != NULL);
    /* A key that differs only after its NUL byte is another lock. */
    CHECK_OK(redlock_mux_client_try_lock(client, KEY, sizeof KEY - 1, 10000, &c));
    CHECK_OK(redlock_mux_lock_release(c));
    redlock_mux_lock_free(c);

    CHECK_OK(redlock_mux_lock_extend(a, 20000));
    CHECK_OK(redlock_mux_lock_validity_ms(a, &ms));
    CHECK(ms > 10000 && ms <= 20000);
    CHECK_RESULT(redlock_mux_lock_extend(a, 0), REDLOCK_MUX_INVALID_ARGUMENT);

    CHECK_OK(redlock_mux_lock_release(a));
    CHECK_RESULT(redlock_mux_lock_release(a), REDLOCK_MUX_RELEASED);
    CHECK_RESULT(redlock_mux_lock_extend(a, 1000), REDLOCK_MUX_RELEASED);
    CHECK_RESULT(redlock_mux_lock_validity_ms(a, &ms), REDLOCK_MUX_RELEASED);
    CHECK_RESULT(redlock_mux_lock_token(a, token, sizeof token, &n), REDLOCK_MUX_RELEASED);
    redlock_mux_lock_free(a);

    /* Released: the waiting form gets it at once, with a fresh token. */
    b = NULL;
    CHECK_OK(redlock_mux_client_lock(client, KEY, sizeof KEY, 10000, NULL, &b));
    CHECK_OK(redlock_mux_lock_token(b, other, sizeof other, &n));
    CHECK(memcmp(token, other, sizeof token) != 0);
    /* Freeing a held lock releases it. */
    redlock_mux_lock_free(b);
    c = NULL;
    CHECK_OK(redlock_mux_client_try_lock(client, KEY, sizeof KEY, 10000, &c));
    CHECK_OK(redlock_mux_lock_release(c));
    redlock_mux_lock_free(c);
}

static void test_client_freed_before_lock(int count, char **urls) {
    redlock_mux_client *client = make_client(count, urls, 1000);
    redlock_mux_lock *l = NULL;
    CHECK_OK(redlock_mux_client_try_lock(client, KEY, sizeof KEY, 10000, &l));
    redlock_mux_client_free(client);
    CHECK_OK(redlock_mux_lock_extend(l, 10000));
    CHECK_OK(redlock_mux_lock_release(l));
    redlock_mux_lock_free(l);
}

static void test_fair_client(int count, char **urls) {
    redlock_mux_client_builder *b = NULL;
    redlock_mux_client *client = NULL;
    redlock_mux_lock *a = NULL, *w = SENTINEL(redlock_mux_lock, 0);
    int i;
    CHECK_OK(redlock_mux_client_builder_new(&b));
    for (i = 0; i < count; i++) {
        CHECK_OK(redlock_mux_client_builder_add_node(b, urls[i], strlen(urls[i])));
    }
    CHECK_OK(redlock_mux_client_builder_set_fair(b, 1));
    CHECK_OK(redlock_mux_client_builder_set_fair_after_ms(b, 0));
    CHECK_OK(redlock_mux_client_builder_set_node_timeout_ms(b, 1000));
    CHECK_OK(redlock_mux_client_builder_set_retry_count(b, 2));
    CHECK_OK(redlock_mux_client_builder_set_retry_delay_ms(b, 20));
    CHECK_OK(redlock_mux_client_builder_build(b, &client));
    redlock_mux_client_builder_free(b);

    CHECK_OK(redlock_mux_client_lock(client, KEY, sizeof KEY, 10000, NULL, &a));
    /* A waiter gives up after its retries while the lock is held. */
    CHECK_RESULT(redlock_mux_client_lock(client, KEY, sizeof KEY, 10000, NULL, &w), REDLOCK_MUX_CONTENDED);
    CHECK(w == SENTINEL(redlock_mux_lock, 0));
    CHECK(redlock_mux_last_error_deadline() == REDLOCK_MUX_DEADLINE_RETRY_COUNT);
    CHECK(strstr(last_error(), "retry count") != NULL);
    CHECK_OK(redlock_mux_lock_release(a));
    redlock_mux_lock_free(a);
    redlock_mux_client_free(client);
}

/* A waiting call that gives up says which deadline ended the wait; other failures say none. */
static void test_last_error_deadline(redlock_mux_client *client, int count, char **urls) {
    static const uint8_t key[] = "c-api-deadline";
    const size_t len = sizeof key - 1;
    redlock_mux_client *impatient = make_client(count, urls, 300); /* waits 300 ms */
    redlock_mux_lock *held = NULL, *l = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_lock *held_w = NULL, *w = SENTINEL(redlock_mux_lock, 1);

    CHECK_OK(redlock_mux_client_try_lock(client, key, len, 10000, &held));
    CHECK_RESULT(redlock_mux_client_lock(impatient, key, len, 10000, NULL, &l), REDLOCK_MUX_CONTENDED);
    CHECK(redlock_mux_last_error_deadline() == REDLOCK_MUX_DEADLINE_WAIT_TIMEOUT);
    CHECK(strstr(last_error(), "wait timeout") != NULL);
    /* Asking, and calls that succeed, leave it as it was. */
    CHECK(redlock_mux_last_error_deadline() == REDLOCK_MUX_DEADLINE_WAIT_TIMEOUT);
    CHECK_OK(redlock_mux_lock_extend(held, 10000));
    CHECK(redlock_mux_last_error_deadline() == REDLOCK_MUX_DEADLINE_WAIT_TIMEOUT);
    /* One attempt, refused by the nodes: no deadline ended it. */
    CHECK_RESULT(redlock_mux_client_try_lock(impatient, key, len, 10000, &l), REDLOCK_MUX_CONTENDED);
    CHECK(redlock_mux_last_error_deadline() == REDLOCK_MUX_DEADLINE_NONE);

    /* The same for another kind. */
    CHECK_OK(redlock_mux_client_try_write_lock_fenced(client, key, len, 10000, &held_w));
    CHECK_RESULT(redlock_mux_client_write_lock_fenced(impatient, key, len, 10000, NULL, &w),
                 REDLOCK_MUX_CONTENDED);
    CHECK(redlock_mux_last_error_deadline() == REDLOCK_MUX_DEADLINE_WAIT_TIMEOUT);
    CHECK(l == SENTINEL(redlock_mux_lock, 0) && w == SENTINEL(redlock_mux_lock, 1));
    /* A NULL argument is no deadline either. */
    CHECK_RESULT(redlock_mux_client_lock(impatient, key, len, 10000, NULL, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK(redlock_mux_last_error_deadline() == REDLOCK_MUX_DEADLINE_NONE);

    CHECK_OK(redlock_mux_lock_release(held_w));
    redlock_mux_lock_free(held_w);
    CHECK_OK(redlock_mux_lock_release(held));
    redlock_mux_lock_free(held);
    redlock_mux_client_free(impatient);
}

static void test_read_write_locks(redlock_mux_client *client) {
    static const uint8_t key[] = "c-api-rw";
    redlock_mux_lock *r1 = NULL, *r2 = NULL, *r3 = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_lock *w = SENTINEL(redlock_mux_lock, 1);
    redlock_mux_client_builder *b = NULL;
    uint8_t t1[REDLOCK_MUX_TOKEN_LEN], t2[REDLOCK_MUX_TOKEN_LEN];
    size_t n = 0;
    uint64_t ms = 0;

    CHECK_RESULT(redlock_mux_client_try_read_lock(NULL, key, 8, 1000, &r1), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_write_lock(client, NULL, 8, 1000, NULL, &w), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_read_lock(client, key, 8, 1000, NULL, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_write_lock(client, key, 0, 1000, &w),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_RESULT(redlock_mux_lock_release(NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_extend(NULL, 5), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_OK(redlock_mux_client_builder_new(&b));
    CHECK_RESULT(redlock_mux_client_builder_set_rw_policy(b, 7), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_OK(redlock_mux_client_builder_set_rw_policy(b, REDLOCK_MUX_RW_WRITE_PREFERRING));
    redlock_mux_client_builder_free(b);

    /* Readers share. */
    CHECK_OK(redlock_mux_client_try_read_lock(client, key, 8, 10000, &r1));
    CHECK_OK(redlock_mux_client_read_lock(client, key, 8, 10000, NULL, &r2));
    CHECK_OK(redlock_mux_lock_token(r1, t1, sizeof t1, &n));
    CHECK_OK(redlock_mux_lock_token(r2, t2, sizeof t2, &n));
    CHECK(n == REDLOCK_MUX_TOKEN_LEN && memcmp(t1, t2, n) != 0);
    CHECK_OK(redlock_mux_lock_extend(r1, 20000));
    CHECK_OK(redlock_mux_lock_validity_ms(r1, &ms));
    CHECK(ms > 10000 && ms <= 20000);
    /* A writer is kept out while readers hold it. */
    CHECK_RESULT(redlock_mux_client_try_write_lock(client, key, 8, 10000, &w), REDLOCK_MUX_CONTENDED);
    CHECK(w == SENTINEL(redlock_mux_lock, 1));
    CHECK_OK(redlock_mux_lock_release(r1));
    CHECK_RESULT(redlock_mux_lock_release(r1), REDLOCK_MUX_RELEASED);
    redlock_mux_lock_free(r1);
    redlock_mux_lock_free(r2); /* releases the last reader */

    /* The writer gets in, and keeps readers out. */
    w = NULL;
    CHECK_OK(redlock_mux_client_try_write_lock(client, key, 8, 10000, &w));
    CHECK_OK(redlock_mux_lock_validity_ms(w, &ms));
    CHECK(ms > 9000 && ms <= 10000);
    CHECK_OK(redlock_mux_lock_token(w, t1, sizeof t1, &n));
    CHECK_RESULT(redlock_mux_client_try_read_lock(client, key, 8, 10000, &r3), REDLOCK_MUX_CONTENDED);
    CHECK(r3 == SENTINEL(redlock_mux_lock, 0));
    CHECK_OK(redlock_mux_lock_extend(w, 10000));
    CHECK_OK(redlock_mux_lock_release(w));
    CHECK_RESULT(redlock_mux_lock_extend(w, 10000), REDLOCK_MUX_RELEASED);
    redlock_mux_lock_free(w);
    redlock_mux_lock_free(NULL);
    redlock_mux_lock_free(NULL);
}

static void test_quorum_unreachable(void) {
    /* Ports 1 to 3 on loopback: nothing listens there, so every connect is refused. */
    char *dead[] = {"127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3/1"};
    redlock_mux_client *client = make_client(3, dead, 1000);
    redlock_mux_lock *l = SENTINEL(redlock_mux_lock, 3);
    CHECK_RESULT(redlock_mux_client_try_lock(client, KEY, sizeof KEY, 1000, &l),
                 REDLOCK_MUX_QUORUM_UNREACHABLE);
    CHECK(l == SENTINEL(redlock_mux_lock, 3));
    CHECK(strstr(last_error(), "127.0.0.1:2") != NULL);
    redlock_mux_client_free(client);
}

/* A password for a server that has none: the build fails at once with a config error. */
static void test_config_error(const char *url) {
    const char *host = strstr(url, "//") ? strstr(url, "//") + 2 : url;
    char bad[128];
    redlock_mux_client_builder *b = NULL;
    redlock_mux_client *client = SENTINEL(redlock_mux_client, 2);
    snprintf(bad, sizeof bad, "redis://:secret@%s", host);
    CHECK_OK(redlock_mux_client_builder_new(&b));
    CHECK_OK(redlock_mux_client_builder_add_node(b, bad, strlen(bad)));
    CHECK_RESULT(redlock_mux_client_builder_build(b, &client), REDLOCK_MUX_CONFIG);
    CHECK(client == SENTINEL(redlock_mux_client, 2));
    CHECK(strstr(last_error(), "AUTH") != NULL);
    CHECK(strstr(redlock_mux_result_text(REDLOCK_MUX_CONFIG), "configuration") != NULL);
    redlock_mux_client_builder_free(b);
}

/* The TLS setters: without TLS in the library, build refuses what they set and rediss:// URLs,
 * saying why; with it, a CA file that cannot be read is refused by build. */
static void test_tls_setters(const char *url) {
    static const char ca[] = "/nonexistent/redlock-mux-ca.pem";
    static const char tls_url[] = "rediss://127.0.0.1:1";
    redlock_mux_client_builder *b = NULL;
    redlock_mux_client *client = SENTINEL(redlock_mux_client, 3);
    CHECK(redlock_mux_has_tls() == 0 || redlock_mux_has_tls() == 1);
    CHECK_OK(redlock_mux_client_builder_new(&b));
    CHECK_OK(redlock_mux_client_builder_add_node(b, url, strlen(url)));
    CHECK_RESULT(redlock_mux_client_builder_add_tls_ca_file(b, NULL, 3),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_builder_set_tls_client_cert(b, "c", 1, "\xff", 1),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_OK(redlock_mux_client_builder_add_tls_ca_file(b, ca, strlen(ca)));
    CHECK_RESULT(redlock_mux_client_builder_build(b, &client), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(client == SENTINEL(redlock_mux_client, 3));
    if (redlock_mux_has_tls()) {
        CHECK(strstr(last_error(), "redlock-mux-ca.pem") != NULL);
    } else {
        CHECK(strstr(last_error(), "tls_ca_file") != NULL);
        CHECK(strstr(last_error(), "`tls` feature") != NULL);
    }
    redlock_mux_client_builder_free(b);

    CHECK_OK(redlock_mux_client_builder_new(&b));
    CHECK_OK(redlock_mux_client_builder_add_node(b, tls_url, strlen(tls_url)));
    if (!redlock_mux_has_tls()) {
        CHECK_RESULT(redlock_mux_client_builder_build(b, &client), REDLOCK_MUX_INVALID_ARGUMENT);
        CHECK(strstr(last_error(), "`tls` feature") != NULL);
    }
    redlock_mux_client_builder_free(b);
}

#define THREADS 4
#define ROUNDS 5

struct worker {
    redlock_mux_client *client;
    int index;
    int failures;
};

/* Locks and releases its own key a few times; the client is shared by all workers. */
static void *work(void *arg) {
    struct worker *w = arg;
    char key[32];
    int round;
    snprintf(key, sizeof key, "c-api-thread-%d", w->index);
    for (round = 0; round < ROUNDS; round++) {
        redlock_mux_lock *l = NULL;
        if (redlock_mux_client_lock(w->client, (const uint8_t *)key, strlen(key), 5000, NULL, &l) !=
                REDLOCK_MUX_OK ||
            redlock_mux_lock_release(l) != REDLOCK_MUX_OK) {
            w->failures++;
        }
        redlock_mux_lock_free(l);
    }
    return NULL;
}

static void test_threads_share_a_client(redlock_mux_client *client) {
    pthread_t threads[THREADS];
    struct worker workers[THREADS];
    int i;
    for (i = 0; i < THREADS; i++) {
        workers[i].client = client;
        workers[i].index = i;
        workers[i].failures = 0;
        CHECK(pthread_create(&threads[i], NULL, work, &workers[i]) == 0);
    }
    for (i = 0; i < THREADS; i++) {
        CHECK(pthread_join(threads[i], NULL) == 0);
        CHECK(workers[i].failures == 0);
    }
}

/* What a thread saw of its own failure, and of the main thread's. */
struct other_thread_error {
    redlock_mux_result result;
    size_t length_before;
    char message[256];
    redlock_mux_deadline deadline;
};

/* Fails one call of its own, and records what the last error then is on this thread. */
static void *fail_on_another_thread(void *arg) {
    struct other_thread_error *e = arg;
    size_t n = 0;
    e->length_before = redlock_mux_last_error_length();
    e->result = redlock_mux_client_builder_new(NULL);
    if (redlock_mux_last_error_message(e->message, sizeof e->message, &n) != REDLOCK_MUX_OK) {
        e->message[0] = 0;
    }
    e->deadline = redlock_mux_last_error_deadline();
    return NULL;
}

/* The last error and its deadline belong to the thread that failed: another thread's failure
 * neither shows on this one nor replaces what this one last saw. */
static void test_last_error_is_per_thread(redlock_mux_client *client, int count, char **urls) {
    static const uint8_t key[] = "c-api-per-thread";
    redlock_mux_client *impatient = make_client(count, urls, 200);
    redlock_mux_lock *held = NULL, *l = SENTINEL(redlock_mux_lock, 0);
    struct other_thread_error e;
    char mine[256];
    pthread_t thread;

    CHECK_OK(redlock_mux_client_try_lock(client, key, sizeof key - 1, 10000, &held));
    CHECK_RESULT(redlock_mux_client_lock(impatient, key, sizeof key - 1, 10000, NULL, &l),
                 REDLOCK_MUX_CONTENDED);
    CHECK(redlock_mux_last_error_deadline() == REDLOCK_MUX_DEADLINE_WAIT_TIMEOUT);
    snprintf(mine, sizeof mine, "%s", last_error());
    memset(&e, 0, sizeof e);
    CHECK(pthread_create(&thread, NULL, fail_on_another_thread, &e) == 0);
    CHECK(pthread_join(thread, NULL) == 0);
    /* A new thread starts with no failure; its own is its own. */
    CHECK(e.length_before == 0);
    CHECK(e.result == REDLOCK_MUX_NULL_PARAMETER);
    CHECK(strstr(e.message, "`out` is NULL") != NULL);
    CHECK(e.deadline == REDLOCK_MUX_DEADLINE_NONE);
    /* This thread's is as it was. */
    CHECK(strcmp(last_error(), mine) == 0);
    CHECK(redlock_mux_last_error_deadline() == REDLOCK_MUX_DEADLINE_WAIT_TIMEOUT);
    CHECK(l == SENTINEL(redlock_mux_lock, 0));
    CHECK_OK(redlock_mux_lock_release(held));
    redlock_mux_lock_free(held);
    redlock_mux_client_free(impatient);
}

/* ---- Multi-key, fenced and kept-alive locks. ---- */

static void sleep_ms(long ms) {
    struct timespec t;
    t.tv_sec = ms / 1000;
    t.tv_nsec = (ms % 1000) * 1000000L;
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

/* Deletes `key` on the node at `url` ("redis://127.0.0.1:PORT" or "127.0.0.1:PORT") with a
 * hand-written DEL, behind the library's back, as an operator or an expiry would. Returns
 * whether the key was there. */
static int redis_del(const char *url, const uint8_t *key, size_t key_len) {
    struct sockaddr_in addr;
    char host[64], head[64], reply[64];
    const char *start = strstr(url, "//") ? strstr(url, "//") + 2 : url;
    const char *colon = strrchr(start, ':');
    size_t host_len;
    int fd, n;
    CHECK(colon != NULL && (size_t)(colon - start) < sizeof host);
    host_len = (size_t)(colon - start);
    memcpy(host, start, host_len);
    host[host_len] = 0;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)atoi(colon + 1));
    CHECK(inet_pton(AF_INET, host, &addr.sin_addr) == 1);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    CHECK(connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0);
    n = snprintf(head, sizeof head, "*2\r\n$3\r\nDEL\r\n$%zu\r\n", key_len);
    CHECK(write(fd, head, (size_t)n) == n);
    CHECK(write(fd, key, key_len) == (ssize_t)key_len);
    CHECK(write(fd, "\r\n", 2) == 2);
    n = (int)read(fd, reply, sizeof reply - 1); /* ":1\r\n", in one segment on loopback */
    CHECK(n > 1 && reply[0] == ':');
    close(fd);
    return reply[1] == '1';
}

/* Does nothing: a callback for calls that must refuse before they could keep it. */
static void ignore_lost(void *user_data, redlock_mux_result reason) {
    (void)user_data;
    (void)reason;
}

/* Every acquisition checks its client, its key (or key arrays, and every key of a set), its
 * token and its out; every function of the lock handle checks its pointers. Nothing is taken
 * and nothing is written when one is NULL. */
static void test_lock_null_parameters(redlock_mux_client *client) {
    redlock_mux_lock *l = SENTINEL(redlock_mux_lock, 0);
    const uint8_t *keys[2] = {(const uint8_t *)"c-null-a", (const uint8_t *)"c-null-b"};
    const uint8_t *with_null[2] = {(const uint8_t *)"c-null-a", NULL};
    const uint8_t *key = (const uint8_t *)"c-sentinel";
    const uint8_t token[REDLOCK_MUX_TOKEN_LEN] = {0};
    size_t lens[2] = {8, 8};
    size_t n = 777;
    uint64_t ms = 777, fence = 777;
    uint8_t buf[64], lost = 77;
    redlock_mux_kind kind = 777;

    /* Sets: every pointer, the key arrays even when empty, every key of the set. */
    CHECK_RESULT(redlock_mux_client_try_lock_all(NULL, keys, lens, 2, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_lock_all(client, NULL, lens, 2, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK(strstr(last_error(), "`keys`") != NULL);
    CHECK_RESULT(redlock_mux_client_try_lock_all(client, NULL, lens, 0, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_lock_all(client, keys, NULL, 2, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK(strstr(last_error(), "key_lens") != NULL);
    CHECK_RESULT(redlock_mux_client_try_lock_all(client, with_null, lens, 2, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK(strstr(last_error(), "keys[1]") != NULL);
    CHECK_RESULT(redlock_mux_client_lock_all(NULL, keys, lens, 2, 1000, NULL, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_lock_all(client, keys, NULL, 2, 1000, NULL, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_resume_lock_all(client, keys, lens, 2, NULL, 40, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    /* One key: the client and the key, for every kind and form. */
    CHECK_RESULT(redlock_mux_client_lock(NULL, key, 10, 1000, NULL, &l), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_read_lock(client, NULL, 10, 1000, NULL, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_read_lock(NULL, key, 10, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_write_lock(NULL, key, 10, 1000, NULL, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_write_lock(client, NULL, 10, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_lock_fenced(NULL, key, 10, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_lock_fenced(client, NULL, 10, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_lock_fenced(NULL, key, 10, 1000, NULL, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_lock_fenced(client, NULL, 10, 1000, NULL, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_write_lock_fenced(client, NULL, 10, 1000, NULL, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_write_lock_fenced(NULL, key, 10, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_acquire_permit(client, NULL, 10, 2, 1000, NULL, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_acquire_permit(NULL, key, 10, 2, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_resume_read_lock(client, key, 10, NULL, 40, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_resume_write_lock(NULL, key, 10, token, 40, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_resume_permit(client, key, 10, 2, NULL, 40, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK(l == SENTINEL(redlock_mux_lock, 0));
    /* A NULL out is refused before anything is taken: the keys stay free (taken below). */
    CHECK_RESULT(redlock_mux_client_try_lock_all(client, keys, lens, 2, 1000, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_lock_all(client, keys, lens, 2, 1000, NULL, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_lock_fenced(client, keys[0], 8, 1000, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_lock_fenced(client, keys[0], 8, 1000, NULL, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_write_lock(client, keys[1], 8, 1000, NULL, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_acquire_permit(client, keys[1], 8, 1, 1000, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);

    /* The handle's functions. */
    l = NULL;
    CHECK_OK(redlock_mux_client_try_lock_all(client, keys, lens, 2, 5000, &l));
    CHECK_RESULT(redlock_mux_lock_kind(NULL, &kind), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_kind(l, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_extend(NULL, 1000), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_validity_ms(NULL, &ms), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_validity_ms(l, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_token(NULL, buf, sizeof buf, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_token(l, NULL, sizeof buf, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_token(l, buf, sizeof buf, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key(NULL, &key, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key(l, NULL, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key(l, &key, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key_count(NULL, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key_count(l, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key_at(NULL, 0, &key, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key_at(l, 0, NULL, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key_at(l, 0, &key, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_fencing_token(NULL, &fence), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_fencing_token(l, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_downgrade(NULL, 0), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_keep_alive(NULL, 1000), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_keep_alive_with_callback(NULL, 1000, ignore_lost, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_keep_alive_with_callback(l, 1000, NULL, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK(strstr(last_error(), "on_lost") != NULL);
    CHECK_RESULT(redlock_mux_lock_is_lost(NULL, &lost), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_is_lost(l, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_release(NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK(ms == 777 && n == 777 && fence == 777 && lost == 77 && kind == 777 &&
          strcmp((const char *)key, "c-sentinel") == 0);
    /* The refused callback left the lock held, not kept: it still extends by hand. */
    CHECK_OK(redlock_mux_lock_extend(l, 5000));
    CHECK_OK(redlock_mux_lock_release(l));
    redlock_mux_lock_free(l);

    /* Every other key above is free: nothing was taken. */
    l = NULL;
    CHECK_OK(redlock_mux_client_try_write_lock(client, keys[1], 8, 1000, &l));
    CHECK_OK(redlock_mux_lock_release(l));
    redlock_mux_lock_free(l);
    l = NULL;
    CHECK_OK(redlock_mux_client_try_lock(client, keys[0], 8, 1000, &l));
    CHECK_OK(redlock_mux_lock_release(l));
    redlock_mux_lock_free(l);

    /* _free accepts NULL. */
    redlock_mux_lock_free(NULL);
}

/* One handle serves every kind: each tells its kind, its key and its token; what only some
 * kinds have gives REDLOCK_MUX_UNSUPPORTED on the others, writes nothing, and leaves the lock
 * held as it was. */
static void test_one_handle_for_every_kind(redlock_mux_client *client) {
    enum { KINDS = 7 };
    static const char *const keys[KINDS] = {
        "c-kind-mutex", "c-kind-read", "c-kind-write", "c-kind-set-a",
        "c-kind-fenced", "c-fenced-write", "c-kind-semaphore",
    };
    static const redlock_mux_kind kinds[KINDS] = {
        REDLOCK_MUX_KIND_MUTEX,        REDLOCK_MUX_KIND_READ,         REDLOCK_MUX_KIND_WRITE,
        REDLOCK_MUX_KIND_ALL,          REDLOCK_MUX_KIND_FENCED_MUTEX, REDLOCK_MUX_KIND_FENCED_WRITE,
        REDLOCK_MUX_KIND_SEMAPHORE,
    };
    const uint8_t *set[2] = {(const uint8_t *)"c-kind-set-b", (const uint8_t *)"c-kind-set-a"};
    size_t set_lens[2] = {12, 12};
    redlock_mux_lock *locks[KINDS];
    redlock_mux_kind kind;
    const uint8_t *got;
    uint8_t token[REDLOCK_MUX_TOKEN_LEN];
    uint64_t fence, ms;
    size_t n, count;
    int i;

#define ONE_KEY(i) (const uint8_t *)keys[i], strlen(keys[i])
    for (i = 0; i < KINDS; i++) {
        locks[i] = NULL;
    }
    CHECK_OK(redlock_mux_client_try_lock(client, ONE_KEY(0), 10000, &locks[0]));
    CHECK_OK(redlock_mux_client_read_lock(client, ONE_KEY(1), 10000, NULL, &locks[1]));
    CHECK_OK(redlock_mux_client_try_write_lock(client, ONE_KEY(2), 10000, &locks[2]));
    CHECK_OK(redlock_mux_client_lock_all(client, set, set_lens, 2, 10000, NULL, &locks[3]));
    CHECK_OK(redlock_mux_client_try_lock_fenced(client, ONE_KEY(4), 10000, &locks[4]));
    CHECK_OK(redlock_mux_client_write_lock_fenced(client, ONE_KEY(5), 10000, NULL, &locks[5]));
    CHECK_OK(redlock_mux_client_acquire_permit(client, ONE_KEY(6), 3, 10000, NULL, &locks[6]));

    for (i = 0; i < KINDS; i++) {
        redlock_mux_lock *l = locks[i];
        int fenced = kinds[i] == REDLOCK_MUX_KIND_FENCED_MUTEX ||
                     kinds[i] == REDLOCK_MUX_KIND_FENCED_WRITE;
        int writer = kinds[i] == REDLOCK_MUX_KIND_WRITE ||
                     kinds[i] == REDLOCK_MUX_KIND_FENCED_WRITE;
        CHECK_OK(redlock_mux_lock_kind(l, &kind));
        CHECK(kind == kinds[i]);
        /* What every kind has. A set's key is its first, sorted. */
        CHECK_OK(redlock_mux_lock_key(l, &got, &n));
        CHECK(n == strlen(keys[i]) && memcmp(got, keys[i], n) == 0);
        CHECK_OK(redlock_mux_lock_token(l, token, sizeof token, &n));
        CHECK(n == REDLOCK_MUX_TOKEN_LEN);
        CHECK_OK(redlock_mux_lock_extend(l, 20000));
        CHECK_OK(redlock_mux_lock_validity_ms(l, &ms));
        CHECK(ms > 10000 && ms <= 20000);
        /* What only some kinds have. */
        fence = 777;
        if (fenced) {
            CHECK_OK(redlock_mux_lock_fencing_token(l, &fence));
            CHECK(fence > 0 && fence != 777);
        } else {
            CHECK_RESULT(redlock_mux_lock_fencing_token(l, &fence), REDLOCK_MUX_UNSUPPORTED);
            CHECK(fence == 777 && strstr(last_error(), "fencing token") != NULL);
        }
        count = 777;
        got = (const uint8_t *)"c-sentinel";
        n = 777;
        if (kinds[i] == REDLOCK_MUX_KIND_ALL) {
            CHECK_OK(redlock_mux_lock_key_count(l, &count));
            CHECK(count == 2);
            CHECK_OK(redlock_mux_lock_key_at(l, 1, &got, &n));
            CHECK(n == 12 && memcmp(got, "c-kind-set-b", 12) == 0);
        } else {
            CHECK_RESULT(redlock_mux_lock_key_count(l, &count), REDLOCK_MUX_UNSUPPORTED);
            CHECK_RESULT(redlock_mux_lock_key_at(l, 0, &got, &n), REDLOCK_MUX_UNSUPPORTED);
            CHECK(count == 777 && n == 777 && strcmp((const char *)got, "c-sentinel") == 0);
        }
        if (!writer) {
            CHECK_RESULT(redlock_mux_lock_downgrade(l, 0), REDLOCK_MUX_UNSUPPORTED);
            CHECK(strstr(last_error(), "downgrade") != NULL);
        }
        /* Refused calls left the lock as it was: held, of its kind. */
        CHECK_OK(redlock_mux_lock_kind(l, &kind));
        CHECK(kind == kinds[i]);
        CHECK_OK(redlock_mux_lock_validity_ms(l, &ms));
        CHECK(ms > 10000);
    }
    /* The write locks downgrade, in place: the handle then holds a read lock. */
    CHECK_OK(redlock_mux_lock_downgrade(locks[2], 0));
    CHECK_OK(redlock_mux_lock_kind(locks[2], &kind));
    CHECK(kind == REDLOCK_MUX_KIND_READ);
    CHECK_OK(redlock_mux_lock_downgrade(locks[5], 0));
    CHECK_OK(redlock_mux_lock_kind(locks[5], &kind));
    CHECK(kind == REDLOCK_MUX_KIND_READ);
    fence = 777;
    CHECK_RESULT(redlock_mux_lock_fencing_token(locks[5], &fence), REDLOCK_MUX_UNSUPPORTED);
    CHECK(fence == 777);
    CHECK_RESULT(redlock_mux_lock_downgrade(locks[5], 0), REDLOCK_MUX_UNSUPPORTED);

    for (i = 0; i < KINDS; i++) {
        CHECK_OK(redlock_mux_lock_release(locks[i]));
        /* Released, a handle still tells what it held, and nothing else. */
        CHECK_OK(redlock_mux_lock_kind(locks[i], &kind));
        CHECK_RESULT(redlock_mux_lock_key(locks[i], &got, &n), REDLOCK_MUX_RELEASED);
        CHECK_RESULT(redlock_mux_lock_fencing_token(locks[i], &fence), REDLOCK_MUX_RELEASED);
        CHECK_RESULT(redlock_mux_lock_key_count(locks[i], &count), REDLOCK_MUX_RELEASED);
        CHECK_RESULT(redlock_mux_lock_downgrade(locks[i], 0), REDLOCK_MUX_RELEASED);
        redlock_mux_lock_free(locks[i]);
    }
#undef ONE_KEY
}

#define SET_SIZE 3

struct delayed_release {
    redlock_mux_lock *lock;
    long after_ms;
    redlock_mux_result result;
};

static void *release_later(void *arg) {
    struct delayed_release *d = arg;
    sleep_ms(d->after_ms);
    d->result = redlock_mux_lock_release(d->lock);
    return NULL;
}

static void test_multi_locks(redlock_mux_client *client) {
    /* Given unsorted; one key is binary with a NUL inside. */
    static const uint8_t b[] = {'c', '-', 'm', 'u', 'l', 't', 'i', '-', 'b', 0, '!'};
    const uint8_t *keys[SET_SIZE] = {(const uint8_t *)"c-multi-c", b, (const uint8_t *)"c-multi-a"};
    size_t lens[SET_SIZE] = {9, sizeof b, 9};
    const uint8_t *dup[2] = {(const uint8_t *)"c-multi-a", (const uint8_t *)"c-multi-a"};
    size_t dup_lens[2] = {9, 9};
    const uint8_t *many[REDLOCK_MUX_MAX_LOCK_ALL_KEYS + 1];
    size_t many_lens[REDLOCK_MUX_MAX_LOCK_ALL_KEYS + 1];
    size_t empty_lens[SET_SIZE] = {9, 0, 9};
    size_t huge_lens[SET_SIZE] = {9, REDLOCK_MUX_MAX_KEY_LEN + 1, 9};
    redlock_mux_lock *m = NULL, *w = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_lock *l = SENTINEL(redlock_mux_lock, 1), *c = NULL;
    const uint8_t *key = (const uint8_t *)"c-sentinel";
    uint8_t token[REDLOCK_MUX_TOKEN_LEN];
    size_t n = 777, count = 777, i;
    uint64_t ms = 0;
    struct delayed_release d;
    pthread_t releaser;

    /* Bad sets are refused before anything is sent. */
    CHECK_RESULT(redlock_mux_client_try_lock_all(client, keys, lens, 0, 1000, &w),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(strstr(last_error(), "no keys") != NULL);
    CHECK_RESULT(redlock_mux_client_try_lock_all(client, dup, dup_lens, 2, 1000, &w),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(strstr(last_error(), "more than once") != NULL);
    CHECK_RESULT(redlock_mux_client_lock_all(client, keys, empty_lens, SET_SIZE, 1000, NULL, &w),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(strstr(last_error(), "empty") != NULL);
    CHECK_RESULT(redlock_mux_client_try_lock_all(client, keys, huge_lens, SET_SIZE, 1000, &w),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(strstr(last_error(), "long") != NULL);
    CHECK_RESULT(redlock_mux_client_try_lock_all(client, keys, lens, SET_SIZE, 0, &w),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    for (i = 0; i < REDLOCK_MUX_MAX_LOCK_ALL_KEYS + 1; i++) {
        many[i] = NULL; /* not read: the count is refused first */
        many_lens[i] = 1;
    }
    CHECK_RESULT(redlock_mux_client_try_lock_all(client, many, many_lens,
                                                 REDLOCK_MUX_MAX_LOCK_ALL_KEYS + 1, 1000, &w),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(strstr(last_error(), "257 keys") != NULL);
    CHECK(w == SENTINEL(redlock_mux_lock, 0));

    /* The whole set, held: each of its keys is refused to a mutex. */
    CHECK_OK(redlock_mux_client_try_lock_all(client, keys, lens, SET_SIZE, 10000, &m));
    CHECK_OK(redlock_mux_lock_validity_ms(m, &ms));
    CHECK(ms > 9000 && ms <= 10000);
    CHECK_OK(redlock_mux_lock_token(m, token, sizeof token, &n));
    CHECK(n == REDLOCK_MUX_TOKEN_LEN);
    for (i = 0; i < SET_SIZE; i++) {
        CHECK_RESULT(redlock_mux_client_try_lock(client, keys[i], lens[i], 1000, &l),
                     REDLOCK_MUX_CONTENDED);
    }
    CHECK(l == SENTINEL(redlock_mux_lock, 1));
    CHECK_RESULT(redlock_mux_client_try_lock_all(client, keys, lens, SET_SIZE, 1000, &w),
                 REDLOCK_MUX_CONTENDED);
    CHECK(w == SENTINEL(redlock_mux_lock, 0));

    /* The keys read back, sorted, and owned by the handle. */
    CHECK_OK(redlock_mux_lock_key_count(m, &count));
    CHECK(count == SET_SIZE);
    CHECK_OK(redlock_mux_lock_key_at(m, 0, &key, &n));
    CHECK(n == 9 && memcmp(key, "c-multi-a", 9) == 0);
    CHECK_OK(redlock_mux_lock_key_at(m, 1, &key, &n));
    CHECK(n == sizeof b && memcmp(key, b, sizeof b) == 0 && key != b);
    CHECK_OK(redlock_mux_lock_key_at(m, 2, &key, &n));
    CHECK(n == 9 && memcmp(key, "c-multi-c", 9) == 0);
    n = 777;
    CHECK_RESULT(redlock_mux_lock_key_at(m, SET_SIZE, &key, &n), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(n == 777 && strstr(last_error(), "index 3") != NULL);

    CHECK_OK(redlock_mux_lock_extend(m, 20000));
    CHECK_OK(redlock_mux_lock_validity_ms(m, &ms));
    CHECK(ms > 10000 && ms <= 20000);
    CHECK_RESULT(redlock_mux_lock_extend(m, 0), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_OK(redlock_mux_lock_release(m));
    CHECK_RESULT(redlock_mux_lock_release(m), REDLOCK_MUX_RELEASED);
    CHECK_RESULT(redlock_mux_lock_extend(m, 1000), REDLOCK_MUX_RELEASED);
    CHECK_RESULT(redlock_mux_lock_validity_ms(m, &ms), REDLOCK_MUX_RELEASED);
    CHECK_RESULT(redlock_mux_lock_token(m, token, sizeof token, &n), REDLOCK_MUX_RELEASED);
    CHECK_RESULT(redlock_mux_lock_key_count(m, &count), REDLOCK_MUX_RELEASED);
    CHECK_RESULT(redlock_mux_lock_key_at(m, 0, &key, &n), REDLOCK_MUX_RELEASED);
    redlock_mux_lock_free(m);

    /* One key of the set held elsewhere: the set is refused, and none of it was taken. */
    CHECK_OK(redlock_mux_client_try_lock(client, keys[1], lens[1], 10000, &c));
    CHECK_RESULT(redlock_mux_client_try_lock_all(client, keys, lens, SET_SIZE, 10000, &w),
                 REDLOCK_MUX_CONTENDED);
    CHECK(w == SENTINEL(redlock_mux_lock, 0));
    l = NULL;
    CHECK_OK(redlock_mux_client_try_lock(client, keys[0], lens[0], 1000, &l));
    CHECK_OK(redlock_mux_lock_release(l));
    redlock_mux_lock_free(l);

    /* The waiting form gets the set once that key is released. */
    d.lock = c;
    d.after_ms = 300;
    d.result = REDLOCK_MUX_PANIC;
    CHECK(pthread_create(&releaser, NULL, release_later, &d) == 0);
    m = NULL;
    CHECK_OK(redlock_mux_client_lock_all(client, keys, lens, SET_SIZE, 10000, NULL, &m));
    CHECK(pthread_join(releaser, NULL) == 0);
    CHECK_OK(d.result);
    redlock_mux_lock_free(c);
    /* Freeing a held set releases every key. */
    redlock_mux_lock_free(m);
    m = NULL;
    CHECK_OK(redlock_mux_client_try_lock_all(client, keys, lens, SET_SIZE, 10000, &m));
    CHECK_OK(redlock_mux_lock_release(m));
    redlock_mux_lock_free(m);
}

#define FENCED_GRANTS 6

static void test_fenced_locks(redlock_mux_client *client) {
    static const uint8_t key[] = {'c', '-', 'f', 'e', 'n', 'c', 'e', 'd', 0, '1'};
    redlock_mux_lock *f = NULL, *g = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_lock *l = SENTINEL(redlock_mux_lock, 1);
    uint8_t token[REDLOCK_MUX_TOKEN_LEN];
    uint64_t fence = 0, previous = 0, again = 0, ms = 0;
    size_t n = 0;
    int i;

    CHECK_RESULT(redlock_mux_client_try_lock_fenced(client, key, 0, 1000, &g),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_RESULT(redlock_mux_client_lock_fenced(client, key, sizeof key, 0, NULL, &g),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(g == SENTINEL(redlock_mux_lock, 0));

    /* Every grant's fencing token is larger than the one before, whichever form took it. */
    for (i = 0; i < FENCED_GRANTS; i++) {
        f = NULL;
        if (i % 2 == 0) {
            CHECK_OK(redlock_mux_client_try_lock_fenced(client, key, sizeof key, 10000, &f));
        } else {
            CHECK_OK(redlock_mux_client_lock_fenced(client, key, sizeof key, 10000, NULL, &f));
        }
        CHECK_OK(redlock_mux_lock_fencing_token(f, &fence));
        CHECK(fence > previous);
        previous = fence;
        if (i == 0) {
            /* Held: refused to fenced and plain locks alike. */
            CHECK_RESULT(redlock_mux_client_try_lock_fenced(client, key, sizeof key, 1000, &g),
                         REDLOCK_MUX_CONTENDED);
            CHECK_RESULT(redlock_mux_client_try_lock(client, key, sizeof key, 1000, &l),
                         REDLOCK_MUX_CONTENDED);
            CHECK(g == SENTINEL(redlock_mux_lock, 0) && l == SENTINEL(redlock_mux_lock, 1));
            CHECK_OK(redlock_mux_lock_validity_ms(f, &ms));
            CHECK(ms > 9000 && ms <= 10000);
            CHECK_OK(redlock_mux_lock_token(f, token, sizeof token, &n));
            CHECK(n == REDLOCK_MUX_TOKEN_LEN);
            /* Extending keeps the fencing token. */
            CHECK_OK(redlock_mux_lock_extend(f, 20000));
            CHECK_OK(redlock_mux_lock_validity_ms(f, &ms));
            CHECK(ms > 10000 && ms <= 20000);
            CHECK_OK(redlock_mux_lock_fencing_token(f, &again));
            CHECK(again == fence);
        }
        if (i == FENCED_GRANTS - 1) {
            redlock_mux_lock_free(f); /* freeing a held lock releases it */
        } else {
            CHECK_OK(redlock_mux_lock_release(f));
            CHECK_RESULT(redlock_mux_lock_release(f), REDLOCK_MUX_RELEASED);
            CHECK_RESULT(redlock_mux_lock_fencing_token(f, &again), REDLOCK_MUX_RELEASED);
            CHECK_RESULT(redlock_mux_lock_extend(f, 1000), REDLOCK_MUX_RELEASED);
            CHECK_RESULT(redlock_mux_lock_validity_ms(f, &ms), REDLOCK_MUX_RELEASED);
            CHECK_RESULT(redlock_mux_lock_token(f, token, sizeof token, &n),
                         REDLOCK_MUX_RELEASED);
            redlock_mux_lock_free(f);
        }
    }
    /* A plain mutex on the key is free again once the fenced one is freed. */
    l = NULL;
    CHECK_OK(redlock_mux_client_try_lock(client, key, sizeof key, 1000, &l));
    CHECK_OK(redlock_mux_lock_release(l));
    redlock_mux_lock_free(l);
}

static void test_keep_alive_holds_past_the_ttl(redlock_mux_client *client) {
    static const uint8_t key[] = "c-kept";
    static const uint8_t brief[] = "c-kept-brief";
    redlock_mux_lock *l = NULL, *other = SENTINEL(redlock_mux_lock, 0);
    uint8_t token[REDLOCK_MUX_TOKEN_LEN], kept_token[REDLOCK_MUX_TOKEN_LEN];
    uint8_t lost = 77;
    uint64_t ms = 0;
    size_t n = 0;
    int step;

    /* Not kept alive, a lock is lost once its validity has run out. */
    CHECK_OK(redlock_mux_client_try_lock(client, brief, sizeof brief - 1, 300, &l));
    CHECK_OK(redlock_mux_lock_is_lost(l, &lost));
    CHECK(lost == 0);
    sleep_ms(400);
    CHECK_OK(redlock_mux_lock_is_lost(l, &lost));
    CHECK(lost == 1);
    redlock_mux_lock_free(l);

    l = NULL;
    CHECK_OK(redlock_mux_client_try_lock(client, key, sizeof key - 1, 1000, &l));
    CHECK_OK(redlock_mux_lock_token(l, token, sizeof token, &n));
    /* A bad TTL is refused, and the lock stays held by hand. */
    CHECK_RESULT(redlock_mux_lock_keep_alive(l, 0), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_OK(redlock_mux_lock_extend(l, 1000));

    CHECK_OK(redlock_mux_lock_keep_alive(l, 1000));
    /* Kept: the keeper thread alone extends it; the handle tells what it told before. */
    CHECK_RESULT(redlock_mux_lock_extend(l, 1000), REDLOCK_MUX_UNSUPPORTED);
    CHECK(strstr(last_error(), "kept alive") != NULL);
    CHECK_RESULT(redlock_mux_lock_keep_alive(l, 1000), REDLOCK_MUX_UNSUPPORTED);
    CHECK_OK(redlock_mux_lock_token(l, kept_token, sizeof kept_token, &n));
    CHECK(n == REDLOCK_MUX_TOKEN_LEN && memcmp(token, kept_token, sizeof token) == 0);

    /* Held for 2.5 s on a 1 s TTL, extended in the background. */
    for (step = 0; step < 25; step++) {
        sleep_ms(100);
        CHECK_OK(redlock_mux_lock_is_lost(l, &lost));
        CHECK(lost == 0);
    }
    CHECK_RESULT(redlock_mux_client_try_lock(client, key, sizeof key - 1, 1000, &other),
                 REDLOCK_MUX_CONTENDED);
    CHECK(other == SENTINEL(redlock_mux_lock, 0));
    CHECK_OK(redlock_mux_lock_validity_ms(l, &ms));
    CHECK(ms > 0 && ms <= 1000);

    CHECK_OK(redlock_mux_lock_release(l));
    CHECK_RESULT(redlock_mux_lock_release(l), REDLOCK_MUX_RELEASED);
    CHECK_RESULT(redlock_mux_lock_is_lost(l, &lost), REDLOCK_MUX_RELEASED);
    CHECK_RESULT(redlock_mux_lock_validity_ms(l, &ms), REDLOCK_MUX_RELEASED);
    CHECK_RESULT(redlock_mux_lock_token(l, token, sizeof token, &n), REDLOCK_MUX_RELEASED);
    CHECK_RESULT(redlock_mux_lock_keep_alive(l, 1000), REDLOCK_MUX_RELEASED);
    redlock_mux_lock_free(l);
    other = NULL;
    CHECK_OK(redlock_mux_client_try_lock(client, key, sizeof key - 1, 1000, &other));
    redlock_mux_lock_free(other);
}

struct lost_notice {
    pthread_mutex_t mutex;
    int calls;
    redlock_mux_result reason;
    pthread_t thread;
};

/* Runs on the keeper thread. */
static void on_lost(void *user_data, redlock_mux_result reason) {
    struct lost_notice *notice = user_data;
    pthread_mutex_lock(&notice->mutex);
    notice->calls++;
    notice->reason = reason;
    notice->thread = pthread_self();
    pthread_mutex_unlock(&notice->mutex);
}

static void test_keep_alive_reports_a_lost_lock(redlock_mux_client *client, int count,
                                                char **urls) {
    static const uint8_t key[] = "c-kept-lost";
    redlock_mux_lock *l = NULL;
    struct lost_notice *notice = calloc(1, sizeof *notice);
    uint8_t lost = 0;
    uint64_t ms = 777;
    int i, calls = 0;

    CHECK(notice != NULL && pthread_mutex_init(&notice->mutex, NULL) == 0);
    CHECK_OK(redlock_mux_client_try_lock(client, key, sizeof key - 1, 1000, &l));
    CHECK_OK(redlock_mux_lock_keep_alive_with_callback(l, 1000, on_lost, notice));

    /* The key disappears from every node: the next extension is refused. */
    for (i = 0; i < count; i++) {
        redis_del(urls[i], key, sizeof key - 1);
    }
    for (i = 0; i < 300 && !lost; i++) { /* at most 3 s; an extension is due every 333 ms */
        sleep_ms(10);
        CHECK_OK(redlock_mux_lock_is_lost(l, &lost));
    }
    CHECK(lost == 1);
    for (i = 0; i < 100 && calls == 0; i++) { /* is_lost turns true just before the call */
        pthread_mutex_lock(&notice->mutex);
        calls = notice->calls;
        pthread_mutex_unlock(&notice->mutex);
        if (calls == 0) {
            sleep_ms(10);
        }
    }
    pthread_mutex_lock(&notice->mutex);
    CHECK(notice->calls == 1);
    CHECK(notice->reason == REDLOCK_MUX_CONTENDED);
    CHECK(!pthread_equal(notice->thread, pthread_self()));
    pthread_mutex_unlock(&notice->mutex);
    CHECK_OK(redlock_mux_lock_validity_ms(l, &ms));
    CHECK(ms == 0);
    CHECK_OK(redlock_mux_lock_release(l));
    redlock_mux_lock_free(l);

    /* Freed before any loss: the callback never runs, so its data may go at once. */
    l = NULL;
    CHECK_OK(redlock_mux_client_try_lock(client, key, sizeof key - 1, 1000, &l));
    CHECK_OK(redlock_mux_lock_keep_alive_with_callback(l, 1000, on_lost, notice));
    redlock_mux_lock_free(l);
    pthread_mutex_lock(&notice->mutex);
    CHECK(notice->calls == 1);
    pthread_mutex_unlock(&notice->mutex);
    pthread_mutex_destroy(&notice->mutex);
    free(notice);
}

/* ---- Every lock kind has every capability: keys, fenced write locks, keep-alive. ---- */

/* Checks that `got`/`got_len` is the `want_len` bytes at `want`, in memory of the handle's own. */
static void check_key(const uint8_t *got, size_t got_len, const uint8_t *want, size_t want_len) {
    CHECK(got != NULL && got != want);
    CHECK(got_len == want_len && memcmp(got, want, want_len) == 0);
}

static void test_one_key_handles_give_their_key(redlock_mux_client *client) {
    static const uint8_t key[] = {'c', '-', 'k', 'e', 'y', 0, 'o', 'f'}; /* binary, with NUL */
    redlock_mux_lock *l = NULL;
    redlock_mux_lock *r = NULL;
    redlock_mux_lock *w = NULL;
    redlock_mux_lock *f = NULL;
    redlock_mux_lock *fw = NULL;
    const uint8_t *got = (const uint8_t *)"c-sentinel";
    size_t n = 777;

    CHECK_OK(redlock_mux_client_try_lock(client, key, sizeof key, 5000, &l));
    CHECK_RESULT(redlock_mux_lock_key(NULL, &got, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key(l, NULL, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key(l, &got, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK(n == 777 && strcmp((const char *)got, "c-sentinel") == 0);
    CHECK_OK(redlock_mux_lock_key(l, &got, &n));
    check_key(got, n, key, sizeof key);
    CHECK_OK(redlock_mux_lock_release(l));
    CHECK_RESULT(redlock_mux_lock_key(l, &got, &n), REDLOCK_MUX_RELEASED);
    redlock_mux_lock_free(l);

    CHECK_OK(redlock_mux_client_try_read_lock(client, key, sizeof key, 5000, &r));
    CHECK_RESULT(redlock_mux_lock_key(NULL, &got, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key(r, NULL, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_OK(redlock_mux_lock_key(r, &got, &n));
    check_key(got, n, key, sizeof key);
    redlock_mux_lock_free(r);

    CHECK_OK(redlock_mux_client_try_write_lock(client, key, sizeof key, 5000, &w));
    CHECK_RESULT(redlock_mux_lock_key(NULL, &got, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key(w, &got, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_OK(redlock_mux_lock_key(w, &got, &n));
    check_key(got, n, key, sizeof key);
    redlock_mux_lock_free(w);

    CHECK_OK(redlock_mux_client_try_lock_fenced(client, key, sizeof key, 5000, &f));
    CHECK_RESULT(redlock_mux_lock_key(NULL, &got, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key(f, NULL, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_OK(redlock_mux_lock_key(f, &got, &n));
    check_key(got, n, key, sizeof key);
    redlock_mux_lock_free(f);

    CHECK_OK(redlock_mux_client_try_write_lock_fenced(client, key, sizeof key, 5000, &fw));
    CHECK_RESULT(redlock_mux_lock_key(NULL, &got, &n), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_key(fw, &got, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_OK(redlock_mux_lock_key(fw, &got, &n));
    check_key(got, n, key, sizeof key);
    CHECK_OK(redlock_mux_lock_release(fw));
    CHECK_RESULT(redlock_mux_lock_key(fw, &got, &n), REDLOCK_MUX_RELEASED);
    redlock_mux_lock_free(fw);
}

static void test_fenced_write_locks(redlock_mux_client *client) {
    static const uint8_t key[] = "c-fenced-write";
    const size_t len = sizeof key - 1;
    redlock_mux_lock *fw = NULL, *g = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_lock *w = SENTINEL(redlock_mux_lock, 1);
    redlock_mux_lock *r = SENTINEL(redlock_mux_lock, 2);
    uint8_t token[REDLOCK_MUX_TOKEN_LEN], buf[64];
    uint64_t fence = 777, previous = 0, again = 0, ms = 777;
    size_t n = 777;
    int i;

    /* NULL and bad arguments, refused before anything is taken. */
    CHECK_RESULT(redlock_mux_client_try_write_lock_fenced(NULL, key, len, 1000, &g),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_write_lock_fenced(client, NULL, len, 1000, &g),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_write_lock_fenced(NULL, key, len, 1000, NULL, &g),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_write_lock_fenced(client, key, len, 1000, NULL, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_write_lock_fenced(client, key, 0, 1000, &g),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_RESULT(redlock_mux_client_write_lock_fenced(client, key, len, 0, NULL, &g),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(g == SENTINEL(redlock_mux_lock, 0));
    CHECK_RESULT(redlock_mux_lock_extend(NULL, 1000), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_validity_ms(NULL, &ms), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_token(NULL, buf, sizeof buf, &n),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_fencing_token(NULL, &fence),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_lock_release(NULL), REDLOCK_MUX_NULL_PARAMETER);

    /* Every grant's fencing token is larger than the one before, whichever form took it. */
    for (i = 0; i < FENCED_GRANTS; i++) {
        fw = NULL;
        if (i % 2 == 0) {
            CHECK_OK(redlock_mux_client_try_write_lock_fenced(client, key, len, 10000, &fw));
        } else {
            CHECK_OK(redlock_mux_client_write_lock_fenced(client, key, len, 10000, NULL, &fw));
        }
        CHECK_OK(redlock_mux_lock_fencing_token(fw, &fence));
        CHECK(fence > previous);
        previous = fence;
        if (i == 0) {
            /* Held: readers and writers, fenced or not, are refused. */
            CHECK_RESULT(redlock_mux_client_try_write_lock_fenced(client, key, len, 1000, &g),
                         REDLOCK_MUX_CONTENDED);
            CHECK_RESULT(redlock_mux_client_try_write_lock(client, key, len, 1000, &w),
                         REDLOCK_MUX_CONTENDED);
            CHECK_RESULT(redlock_mux_client_try_read_lock(client, key, len, 1000, &r),
                         REDLOCK_MUX_CONTENDED);
            CHECK(g == SENTINEL(redlock_mux_lock, 0) &&
                  w == SENTINEL(redlock_mux_lock, 1) &&
                  r == SENTINEL(redlock_mux_lock, 2));
            /* NULL outs leave everything as it was. */
            n = 777;
            ms = 777;
            again = 777;
            CHECK_RESULT(redlock_mux_lock_validity_ms(fw, NULL),
                         REDLOCK_MUX_NULL_PARAMETER);
            CHECK_RESULT(redlock_mux_lock_token(fw, NULL, sizeof buf, &n),
                         REDLOCK_MUX_NULL_PARAMETER);
            CHECK_RESULT(redlock_mux_lock_token(fw, buf, sizeof buf, NULL),
                         REDLOCK_MUX_NULL_PARAMETER);
            CHECK_RESULT(redlock_mux_lock_fencing_token(fw, NULL),
                         REDLOCK_MUX_NULL_PARAMETER);
            CHECK(n == 777 && ms == 777 && again == 777);
            CHECK_OK(redlock_mux_lock_validity_ms(fw, &ms));
            CHECK(ms > 9000 && ms <= 10000);
            CHECK_OK(redlock_mux_lock_token(fw, token, sizeof token, &n));
            CHECK(n == REDLOCK_MUX_TOKEN_LEN);
            /* Extending keeps the fencing token. */
            CHECK_OK(redlock_mux_lock_extend(fw, 20000));
            CHECK_OK(redlock_mux_lock_validity_ms(fw, &ms));
            CHECK(ms > 10000 && ms <= 20000);
            CHECK_RESULT(redlock_mux_lock_extend(fw, 0), REDLOCK_MUX_INVALID_ARGUMENT);
            CHECK_OK(redlock_mux_lock_fencing_token(fw, &again));
            CHECK(again == fence);
        }
        if (i == FENCED_GRANTS - 1) {
            redlock_mux_lock_free(fw); /* freeing a held lock releases it */
        } else {
            CHECK_OK(redlock_mux_lock_release(fw));
            CHECK_RESULT(redlock_mux_lock_release(fw), REDLOCK_MUX_RELEASED);
            CHECK_RESULT(redlock_mux_lock_fencing_token(fw, &again),
                         REDLOCK_MUX_RELEASED);
            CHECK_RESULT(redlock_mux_lock_extend(fw, 1000), REDLOCK_MUX_RELEASED);
            CHECK_RESULT(redlock_mux_lock_validity_ms(fw, &ms), REDLOCK_MUX_RELEASED);
            CHECK_RESULT(redlock_mux_lock_token(fw, token, sizeof token, &n),
                         REDLOCK_MUX_RELEASED);
            CHECK_RESULT(redlock_mux_lock_keep_alive(fw, 1000), REDLOCK_MUX_RELEASED);
            redlock_mux_lock_free(fw);
        }
    }
    /* A plain write lock on the resource is free again once the fenced one is freed. */
    w = NULL;
    CHECK_OK(redlock_mux_client_try_write_lock(client, key, len, 1000, &w));
    CHECK_OK(redlock_mux_lock_release(w));
    redlock_mux_lock_free(w);
    redlock_mux_lock_free(NULL);
}

/* One kept lock of each kind but the mutex (which test_keep_alive covers). */
enum { KEPT_READ, KEPT_WRITE, KEPT_SET, KEPT_FENCED, KEPT_FENCED_WRITE, KEPT_KINDS };

/* What the lost-lock test deletes on every node to take each kind's lock away. */
static const char *const KEPT_KEYS[KEPT_KINDS] = {
    "c-kept-read", "c-kept-write", "c-kept-set-a", "c-kept-fenced", "c-kept-fenced-write",
};
static const char *const KEPT_NODE_KEYS[KEPT_KINDS] = {
    "{rw:c-kept-read}:r", "{rw:c-kept-write}:w", "c-kept-set-a", "c-kept-fenced",
    "{rw:c-kept-fenced-write}:w",
};

#define KEPT_TTL_MS 1500

/* Every kind refuses a TTL that cannot keep it and a NULL callback (and stays held by hand), and
 * is then kept alive past its TTL; a lost lock calls back. */
static void test_keep_alive_every_kind(redlock_mux_client *client, int count, char **urls) {
    const uint8_t *set[2] = {(const uint8_t *)"c-kept-set-b", (const uint8_t *)"c-kept-set-a"};
    size_t set_lens[2] = {12, 12};
    redlock_mux_lock *other = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_lock *kept[KEPT_KINDS];
    struct lost_notice *notices = calloc(KEPT_KINDS, sizeof *notices);
    uint64_t fence = 0, kept_fence = 777, fenced_write_fence = 0;
    const uint8_t *got = NULL;
    size_t n = 0;
    uint8_t lost = 0;
    int i, j, step, all;

    CHECK(notices != NULL);
    for (i = 0; i < KEPT_KINDS; i++) {
        CHECK(pthread_mutex_init(&notices[i].mutex, NULL) == 0);
        kept[i] = NULL;
    }
#define KEY_OF(i) (const uint8_t *)KEPT_KEYS[i], strlen(KEPT_KEYS[i])
    CHECK_OK(redlock_mux_client_try_read_lock(client, KEY_OF(KEPT_READ), KEPT_TTL_MS,
                                              &kept[KEPT_READ]));
    CHECK_OK(redlock_mux_client_write_lock(client, KEY_OF(KEPT_WRITE), KEPT_TTL_MS, NULL,
                                           &kept[KEPT_WRITE]));
    CHECK_OK(redlock_mux_client_try_lock_all(client, set, set_lens, 2, KEPT_TTL_MS,
                                             &kept[KEPT_SET]));
    CHECK_OK(redlock_mux_client_lock_fenced(client, KEY_OF(KEPT_FENCED), KEPT_TTL_MS, NULL,
                                            &kept[KEPT_FENCED]));
    CHECK_OK(redlock_mux_client_try_write_lock_fenced(client, KEY_OF(KEPT_FENCED_WRITE),
                                                      KEPT_TTL_MS, &kept[KEPT_FENCED_WRITE]));
    CHECK_OK(redlock_mux_lock_fencing_token(kept[KEPT_FENCED], &fence));
    CHECK_OK(redlock_mux_lock_fencing_token(kept[KEPT_FENCED_WRITE], &fenced_write_fence));

    for (i = 0; i < KEPT_KINDS; i++) {
        /* Refusals leave each lock held by hand: a TTL of 0, a NULL callback. */
        CHECK_RESULT(redlock_mux_lock_keep_alive(kept[i], 0), REDLOCK_MUX_INVALID_ARGUMENT);
        CHECK_RESULT(redlock_mux_lock_keep_alive_with_callback(kept[i], KEPT_TTL_MS, NULL, NULL),
                     REDLOCK_MUX_NULL_PARAMETER);
        CHECK(strstr(last_error(), "on_lost") != NULL);
        CHECK_OK(redlock_mux_lock_extend(kept[i], KEPT_TTL_MS));
        /* Kept: the keeper thread alone extends it, and a write lock no longer downgrades. */
        CHECK_OK(redlock_mux_lock_keep_alive_with_callback(kept[i], KEPT_TTL_MS, on_lost,
                                                           &notices[i]));
        CHECK_RESULT(redlock_mux_lock_extend(kept[i], KEPT_TTL_MS), REDLOCK_MUX_UNSUPPORTED);
        CHECK_RESULT(redlock_mux_lock_downgrade(kept[i], 0), REDLOCK_MUX_UNSUPPORTED);
        CHECK_RESULT(redlock_mux_lock_keep_alive(kept[i], KEPT_TTL_MS), REDLOCK_MUX_UNSUPPORTED);
    }

    /* What a kept lock tells: its key (a set's first, sorted, and all its keys), and a fenced
     * kind's token. */
    for (i = 0; i < KEPT_KINDS; i++) {
        CHECK_OK(redlock_mux_lock_key(kept[i], &got, &n));
        check_key(got, n, (const uint8_t *)KEPT_KEYS[i], strlen(KEPT_KEYS[i]));
    }
    CHECK_OK(redlock_mux_lock_key_count(kept[KEPT_SET], &n));
    CHECK(n == 2);
    CHECK_OK(redlock_mux_lock_key_at(kept[KEPT_SET], 1, &got, &n));
    check_key(got, n, set[0], set_lens[0]);
    CHECK_RESULT(redlock_mux_lock_fencing_token(kept[KEPT_SET], &kept_fence),
                 REDLOCK_MUX_UNSUPPORTED);
    CHECK(strstr(last_error(), "fenc") != NULL && kept_fence == 777);
    CHECK_OK(redlock_mux_lock_fencing_token(kept[KEPT_FENCED], &kept_fence));
    CHECK(kept_fence == fence);
    CHECK_OK(redlock_mux_lock_fencing_token(kept[KEPT_FENCED_WRITE], &kept_fence));
    CHECK(kept_fence == fenced_write_fence);

    /* Held past the TTL, extended in the background; others are still refused. */
    for (step = 0; step < 20; step++) {
        sleep_ms(100);
        for (i = 0; i < KEPT_KINDS; i++) {
            CHECK_OK(redlock_mux_lock_is_lost(kept[i], &lost));
            CHECK(lost == 0);
        }
    }
    CHECK_RESULT(redlock_mux_client_try_lock(client, KEY_OF(KEPT_FENCED), 1000, &other),
                 REDLOCK_MUX_CONTENDED);
    CHECK_RESULT(redlock_mux_client_try_lock(client, set[0], set_lens[0], 1000, &other),
                 REDLOCK_MUX_CONTENDED);
    CHECK(other == SENTINEL(redlock_mux_lock, 0));

    /* Each lock's key disappears from every node: the next extension of each is refused, and
     * each callback runs once, on the keeper thread. */
    for (i = 0; i < KEPT_KINDS; i++) {
        for (j = 0; j < count; j++) {
            redis_del(urls[j], (const uint8_t *)KEPT_NODE_KEYS[i], strlen(KEPT_NODE_KEYS[i]));
        }
    }
    /* On Redis 8 a reader is a field of a hash at the writer key, not a member of the set. */
    for (j = 0; j < count; j++) {
        redis_del(urls[j], (const uint8_t *)"{rw:c-kept-read}:w", strlen("{rw:c-kept-read}:w"));
    }
    for (step = 0, all = 0; step < 500 && !all; step++) { /* at most 5 s */
        sleep_ms(10);
        all = 1;
        for (i = 0; i < KEPT_KINDS; i++) {
            pthread_mutex_lock(&notices[i].mutex);
            all &= notices[i].calls > 0;
            pthread_mutex_unlock(&notices[i].mutex);
        }
    }
    for (i = 0; i < KEPT_KINDS; i++) {
        CHECK_OK(redlock_mux_lock_is_lost(kept[i], &lost));
        CHECK(lost == 1);
        pthread_mutex_lock(&notices[i].mutex);
        if (notices[i].calls != 1) {
            fprintf(stderr, "kept %s: %d lost-lock calls\n", KEPT_KEYS[i], notices[i].calls);
        }
        CHECK(notices[i].calls == 1);
        CHECK(notices[i].reason == REDLOCK_MUX_CONTENDED);
        CHECK(!pthread_equal(notices[i].thread, pthread_self()));
        pthread_mutex_unlock(&notices[i].mutex);
        CHECK_OK(redlock_mux_lock_release(kept[i]));
        redlock_mux_lock_free(kept[i]);
        pthread_mutex_destroy(&notices[i].mutex);
    }
#undef KEY_OF
    free(notices);
}

/* The number of threads of this process, or -1 if Linux's /proc cannot tell. */
static int thread_count(void) {
    DIR *dir = opendir("/proc/self/task");
    struct dirent *entry;
    int n = 0;
    if (dir == NULL) {
        return -1;
    }
    while ((entry = readdir(dir)) != NULL) {
        n += entry->d_name[0] != '.';
    }
    closedir(dir);
    return n;
}

static void test_keep_alive(int count, char **urls) {
    int before = thread_count(), i;
    redlock_mux_client *client = make_client(count, urls, 1000);
    test_keep_alive_holds_past_the_ttl(client);
    test_keep_alive_reports_a_lost_lock(client, count, urls);
    test_keep_alive_every_kind(client, count, urls);
    redlock_mux_client_free(client);
    /* The client's keeper thread ends on its own within one extension interval (333 ms here)
     * once the client and its locks are freed. Wait for it (at most 10 s), so that it is gone
     * before the program exits: valgrind counts a thread still running then as leaking. Fewer
     * than before is fine: a thread of an earlier test (or of an emulator running this program)
     * may end meanwhile. */
    for (i = 0; i < 1000 && before > 0 && thread_count() > before; i++) {
        sleep_ms(10);
    }
    CHECK(thread_count() <= before);
}

/* ---- A failed setter leaves the builder as it was. ---- */

static const uint8_t SETTER_KEY[] = "c-api-setters";

/* A builder with every node, a node timeout generous enough for valgrind, and a drift factor of
 * 0.25, which a client shows: a 10 s lock is valid for at most 10000 - 2500 - 2 ms. */
static redlock_mux_client_builder *configured_builder(int count, char **urls) {
    redlock_mux_client_builder *b = NULL;
    int i;
    CHECK_OK(redlock_mux_client_builder_new(&b));
    for (i = 0; i < count; i++) {
        CHECK_OK(redlock_mux_client_builder_add_node(b, urls[i], strlen(urls[i])));
    }
    CHECK_OK(redlock_mux_client_builder_set_node_timeout_ms(b, 1000));
    CHECK_OK(redlock_mux_client_builder_set_drift_factor(b, 0.25));
    return b;
}

/* Builds `b` and frees it; checks that the client has every node and the drift factor that
 * `configured_builder` set. `after` names what was done to the builder, for the failure. */
static void check_builds_as_configured(redlock_mux_client_builder *b, int count, char **urls,
                                       const char *after) {
    redlock_mux_client *c = NULL;
    redlock_mux_lock *l = NULL;
    redlock_mux_result r;
    uint64_t ms = 0;
    int i, tries;
    r = redlock_mux_client_builder_build(b, &c);
    if (r != REDLOCK_MUX_OK) {
        fprintf(stderr, "the builder does not build after %s\n", after);
    }
    CHECK_OK(r);
    redlock_mux_client_builder_free(b);
    CHECK_OK(redlock_mux_client_try_lock(c, SETTER_KEY, sizeof SETTER_KEY - 1, 10000, &l));
    CHECK_OK(redlock_mux_lock_validity_ms(l, &ms));
    if (!(ms > 0 && ms <= 7498)) {
        fprintf(stderr, "the drift factor was lost after %s\n", after);
    }
    CHECK(ms > 0 && ms <= 7498);
    /* Every node was sent the lock (the last one may apply it just after the quorum answered):
     * it is found there, and deleted behind the client's back. */
    for (i = 0; i < count; i++) {
        for (tries = 0; tries < 300 && !redis_del(urls[i], SETTER_KEY, sizeof SETTER_KEY - 1);
             tries++) {
            sleep_ms(10);
        }
        if (tries == 300) {
            fprintf(stderr, "node %d was lost after %s\n", i, after);
        }
        CHECK(tries < 300);
    }
    CHECK_OK(redlock_mux_lock_release(l)); /* keys already gone still count as released */
    redlock_mux_lock_free(l);
    redlock_mux_client_free(c);
}

/* Builds `b`, which must fail with INVALID_ARGUMENT naming `option`, and leave `out` alone. */
static void check_build_refuses(const redlock_mux_client_builder *b, const char *option) {
    redlock_mux_client *c = SENTINEL(redlock_mux_client, 0);
    CHECK_RESULT(redlock_mux_client_builder_build(b, &c), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(c == SENTINEL(redlock_mux_client, 0));
    CHECK(strstr(last_error(), option) != NULL);
}

#define SETTER_STEPS 10

/* Every setter that can fail on a live builder fails once, then the builder still builds with
 * its nodes and earlier settings. The setters of numbers take any value and leave its check
 * to the build (so a program that ignores a setter's result still hears of a bad value): for
 * them a value that build refuses is set, the build fails, and a good value then builds as
 * before. retry_count, fair and fair_after have no value to refuse; like every setter they fail
 * only on a NULL builder, which test_null_parameters covers. */
static void test_failed_setters_keep_the_builder(int count, char **urls) {
    static const char *const steps[SETTER_STEPS] = {
        "set_rw_policy(7)",
        "add_node(NULL)",
        "add_node(not UTF-8)",
        "add_node(SIZE_MAX bytes)",
        "node_timeout 0, a failed build, node_timeout 1000",
        "connect_timeout 0, a failed build, connect_timeout 1000",
        "retry_delay of two days, a failed build, retry_delay 50",
        "wait_timeout of two days, a failed build, wait_timeout 10000",
        "drift_factor 0.7, a failed build, drift_factor 0.25",
        "retry_count, fair and fair_after",
    };
    static const char url[] = "127.0.0.1:1";
    const uint64_t two_days_ms = 2ULL * 24 * 3600 * 1000;
    int step;
    for (step = 0; step < SETTER_STEPS; step++) {
        redlock_mux_client_builder *b = configured_builder(count, urls);
        switch (step) {
        case 0:
            CHECK_RESULT(redlock_mux_client_builder_set_rw_policy(b, 7),
                         REDLOCK_MUX_INVALID_ARGUMENT);
            CHECK(strstr(last_error(), "policy") != NULL);
            break;
        case 1:
            CHECK_RESULT(redlock_mux_client_builder_add_node(b, NULL, 5),
                         REDLOCK_MUX_NULL_PARAMETER);
            break;
        case 2:
            CHECK_RESULT(redlock_mux_client_builder_add_node(b, "\xff\xfe:1", 4),
                         REDLOCK_MUX_INVALID_ARGUMENT);
            CHECK(strstr(last_error(), "UTF-8") != NULL);
            break;
        case 3:
            CHECK_RESULT(redlock_mux_client_builder_add_node(b, url, SIZE_MAX),
                         REDLOCK_MUX_INVALID_ARGUMENT);
            break;
        case 4:
            CHECK_OK(redlock_mux_client_builder_set_node_timeout_ms(b, 0));
            check_build_refuses(b, "node_timeout");
            CHECK_OK(redlock_mux_client_builder_set_node_timeout_ms(b, 1000));
            break;
        case 5:
            CHECK_OK(redlock_mux_client_builder_set_connect_timeout_ms(b, 0));
            check_build_refuses(b, "connect_timeout");
            CHECK_OK(redlock_mux_client_builder_set_connect_timeout_ms(b, 1000));
            break;
        case 6:
            CHECK_OK(redlock_mux_client_builder_set_retry_delay_ms(b, two_days_ms));
            check_build_refuses(b, "retry_delay");
            CHECK_OK(redlock_mux_client_builder_set_retry_delay_ms(b, 50));
            break;
        case 7:
            CHECK_OK(redlock_mux_client_builder_set_wait_timeout_ms(b, two_days_ms));
            check_build_refuses(b, "wait_timeout");
            CHECK_OK(redlock_mux_client_builder_set_wait_timeout_ms(b, 10000));
            break;
        case 8:
            CHECK_OK(redlock_mux_client_builder_set_drift_factor(b, 0.7));
            check_build_refuses(b, "drift_factor");
            CHECK_OK(redlock_mux_client_builder_set_drift_factor(b, 0.25));
            break;
        default:
            CHECK_OK(redlock_mux_client_builder_set_retry_count(b, 3));
            CHECK_OK(redlock_mux_client_builder_set_fair(b, 0));
            CHECK_OK(redlock_mux_client_builder_set_fair_after_ms(b, 100));
            break;
        }
        check_builds_as_configured(b, count, urls, steps[step]);
    }
}

/* ---- Cancellation, per-call options, resume and statistics. ---- */

static long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000 + t.tv_nsec / 1000000L;
}

struct waiting_lock {
    redlock_mux_client *client;
    const uint8_t *key;
    size_t key_len;
    redlock_mux_acquire_options options;
    redlock_mux_result result;
    redlock_mux_lock *lock;
};

static void *lock_with_options(void *arg) {
    struct waiting_lock *w = arg;
    w->result = redlock_mux_client_lock(w->client, w->key, w->key_len, 10000, &w->options,
                                             &w->lock);
    return NULL;
}

static void test_cancel_null_parameters(redlock_mux_client *client) {
    redlock_mux_cancel *c = SENTINEL(redlock_mux_cancel, 0);
    redlock_mux_lock *l = SENTINEL(redlock_mux_lock, 1);
    redlock_mux_acquire_options bad = {0};
    redlock_mux_stats s;
    redlock_mux_node_stats ns;
    uint8_t yes = 7;

    CHECK_RESULT(redlock_mux_cancel_new(NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_cancel_cancel(NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_cancel_is_cancelled(NULL, &yes), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_OK(redlock_mux_cancel_new(&c));
    CHECK_RESULT(redlock_mux_cancel_is_cancelled(c, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK(yes == 7);
    CHECK_OK(redlock_mux_cancel_is_cancelled(c, &yes));
    CHECK(yes == 0);
    redlock_mux_cancel_free(c);
    redlock_mux_cancel_free(NULL);

    bad.set = 0x80;
    CHECK_RESULT(redlock_mux_client_lock(client, KEY, sizeof KEY, 1000, &bad, &l),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    bad.set = REDLOCK_MUX_ACQUIRE_TIMEOUT;
    bad.timeout_ms = 2ull * 24 * 3600 * 1000; /* two days */
    CHECK_RESULT(redlock_mux_client_lock(client, KEY, sizeof KEY, 1000, &bad, &l),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_RESULT(redlock_mux_client_resume_lock(client, KEY, sizeof KEY, NULL, 40, 1000, &l),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK(l == SENTINEL(redlock_mux_lock, 1));
    CHECK_RESULT(redlock_mux_client_stats(NULL, &s), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_stats(client, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_node_stats(NULL, 0, &ns), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_node_stats(client, 0, NULL), REDLOCK_MUX_NULL_PARAMETER);
}

/* A cancel from another thread ends a blocked acquire promptly, and the key is free as soon
 * as its holder lets go: the cancelled waiter left nothing on the nodes. */
static void test_cancel_from_another_thread(redlock_mux_client *client, int count, char **urls) {
    static const uint8_t key[] = "c-api-cancel";
    const size_t len = sizeof key - 1;
    redlock_mux_client *other = make_client(count, urls, 10000);
    redlock_mux_lock *held = NULL, *after = NULL;
    redlock_mux_cancel *cancel = NULL;
    struct waiting_lock w;
    pthread_t waiter;
    long started;
    uint8_t yes = 0;

    CHECK_OK(redlock_mux_client_try_lock(client, key, len, 10000, &held));
    CHECK_OK(redlock_mux_cancel_new(&cancel));
    memset(&w, 0, sizeof w);
    w.client = other;
    w.key = key;
    w.key_len = len;
    w.options.set = REDLOCK_MUX_ACQUIRE_TIMEOUT;
    w.options.timeout_ms = 10000;
    w.options.cancel = cancel;
    w.lock = SENTINEL(redlock_mux_lock, 0);
    CHECK(pthread_create(&waiter, NULL, lock_with_options, &w) == 0);
    sleep_ms(300);
    started = now_ms();
    CHECK_OK(redlock_mux_cancel_cancel(cancel));
    CHECK(pthread_join(waiter, NULL) == 0);
    /* Promptly: far less than the 10 s it would wait (generous for valgrind). */
    CHECK(now_ms() - started < 2000);
    CHECK(w.result == REDLOCK_MUX_CANCELLED);
    CHECK(w.lock == SENTINEL(redlock_mux_lock, 0));
    CHECK_OK(redlock_mux_cancel_is_cancelled(cancel, &yes));
    CHECK(yes == 1);

    CHECK_OK(redlock_mux_lock_release(held));
    redlock_mux_lock_free(held);
    CHECK_OK(redlock_mux_client_try_lock(client, key, len, 10000, &after));
    CHECK_OK(redlock_mux_lock_release(after));
    redlock_mux_lock_free(after);
    redlock_mux_cancel_free(cancel);
    redlock_mux_client_free(other);
}

/* A handle already cancelled ends every waiting acquire of every kind at once, with nothing
 * sent. */
static void test_cancelled_before_the_first_attempt(redlock_mux_client *client) {
    static const uint8_t key[] = "c-api-precancelled";
    const uint8_t *keys[2] = {(const uint8_t *)"c-api-precancelled-a",
                              (const uint8_t *)"c-api-precancelled-b"};
    size_t lens[2] = {20, 20};
    const size_t len = sizeof key - 1;
    redlock_mux_cancel *cancel = NULL;
    redlock_mux_acquire_options opts = {0};
    redlock_mux_lock *l = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_lock *r = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_lock *w = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_lock *m = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_lock *f = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_lock *fw = SENTINEL(redlock_mux_lock, 0);

    CHECK_OK(redlock_mux_cancel_new(&cancel));
    CHECK_OK(redlock_mux_cancel_cancel(cancel));
    opts.cancel = cancel;
    CHECK_RESULT(redlock_mux_client_lock(client, key, len, 1000, &opts, &l),
                 REDLOCK_MUX_CANCELLED);
    CHECK_RESULT(redlock_mux_client_read_lock(client, key, len, 1000, &opts, &r),
                 REDLOCK_MUX_CANCELLED);
    CHECK_RESULT(redlock_mux_client_write_lock(client, key, len, 1000, &opts, &w),
                 REDLOCK_MUX_CANCELLED);
    CHECK_RESULT(redlock_mux_client_lock_all(client, keys, lens, 2, 1000, &opts, &m),
                 REDLOCK_MUX_CANCELLED);
    CHECK_RESULT(redlock_mux_client_lock_fenced(client, key, len, 1000, &opts, &f),
                 REDLOCK_MUX_CANCELLED);
    CHECK_RESULT(redlock_mux_client_write_lock_fenced(client, key, len, 1000, &opts, &fw),
                 REDLOCK_MUX_CANCELLED);
    CHECK(strstr(redlock_mux_result_text(REDLOCK_MUX_CANCELLED), "cancel") != NULL);
    CHECK(l == SENTINEL(redlock_mux_lock, 0) && r == SENTINEL(redlock_mux_lock, 0) &&
          w == SENTINEL(redlock_mux_lock, 0) && m == SENTINEL(redlock_mux_lock, 0) &&
          f == SENTINEL(redlock_mux_lock, 0) &&
          fw == SENTINEL(redlock_mux_lock, 0));
    redlock_mux_cancel_free(cancel);

    /* Without a cancel handle, a zeroed struct keeps the client's settings. */
    opts.cancel = NULL;
    l = NULL;
    CHECK_OK(redlock_mux_client_lock(client, key, len, 1000, &opts, &l));
    CHECK_OK(redlock_mux_lock_release(l));
    redlock_mux_lock_free(l);
}

/* The client waits 10 s; a per-call timeout of 100 ms, or no retries, ends the wait early. */
static void test_per_call_timeout(redlock_mux_client *client, int count, char **urls) {
    static const uint8_t key[] = "c-api-per-call";
    const size_t len = sizeof key - 1;
    redlock_mux_client *patient = make_client(count, urls, 10000);
    redlock_mux_lock *held = NULL, *l = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_acquire_options opts = {0};
    long started;

    CHECK_OK(redlock_mux_client_try_lock(client, key, len, 10000, &held));
    opts.set = REDLOCK_MUX_ACQUIRE_TIMEOUT;
    opts.timeout_ms = 100;
    started = now_ms();
    CHECK_RESULT(redlock_mux_client_lock(patient, key, len, 10000, &opts, &l),
                 REDLOCK_MUX_CONTENDED);
    CHECK(now_ms() - started < 3000);
    CHECK(redlock_mux_last_error_deadline() == REDLOCK_MUX_DEADLINE_WAIT_TIMEOUT);
    opts.set = REDLOCK_MUX_ACQUIRE_RETRIES;
    opts.retries = 0;
    started = now_ms();
    CHECK_RESULT(redlock_mux_client_lock(patient, key, len, 10000, &opts, &l),
                 REDLOCK_MUX_CONTENDED);
    CHECK(now_ms() - started < 3000);
    CHECK(redlock_mux_last_error_deadline() == REDLOCK_MUX_DEADLINE_RETRY_COUNT);
    CHECK(l == SENTINEL(redlock_mux_lock, 0));
    CHECK_OK(redlock_mux_lock_release(held));
    redlock_mux_lock_free(held);
    redlock_mux_client_free(patient);
}

/* A lock taken by one client is resumed by another from its key and token, extended and
 * released. */
static void test_resume(redlock_mux_client *client, int count, char **urls) {
    static const uint8_t key[] = "c-api-resume";
    static const uint8_t bad_token[] = "not-a-token";
    const size_t len = sizeof key - 1;
    const uint8_t *keys[2] = {(const uint8_t *)"c-api-resume-a", (const uint8_t *)"c-api-resume-b"};
    size_t lens[2] = {14, 14};
    redlock_mux_client *other = make_client(count, urls, 2000);
    redlock_mux_lock *first = NULL, *resumed = NULL, *l = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_lock *rfirst = NULL, *rresumed = NULL;
    redlock_mux_lock *wfirst = NULL, *wresumed = NULL;
    redlock_mux_lock *mfirst = NULL, *mresumed = NULL;
    uint8_t token[REDLOCK_MUX_TOKEN_LEN], again[REDLOCK_MUX_TOKEN_LEN];
    size_t n = 0;
    uint64_t ms = 0;

    CHECK_OK(redlock_mux_client_try_lock(client, key, len, 5000, &first));
    CHECK_OK(redlock_mux_lock_token(first, token, sizeof token, &n));
    CHECK_RESULT(redlock_mux_client_resume_lock(other, key, len, bad_token, sizeof bad_token - 1,
                                                5000, &l),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(l == SENTINEL(redlock_mux_lock, 0));
    CHECK_OK(redlock_mux_client_resume_lock(other, key, len, token, n, 20000, &resumed));
    CHECK_OK(redlock_mux_lock_token(resumed, again, sizeof again, &n));
    CHECK(memcmp(token, again, sizeof token) == 0);
    CHECK_OK(redlock_mux_lock_validity_ms(resumed, &ms));
    CHECK(ms > 10000 && ms <= 20000); /* extended past the first TTL */
    CHECK_OK(redlock_mux_lock_extend(resumed, 30000));
    CHECK_OK(redlock_mux_lock_release(resumed));
    redlock_mux_lock_free(resumed);
    /* Released by the resumed handle: the key is free, and resuming again is refused. */
    CHECK_RESULT(redlock_mux_client_resume_lock(other, key, len, token, n, 5000, &l),
                 REDLOCK_MUX_CONTENDED);
    CHECK(l == SENTINEL(redlock_mux_lock, 0));
    resumed = NULL;
    CHECK_OK(redlock_mux_client_try_lock(other, key, len, 5000, &resumed));
    CHECK_OK(redlock_mux_lock_release(resumed));
    redlock_mux_lock_free(resumed);
    redlock_mux_lock_free(first); /* its release finds nothing to release */

    CHECK_OK(redlock_mux_client_try_read_lock(client, key, len, 5000, &rfirst));
    CHECK_OK(redlock_mux_lock_token(rfirst, token, sizeof token, &n));
    CHECK_OK(redlock_mux_client_resume_read_lock(other, key, len, token, n, 5000, &rresumed));
    CHECK_OK(redlock_mux_lock_release(rresumed));
    redlock_mux_lock_free(rresumed);
    redlock_mux_lock_free(rfirst);

    CHECK_OK(redlock_mux_client_try_write_lock(client, key, len, 5000, &wfirst));
    CHECK_OK(redlock_mux_lock_token(wfirst, token, sizeof token, &n));
    CHECK_OK(redlock_mux_client_resume_write_lock(other, key, len, token, n, 5000, &wresumed));
    CHECK_OK(redlock_mux_lock_release(wresumed));
    redlock_mux_lock_free(wresumed);
    redlock_mux_lock_free(wfirst);

    CHECK_OK(redlock_mux_client_try_lock_all(client, keys, lens, 2, 5000, &mfirst));
    CHECK_OK(redlock_mux_lock_token(mfirst, token, sizeof token, &n));
    CHECK_OK(redlock_mux_client_resume_lock_all(other, keys, lens, 2, token, n, 5000, &mresumed));
    CHECK_OK(redlock_mux_lock_release(mresumed));
    redlock_mux_lock_free(mresumed);
    redlock_mux_lock_free(mfirst);
    redlock_mux_client_free(other);
}

/* A fresh client counts a won round, a contended one and a cancellation, and per node the
 * reply latency. */
static void test_stats(int count, char **urls) {
    static const uint8_t key[] = "c-api-stats";
    const size_t len = sizeof key - 1;
    redlock_mux_client *c = make_client(count, urls, 2000);
    redlock_mux_lock *held = NULL, *l = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_cancel *cancel = NULL;
    redlock_mux_acquire_options opts = {0};
    redlock_mux_stats s;
    redlock_mux_node_stats ns, untouched;
    int i, answered = 0;

    CHECK_OK(redlock_mux_client_stats(c, &s));
    CHECK(s.mutex.won == 0 && s.mutex.contended == 0 && s.node_count == (size_t)count);

    CHECK_OK(redlock_mux_client_try_lock(c, key, len, 5000, &held));
    CHECK_RESULT(redlock_mux_client_try_lock(c, key, len, 5000, &l), REDLOCK_MUX_CONTENDED);
    CHECK_OK(redlock_mux_cancel_new(&cancel));
    CHECK_OK(redlock_mux_cancel_cancel(cancel));
    opts.cancel = cancel;
    CHECK_RESULT(redlock_mux_client_lock(c, key, len, 5000, &opts, &l), REDLOCK_MUX_CANCELLED);
    redlock_mux_cancel_free(cancel);
    CHECK_OK(redlock_mux_lock_release(held));
    redlock_mux_lock_free(held);

    CHECK_OK(redlock_mux_client_stats(c, &s));
    CHECK(s.mutex.won == 1 && s.mutex.contended == 1 && s.mutex.unreachable == 0);
    CHECK(s.read.won == 0 && s.all.won == 0 && s.cancellations == 1);
    for (i = 0; i < count; i++) {
        CHECK_OK(redlock_mux_client_node_stats(c, (size_t)i, &ns));
        CHECK(ns.timeout_failures + ns.connect_failures + ns.io_failures == 0);
        CHECK(ns.latency_samples <= 128 && ns.latency_p50_us <= ns.latency_p99_us);
        if (ns.latency_samples > 0) {
            CHECK(ns.latency_p99_us > 0);
            answered++;
        }
    }
    /* At least a quorum answered every round. */
    CHECK(answered >= count / 2 + 1);
    memset(&untouched, 0xab, sizeof untouched);
    ns = untouched;
    CHECK_RESULT(redlock_mux_client_node_stats(c, (size_t)count, &ns), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK(memcmp(&ns, &untouched, sizeof ns) == 0);
    redlock_mux_client_free(c);
}

static void test_semaphores(redlock_mux_client *client, int count) {
    static const uint8_t key[] = "c-api-sem";
    redlock_mux_lock *p1 = NULL, *p2 = NULL, *p3 = SENTINEL(redlock_mux_lock, 0);
    redlock_mux_acquire_options opts = {0};
    redlock_mux_stats s;
    uint8_t t1[REDLOCK_MUX_TOKEN_LEN], t2[REDLOCK_MUX_TOKEN_LEN];
    const uint8_t *got = NULL;
    size_t n = 0, q = 0;
    uint64_t ms = 0;
    uint32_t available = 99;

    /* The smallest safe quorum: floor(k * N / (k + 1)) + 1. */
    CHECK_OK(redlock_mux_semaphore_quorum(client, 1, &q));
    CHECK(q == (size_t)count / 2 + 1);
    CHECK_OK(redlock_mux_semaphore_quorum(client, 2, &q));
    CHECK(q == (size_t)(2 * count / 3 + 1));
    CHECK_RESULT(redlock_mux_semaphore_quorum(client, 0, &q), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_RESULT(redlock_mux_semaphore_quorum(NULL, 2, &q), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_semaphore_quorum(client, 2, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_acquire_permit(client, key, 9, 0, 1000, &p3),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_RESULT(redlock_mux_client_acquire_permit(NULL, key, 9, 2, 1000, NULL, &p3),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_acquire_permit(client, key, 9, 2, 1000, NULL, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK(p3 == SENTINEL(redlock_mux_lock, 0));

    /* Two permits, then none left. */
    CHECK_OK(redlock_mux_client_semaphore_available(client, key, 9, 2, &available));
    CHECK(available == 2);
    CHECK_OK(redlock_mux_client_try_acquire_permit(client, key, 9, 2, 10000, &p1));
    CHECK_OK(redlock_mux_client_acquire_permit(client, key, 9, 2, 10000, NULL, &p2));
    CHECK_RESULT(redlock_mux_client_try_acquire_permit(client, key, 9, 2, 10000, &p3),
                 REDLOCK_MUX_CONTENDED);
    CHECK(p3 == SENTINEL(redlock_mux_lock, 0));
    CHECK_OK(redlock_mux_client_semaphore_available(client, key, 9, 2, &available));
    CHECK(available == 0);
    /* A client that disagrees on the permits is misconfigured, not contended. */
    CHECK_RESULT(redlock_mux_client_try_acquire_permit(client, key, 9, 3, 10000, &p3),
                 REDLOCK_MUX_CONFIG);
    CHECK(p3 == SENTINEL(redlock_mux_lock, 0));

    CHECK_OK(redlock_mux_lock_token(p1, t1, sizeof t1, &n));
    CHECK_OK(redlock_mux_lock_token(p2, t2, sizeof t2, &n));
    CHECK(n == REDLOCK_MUX_TOKEN_LEN && memcmp(t1, t2, n) != 0);
    CHECK_OK(redlock_mux_lock_key(p1, &got, &n));
    CHECK(n == 9 && memcmp(got, key, n) == 0);
    CHECK_OK(redlock_mux_lock_extend(p1, 20000));
    CHECK_OK(redlock_mux_lock_validity_ms(p1, &ms));
    CHECK(ms > 10000 && ms <= 20000);
    CHECK_RESULT(redlock_mux_lock_extend(NULL, 5), REDLOCK_MUX_NULL_PARAMETER);
    /* A waiting call with its own timeout gives up on the full semaphore. */
    opts.set = REDLOCK_MUX_ACQUIRE_TIMEOUT;
    opts.timeout_ms = 100;
    CHECK_RESULT(redlock_mux_client_acquire_permit(client, key, 9, 2, 10000, &opts, &p3),
                 REDLOCK_MUX_CONTENDED);
    CHECK(p3 == SENTINEL(redlock_mux_lock, 0));
    /* A permit's token rebuilds its handle (as another process would). */
    p3 = NULL;
    CHECK_OK(redlock_mux_client_resume_permit(client, key, 9, 2, t2, sizeof t2, 10000, &p3));
    CHECK_OK(redlock_mux_lock_token(p3, t1, sizeof t1, &n));
    CHECK(memcmp(t1, t2, n) == 0);
    CHECK_RESULT(redlock_mux_client_resume_permit(client, key, 9, 2, t2, 3, 10000, &p3),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_OK(redlock_mux_lock_release(p3));
    redlock_mux_lock_free(p3);
    /* The permit is gone already: freeing its first handle releases nothing more. */
    redlock_mux_lock_free(p2);
    p2 = NULL;
    CHECK_OK(redlock_mux_client_try_acquire_permit(client, key, 9, 2, 10000, &p2));

    /* A released permit is free again; a kept one stays held. */
    CHECK_OK(redlock_mux_lock_release(p1));
    CHECK_RESULT(redlock_mux_lock_release(p1), REDLOCK_MUX_RELEASED);
    redlock_mux_lock_free(p1);
    CHECK_OK(redlock_mux_client_semaphore_available(client, key, 9, 2, &available));
    CHECK(available == 1);
    CHECK_OK(redlock_mux_lock_keep_alive(p2, 2000));
    CHECK_OK(redlock_mux_lock_validity_ms(p2, &ms));
    p1 = NULL;
    CHECK_OK(redlock_mux_client_try_acquire_permit(client, key, 9, 2, 10000, &p1));
    p3 = SENTINEL(redlock_mux_lock, 0);
    CHECK_RESULT(redlock_mux_client_try_acquire_permit(client, key, 9, 2, 10000, &p3),
                 REDLOCK_MUX_CONTENDED);
    CHECK(p3 == SENTINEL(redlock_mux_lock, 0));
    CHECK_OK(redlock_mux_lock_release(p2));
    redlock_mux_lock_free(p2);
    redlock_mux_lock_free(p1);
    redlock_mux_lock_free(NULL);

    /* One permit: one slot per node, one key on each node, as a mutex keeps it. */
    {
        static const uint8_t one[] = "c-api-sem1";
        redlock_mux_lock *a = NULL, *b = SENTINEL(redlock_mux_lock, 0);
        uint8_t ta[REDLOCK_MUX_TOKEN_LEN];
        CHECK_OK(redlock_mux_client_try_acquire_permit(client, one, 10, 1, 10000, &a));
        CHECK_RESULT(redlock_mux_client_try_acquire_permit(client, one, 10, 1, 10000, &b),
                     REDLOCK_MUX_CONTENDED);
        /* Two permits there are a sorted set's shape: misconfigured, not contended. */
        CHECK_RESULT(redlock_mux_client_try_acquire_permit(client, one, 10, 2, 10000, &b),
                     REDLOCK_MUX_CONFIG);
        CHECK(b == SENTINEL(redlock_mux_lock, 0));
        CHECK_OK(redlock_mux_lock_extend(a, 20000));
        CHECK_OK(redlock_mux_lock_token(a, ta, sizeof ta, &n));
        b = NULL;
        CHECK_OK(redlock_mux_client_resume_permit(client, one, 10, 1, ta, n, 10000, &b));
        CHECK_OK(redlock_mux_lock_release(b));
        redlock_mux_lock_free(b);
        redlock_mux_lock_free(a);
        CHECK_OK(redlock_mux_client_semaphore_available(client, one, 10, 1, &available));
        CHECK(available == 1);
    }

    CHECK_OK(redlock_mux_client_stats(client, &s));
    CHECK(s.semaphore.won >= 3 && s.semaphore.contended >= 1);
}

/* A write lock becomes a read lock with the same token, without letting a writer in; a lost
 * downgrade leaves nothing held, and the handle empty. */
static void test_downgrade(redlock_mux_client *client, int count, char **urls) {
    static const uint8_t key[] = "c-api-down";
    static const uint8_t lost_key[] = "c-api-down-lost";
    static const uint8_t lost_writer[] = "{rw:c-api-down-lost}:w";
    static const uint8_t fenced_key[] = "c-fenced-write"; /* test_fenced_write_locks' counter */
    redlock_mux_lock *w = NULL, *w2 = SENTINEL(redlock_mux_lock, 1);
    redlock_mux_lock *fw = NULL, *other = NULL;
    redlock_mux_kind kind = REDLOCK_MUX_KIND_MUTEX;
    uint8_t t1[REDLOCK_MUX_TOKEN_LEN], t2[REDLOCK_MUX_TOKEN_LEN];
    size_t n = 0;
    uint64_t ms = 0;
    int i;

    CHECK_RESULT(redlock_mux_lock_downgrade(NULL, 0), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_OK(redlock_mux_client_try_write_lock(client, key, sizeof key - 1, 10000, &w));
    CHECK_OK(redlock_mux_lock_token(w, t1, sizeof t1, &n));

    /* Won: the handle holds a read lock with the same token, for the lock's own TTL; readers
     * join, writers stay out. */
    CHECK_OK(redlock_mux_lock_downgrade(w, 0));
    CHECK_OK(redlock_mux_lock_kind(w, &kind));
    CHECK(kind == REDLOCK_MUX_KIND_READ);
    CHECK_OK(redlock_mux_lock_token(w, t2, sizeof t2, &n));
    CHECK(n == REDLOCK_MUX_TOKEN_LEN && memcmp(t1, t2, n) == 0);
    CHECK_OK(redlock_mux_lock_validity_ms(w, &ms));
    CHECK(ms > 9000 && ms <= 10000);
    CHECK_OK(redlock_mux_client_try_read_lock(client, key, sizeof key - 1, 10000, &other));
    CHECK_RESULT(redlock_mux_client_try_write_lock(client, key, sizeof key - 1, 10000, &w2),
                 REDLOCK_MUX_CONTENDED);
    CHECK(w2 == SENTINEL(redlock_mux_lock, 1));
    /* A read lock does not downgrade: refused, and still held. */
    CHECK_RESULT(redlock_mux_lock_downgrade(w, 0), REDLOCK_MUX_UNSUPPORTED);
    CHECK_OK(redlock_mux_lock_extend(w, 10000));
    CHECK_OK(redlock_mux_lock_release(other));
    redlock_mux_lock_free(other);
    CHECK_OK(redlock_mux_lock_release(w));
    redlock_mux_lock_free(w);

    /* Lost: the writer key went on every node. Nothing is held afterwards, and the handle is
     * released. */
    w = NULL;
    CHECK_OK(redlock_mux_client_try_write_lock(client, lost_key, sizeof lost_key - 1, 10000, &w));
    for (i = 0; i < count; i++) {
        redis_del(urls[i], lost_writer, sizeof lost_writer - 1);
    }
    CHECK_RESULT(redlock_mux_lock_downgrade(w, 0), REDLOCK_MUX_CONTENDED);
    CHECK_RESULT(redlock_mux_lock_release(w), REDLOCK_MUX_RELEASED);
    CHECK_RESULT(redlock_mux_lock_downgrade(w, 0), REDLOCK_MUX_RELEASED);
    redlock_mux_lock_free(w);
    w = NULL;
    CHECK_OK(redlock_mux_client_try_write_lock(client, lost_key, sizeof lost_key - 1, 10000, &w));
    redlock_mux_lock_free(w);

    /* A fenced write lock downgrades too, for the TTL asked for. */
    CHECK_OK(redlock_mux_client_write_lock_fenced(client, fenced_key, sizeof fenced_key - 1, 10000,
                                                  NULL, &fw));
    CHECK_OK(redlock_mux_lock_downgrade(fw, 3000));
    CHECK_OK(redlock_mux_lock_validity_ms(fw, &ms));
    CHECK(ms > 0 && ms <= 3000);
    redlock_mux_lock_free(fw);
}

int main(int argc, char **argv) {
    redlock_mux_client *client;
    if (argc < 2) {
        fprintf(stderr, "usage: %s REDIS_URL...\n", argv[0]);
        return 2;
    }
    client = make_client(argc - 1, argv + 1, 2000);

    test_static_text();
    test_null_parameters(client);
    test_bad_arguments(client);
    test_failed_setters_keep_the_builder(argc - 1, argv + 1);
    test_lock_and_unlock(client);
    test_client_freed_before_lock(argc - 1, argv + 1);
    test_fair_client(argc - 1, argv + 1);
    test_read_write_locks(client);
    test_last_error_deadline(client, argc - 1, argv + 1);
    test_quorum_unreachable();
    test_config_error(argv[1]);
    test_tls_setters(argv[1]);
    test_threads_share_a_client(client);
    test_last_error_is_per_thread(client, argc - 1, argv + 1);
    test_lock_null_parameters(client);
    test_multi_locks(client);
    test_fenced_locks(client);
    test_one_key_handles_give_their_key(client);
    test_fenced_write_locks(client);
    test_one_handle_for_every_kind(client);
    test_keep_alive(argc - 1, argv + 1);
    test_cancel_null_parameters(client);
    test_cancel_from_another_thread(client, argc - 1, argv + 1);
    test_cancelled_before_the_first_attempt(client);
    test_per_call_timeout(client, argc - 1, argv + 1);
    test_resume(client, argc - 1, argv + 1);
    test_stats(argc - 1, argv + 1);
    test_semaphores(client, argc - 1);
    test_downgrade(client, argc - 1, argv + 1);

    redlock_mux_client_free(client);
    printf("%d passed, 0 failed\n", checks_run);
    return 0;
}
