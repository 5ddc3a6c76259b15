/*
 * A child never releases its parent's locks: the parent takes two locks and forks; the child
 * frees one handle (as cleanup code and atexit handlers do), releases the other, and frees its
 * client. The parent's locks must stay as they were: another client cannot take them, and the
 * parent still releases them.
 *
 *     fork_inherit URL...
 *
 * Exits non-zero, naming the failed check, when the child changed the parent's locks or its
 * release was not refused.
 */
#define _POSIX_C_SOURCE 200809L
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

int main(int argc, char **argv) {
    redlock_mux_client *client, *other;
    redlock_mux_lock *freed = NULL, *released = NULL, *stolen = NULL;
    uint8_t lost = 1;
    int status = 0;
    pid_t pid;

    if (argc < 2) {
        fprintf(stderr, "usage: %s REDIS_URL...\n", argv[0]);
        return 2;
    }
    client = make_client(argc - 1, argv + 1, 10000);
    CHECK_OK(redlock_mux_client_try_lock(client, (const uint8_t *)"inherited:freed", 15, 20000,
                                         &freed));
    CHECK_OK(redlock_mux_client_try_lock(client, (const uint8_t *)"inherited:released", 18,
                                         20000, &released));
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        redlock_mux_result r;
        redlock_mux_lock_free(freed);
        r = redlock_mux_lock_release(released);
        if (r != REDLOCK_MUX_OTHER_PROCESS) {
            fprintf(stderr, "child: release of an inherited lock gave %s (%s)\n",
                    redlock_mux_result_text(r), last_error());
        }
        redlock_mux_lock_free(released);
        redlock_mux_client_free(client);
        _exit(r == REDLOCK_MUX_OTHER_PROCESS ? 0 : 3);
    }
    CHECK(waitpid(pid, &status, 0) == pid);
    /* The locks are the parent's still: held, and another client cannot take them. */
    CHECK_OK(redlock_mux_lock_is_lost(freed, &lost));
    CHECK(lost == 0);
    CHECK_OK(redlock_mux_lock_is_lost(released, &lost));
    CHECK(lost == 0);
    other = make_client(argc - 1, argv + 1, 10000);
    CHECK_RESULT(redlock_mux_client_try_lock(other, (const uint8_t *)"inherited:freed", 15, 20000,
                                             &stolen),
                 REDLOCK_MUX_CONTENDED);
    CHECK_RESULT(redlock_mux_client_try_lock(other, (const uint8_t *)"inherited:released", 18,
                                             20000, &stolen),
                 REDLOCK_MUX_CONTENDED);
    /* The child's release was refused, and said why. */
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_OK(redlock_mux_lock_release(freed));
    CHECK_OK(redlock_mux_lock_release(released));
    redlock_mux_lock_free(freed);
    redlock_mux_lock_free(released);
    redlock_mux_client_free(other);
    redlock_mux_client_free(client);
    printf("the child's free and release left the parent's locks alone\n");
    return 0;
}
