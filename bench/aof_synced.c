/* LD_PRELOAD for redis-server in bench/faults.py: logs how much of each AOF file is on disk.
 *
 * Killing a process loses nothing it has write()n: the kernel still has it. A host crash loses
 * what was written and not yet fsynced. To measure that window without crashing a host, this
 * library records, at every successful fsync/fdatasync of a file whose name contains ".aof",
 * the file's size when the call started (everything up to there is durable once it returns) as
 * one "path size" line in $BW_AOF_SYNC_LOG. bench/faults.py then kills Redis and cuts the AOF
 * back to its last durable size: a power loss in which the page cache wrote back nothing more.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static long long aof_size(int fd, char *path, size_t room) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, room - 1);
    if (n <= 0) return -1;
    path[n] = 0;
    if (!strstr(path, ".aof")) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) return -1;
    return (long long)st.st_size;
}

static void record(const char *path, long long size) {
    static int out = -1; /* opened once: with appendfsync always this runs at every write */
    if (size < 0) return;
    if (out < 0) {
        const char *log = getenv("BW_AOF_SYNC_LOG");
        if (!log) return;
        out = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (out < 0) return;
    }
    dprintf(out, "%s %lld\n", path, size);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    char path[4096];
    long long size = aof_size(fd, path, sizeof path);
    int rc = real(fd);
    if (rc == 0) record(path, size);
    return rc;
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    char path[4096];
    long long size = aof_size(fd, path, sizeof path);
    int rc = real(fd);
    if (rc == 0) record(path, size);
    return rc;
}
