/*
 * Tests of the C API against real redis-server processes, whose URLs are the arguments.
 * Prints "N passed, 0 failed" and exits 0, or names the failing check and exits non-zero.
 */
#include <pthread.h>
#include <stdint.h>

#include "check.h"

/* Distinct addresses the library must leave untouched when a call fails. */
static int sentinel_storage[4];
#define SENTINEL(type, i) ((type *)(void *)&sentinel_storage[i])

static const uint8_t KEY[] = {'c', '-', 'a', 'p', 'i', 0, 'k', 'e', 'y'}; /* binary, with NUL */

static void test_static_text(void) {
    CHECK(strcmp(redlock_mux_result_text(REDLOCK_MUX_OK), "ok") == 0);
    CHECK(strstr(redlock_mux_result_text(REDLOCK_MUX_CONTENDED), "contended") != NULL);
    CHECK(strcmp(redlock_mux_result_text(12345), "unknown result code") == 0);
    CHECK(strlen(redlock_mux_version()) > 0);
    /* The numbers are part of the ABI. */
    CHECK(REDLOCK_MUX_OK == 0 && REDLOCK_MUX_NULL_PARAMETER == 1 &&
          REDLOCK_MUX_INVALID_ARGUMENT == 2 && REDLOCK_MUX_CONTENDED == 3 &&
          REDLOCK_MUX_QUORUM_UNREACHABLE == 4 && REDLOCK_MUX_VALIDITY_EXPIRED == 5 &&
          REDLOCK_MUX_IO == 6 && REDLOCK_MUX_BUFFER_TOO_SMALL == 7 && REDLOCK_MUX_RELEASED == 8 &&
          REDLOCK_MUX_PANIC == 9);
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
    CHECK_RESULT(redlock_mux_client_lock(NULL, KEY, sizeof KEY, 1000, &l), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_lock(client, NULL, 3, 1000, &l), REDLOCK_MUX_NULL_PARAMETER);
    CHECK(l == SENTINEL(redlock_mux_lock, 2));
    /* A NULL out is refused before the lock is taken: the key stays free. */
    CHECK_RESULT(redlock_mux_client_try_lock(client, KEY, sizeof KEY, 1000, NULL),
                 REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_lock(client, KEY, sizeof KEY, 1000, NULL),
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
    CHECK_RESULT(redlock_mux_client_lock(client, KEY, sizeof KEY, 1, &l), REDLOCK_MUX_INVALID_ARGUMENT);
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
    CHECK_OK(redlock_mux_client_lock(client, KEY, sizeof KEY, 10000, &b));
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

    CHECK_OK(redlock_mux_client_lock(client, KEY, sizeof KEY, 10000, &a));
    /* A waiter gives up after its retries while the lock is held. */
    CHECK_RESULT(redlock_mux_client_lock(client, KEY, sizeof KEY, 10000, &w), REDLOCK_MUX_CONTENDED);
    CHECK(w == SENTINEL(redlock_mux_lock, 0));
    CHECK_OK(redlock_mux_lock_release(a));
    redlock_mux_lock_free(a);
    redlock_mux_client_free(client);
}

static void test_read_write_locks(redlock_mux_client *client) {
    static const uint8_t key[] = "c-api-rw";
    redlock_mux_read_lock *r1 = NULL, *r2 = NULL, *r3 = SENTINEL(redlock_mux_read_lock, 0);
    redlock_mux_write_lock *w = SENTINEL(redlock_mux_write_lock, 1);
    redlock_mux_client_builder *b = NULL;
    uint8_t t1[REDLOCK_MUX_TOKEN_LEN], t2[REDLOCK_MUX_TOKEN_LEN];
    size_t n = 0;
    uint64_t ms = 0;

    CHECK_RESULT(redlock_mux_client_try_read_lock(NULL, key, 8, 1000, &r1), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_write_lock(client, NULL, 8, 1000, &w), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_read_lock(client, key, 8, 1000, NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_client_try_write_lock(client, key, 0, 1000, &w),
                 REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_RESULT(redlock_mux_read_lock_release(NULL), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_RESULT(redlock_mux_write_lock_extend(NULL, 5), REDLOCK_MUX_NULL_PARAMETER);
    CHECK_OK(redlock_mux_client_builder_new(&b));
    CHECK_RESULT(redlock_mux_client_builder_set_rw_policy(b, 7), REDLOCK_MUX_INVALID_ARGUMENT);
    CHECK_OK(redlock_mux_client_builder_set_rw_policy(b, REDLOCK_MUX_RW_WRITE_PREFERRING));
    redlock_mux_client_builder_free(b);

    /* Readers share. */
    CHECK_OK(redlock_mux_client_try_read_lock(client, key, 8, 10000, &r1));
    CHECK_OK(redlock_mux_client_read_lock(client, key, 8, 10000, &r2));
    CHECK_OK(redlock_mux_read_lock_token(r1, t1, sizeof t1, &n));
    CHECK_OK(redlock_mux_read_lock_token(r2, t2, sizeof t2, &n));
    CHECK(n == REDLOCK_MUX_TOKEN_LEN && memcmp(t1, t2, n) != 0);
    CHECK_OK(redlock_mux_read_lock_extend(r1, 20000));
    CHECK_OK(redlock_mux_read_lock_validity_ms(r1, &ms));
    CHECK(ms > 10000 && ms <= 20000);
    /* A writer is kept out while readers hold it. */
    CHECK_RESULT(redlock_mux_client_try_write_lock(client, key, 8, 10000, &w), REDLOCK_MUX_CONTENDED);
    CHECK(w == SENTINEL(redlock_mux_write_lock, 1));
    CHECK_OK(redlock_mux_read_lock_release(r1));
    CHECK_RESULT(redlock_mux_read_lock_release(r1), REDLOCK_MUX_RELEASED);
    redlock_mux_read_lock_free(r1);
    redlock_mux_read_lock_free(r2); /* releases the last reader */

    /* The writer gets in, and keeps readers out. */
    w = NULL;
    CHECK_OK(redlock_mux_client_try_write_lock(client, key, 8, 10000, &w));
    CHECK_OK(redlock_mux_write_lock_validity_ms(w, &ms));
    CHECK(ms > 9000 && ms <= 10000);
    CHECK_OK(redlock_mux_write_lock_token(w, t1, sizeof t1, &n));
    CHECK_RESULT(redlock_mux_client_try_read_lock(client, key, 8, 10000, &r3), REDLOCK_MUX_CONTENDED);
    CHECK(r3 == SENTINEL(redlock_mux_read_lock, 0));
    CHECK_OK(redlock_mux_write_lock_extend(w, 10000));
    CHECK_OK(redlock_mux_write_lock_release(w));
    CHECK_RESULT(redlock_mux_write_lock_extend(w, 10000), REDLOCK_MUX_RELEASED);
    redlock_mux_write_lock_free(w);
    redlock_mux_read_lock_free(NULL);
    redlock_mux_write_lock_free(NULL);
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
        if (redlock_mux_client_lock(w->client, (const uint8_t *)key, strlen(key), 5000, &l) !=
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
    test_lock_and_unlock(client);
    test_client_freed_before_lock(argc - 1, argv + 1);
    test_fair_client(argc - 1, argv + 1);
    test_read_write_locks(client);
    test_quorum_unreachable();
    test_threads_share_a_client(client);

    redlock_mux_client_free(client);
    printf("%d passed, 0 failed\n", checks_run);
    return 0;
}
