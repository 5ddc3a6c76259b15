/*
 * One side of a contention test between two processes.
 *
 *     contend hold KEY URL...   takes the lock (waiting), prints "locked TOKEN", waits for a
 *                               line on stdin, releases, prints "released"
 *     contend try KEY URL...    one attempt; prints "locked TOKEN" and releases if it got it
 *     contend wait KEY URL...   like try, but waits for the lock (up to 10 s)
 *
 * Exits with 0, or with the redlock_mux_result of the call that failed.
 */
#include "check.h"

int main(int argc, char **argv) {
    redlock_mux_client *client;
    redlock_mux_lock *lock = NULL;
    redlock_mux_result r;
    uint8_t token[REDLOCK_MUX_TOKEN_LEN];
    size_t n = 0;
    const char *mode, *key;
    char line[16];

    if (argc < 4) {
        fprintf(stderr, "usage: %s hold|try|wait KEY REDIS_URL...\n", argv[0]);
        return 2;
    }
    mode = argv[1];
    key = argv[2];
    client = make_client(argc - 3, argv + 3, 10000);

    if (strcmp(mode, "try") == 0) {
        r = redlock_mux_client_try_lock(client, (const uint8_t *)key, strlen(key), 10000, &lock);
    } else {
        r = redlock_mux_client_lock(client, (const uint8_t *)key, strlen(key), 10000, NULL, &lock);
    }
    if (r != REDLOCK_MUX_OK) {
        fprintf(stderr, "%s: %s\n", redlock_mux_result_text(r), last_error());
        redlock_mux_client_free(client);
        return (int)r;
    }
    CHECK_OK(redlock_mux_lock_token(lock, token, sizeof token, &n));
    printf("locked %.*s\n", (int)n, (const char *)token);
    fflush(stdout);

    if (strcmp(mode, "hold") == 0 && fgets(line, sizeof line, stdin) == NULL) {
        fprintf(stderr, "stdin closed, releasing\n");
    }
    r = redlock_mux_lock_release(lock);
    redlock_mux_lock_free(lock);
    redlock_mux_client_free(client);
    if (r != REDLOCK_MUX_OK) {
        fprintf(stderr, "release: %s: %s\n", redlock_mux_result_text(r), last_error());
        return (int)r;
    }
    printf("released\n");
    return 0;
}
