/*
 * A client used on both sides of fork(), as pre-forking servers and daemons do: build a client,
 * take and release one lock (its connections are now open), fork, then loop try_lock + release
 * on one key in parent and child for 3 s. The child must open connections of its own: had both
 * processes written on the same sockets, each would read replies meant for the other (errors,
 * or another process's +OK taken as its own vote). A marker file created exclusively while the
 * lock is held catches two holders.
 *
 *     fork MARKER URL...
 *
 * Prints "parent: G granted, C contended, F failed" and the same for the child; exits non-zero
 * on an overlap, on failures beyond a loaded machine's few, or when a side never got the lock.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

struct counts {
    unsigned granted, contended, failed, overlaps;
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static struct counts contend(redlock_mux_client *client, const char *marker, double until) {
    struct counts c = {0, 0, 0, 0};
    unsigned rounds = 0;
    while (now_s() < until && rounds++ < 20000) {
        redlock_mux_lock *lock = NULL;
        redlock_mux_result r =
            redlock_mux_client_try_lock(client, (const uint8_t *)"forked", 6, 10000, &lock);
        if (r == REDLOCK_MUX_OK) {
            int fd = open(marker, O_CREAT | O_EXCL | O_WRONLY, 0600);
            c.granted++;
            if (fd < 0) {
                c.overlaps++;
            } else {
                close(fd);
                unlink(marker);
            }
            if (redlock_mux_lock_release(lock) != REDLOCK_MUX_OK) {
                c.failed++;
            }
            redlock_mux_lock_free(lock);
        } else if (r == REDLOCK_MUX_CONTENDED) {
            c.contended++;
        } else {
            if (c.failed++ == 0) {
                fprintf(stderr, "%s: %s\n", redlock_mux_result_text(r), last_error());
            }
        }
    }
    return c;
}

int main(int argc, char **argv) {
    redlock_mux_client *client;
    redlock_mux_lock *lock = NULL;
    struct counts mine;
    int fds[2], status = 0;
    pid_t pid;
    const char *marker;
    double until;
    unsigned rounds;

    if (argc < 3) {
        fprintf(stderr, "usage: %s MARKER REDIS_URL...\n", argv[0]);
        return 2;
    }
    marker = argv[1];
    client = make_client(argc - 2, argv + 2, 10000);
    CHECK_OK(redlock_mux_client_try_lock(client, (const uint8_t *)"forked", 6, 10000, &lock));
    CHECK_OK(redlock_mux_lock_release(lock));
    redlock_mux_lock_free(lock);

    CHECK(pipe(fds) == 0);
    until = now_s() + 3.0;
    pid = fork();
    CHECK(pid >= 0);
    mine = contend(client, marker, until);
    if (pid == 0) {
        ssize_t w = write(fds[1], &mine, sizeof mine);
        redlock_mux_client_free(client);
        _exit(w == (ssize_t)sizeof mine ? 0 : 1);
    }
    {
        struct counts child;
        ssize_t got;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        got = read(fds[0], &child, sizeof child);
        CHECK(got == (ssize_t)sizeof child);
        printf("parent: %u granted, %u contended, %u failed\n", mine.granted, mine.contended,
               mine.failed);
        printf("child: %u granted, %u contended, %u failed\n", child.granted, child.contended,
               child.failed);
        rounds = mine.granted + mine.contended + child.granted + child.contended;
        CHECK(mine.overlaps + child.overlaps == 0);
        CHECK(mine.granted > 0 && child.granted > 0);
        CHECK(mine.failed + child.failed <= (rounds / 100 > 3 ? rounds / 100 : 3));
    }
    /* The parent's connections still work. */
    CHECK_OK(redlock_mux_client_try_lock(client, (const uint8_t *)"after", 5, 10000, &lock));
    CHECK_OK(redlock_mux_lock_release(lock));
    redlock_mux_lock_free(lock);
    redlock_mux_client_free(client);
    return 0;
}
