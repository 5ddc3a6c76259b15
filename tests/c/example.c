/*
 * A C program using redlock-mux: take a lock, do work within its validity, extend it, release.
 *
 *     sudo bash capi/install.sh --prefix /usr/local && sudo ldconfig
 *     cc tests/c/example.c $(pkg-config --cflags --libs redlock_mux) -o example
 *     ./example redis://127.0.0.1:7000 redis://127.0.0.1:7001 redis://127.0.0.1:7002
 *
 * Exits with 0 on success, or with the redlock_mux_result of the call that failed.
 */
#include <stdio.h>
#include <string.h>

#include "redlock_mux.h"

/* Prints what failed, with the full message of the last failure on this thread. */
static int fail(const char *what, redlock_mux_result r) {
    char message[1024];
    size_t n = 0;
    if (redlock_mux_last_error_message(message, sizeof message, &n) != REDLOCK_MUX_OK) {
        message[0] = '\0';
    }
    fprintf(stderr, "%s: %s: %s\n", what, redlock_mux_result_text(r), message);
    return (int)r;
}

int main(int argc, char **argv) {
    redlock_mux_client_builder *builder = NULL;
    redlock_mux_client *client = NULL;
    redlock_mux_lock *lock = NULL;
    redlock_mux_result r;
    int i;

    if (argc < 2) {
        fprintf(stderr, "usage: %s REDIS_URL...\n", argv[0]);
        return 2;
    }

    /* One builder, one client per process; the client is safe to share between threads. */
    if ((r = redlock_mux_client_builder_new(&builder)) != REDLOCK_MUX_OK) {
        return fail("builder", r);
    }
    for (i = 1; i < argc; i++) {
        if ((r = redlock_mux_client_builder_add_node(builder, argv[i], strlen(argv[i]))) !=
            REDLOCK_MUX_OK) {
            redlock_mux_client_builder_free(builder);
            return fail("add node", r);
        }
    }
    redlock_mux_client_builder_set_wait_timeout_ms(builder, 5000);
    r = redlock_mux_client_builder_build(builder, &client);
    redlock_mux_client_builder_free(builder); /* the client does not need it any more */
    if (r != REDLOCK_MUX_OK) {
        return fail("build", r);
    }

    /* Keys are bytes: pointer plus length. Wait up to the wait timeout for the lock (NULL
     * options: as the client's settings say). */
    static const char key[] = "invoice:42";
    if ((r = redlock_mux_client_lock(client, (const uint8_t *)key, strlen(key), 10000, NULL, &lock)) !=
        REDLOCK_MUX_OK) {
        redlock_mux_client_free(client);
        return fail("lock", r);
    }

    uint8_t token[REDLOCK_MUX_TOKEN_LEN];
    size_t token_len = 0;
    uint64_t validity_ms = 0;
    if ((r = redlock_mux_lock_token(lock, token, sizeof token, &token_len)) != REDLOCK_MUX_OK ||
        (r = redlock_mux_lock_validity_ms(lock, &validity_ms)) != REDLOCK_MUX_OK) {
        fail("inspect", r);
        goto out;
    }
    printf("locked %s with token %.*s, valid for %llu ms\n", key, (int)token_len,
           (const char *)token, (unsigned long long)validity_ms);

    /* ... work that must end within the validity; longer work extends the lock first ... */
    if ((r = redlock_mux_lock_extend(lock, 10000)) != REDLOCK_MUX_OK) {
        fail("extend", r);
        goto out;
    }
    redlock_mux_lock_validity_ms(lock, &validity_ms);
    printf("extended, valid for %llu ms\n", (unsigned long long)validity_ms);

    if ((r = redlock_mux_lock_release(lock)) != REDLOCK_MUX_OK) {
        fail("release", r);
        goto out;
    }
    printf("released\n");

out:
    /* The lock handle is freed whether or not it was released (freeing releases it). */
    redlock_mux_lock_free(lock);
    redlock_mux_client_free(client);
    return (int)r;
}
