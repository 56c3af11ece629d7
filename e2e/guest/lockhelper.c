/*
 * lockhelper: POSIX byte-range (fcntl) locks for the guest tests, where no
 * other tool takes an fcntl lock on a chosen range.
 *
 *   lockhelper hold FILE START LEN MAX_S FLAG
 *       take a write lock on [START, START+LEN), create FLAG once it is held,
 *       keep it until FLAG is removed (or MAX_S seconds pass), unlock, exit 0.
 *   lockhelper try FILE START LEN
 *       try a write lock without waiting: exit 0 when granted, 2 when another
 *       lock owner conflicts (EAGAIN/EACCES), 1 on any other error.
 *
 * Two processes are two lock owners, so on NFSv4 a conflict must come from the
 * server (LOCK answered NFS4ERR_DENIED), which is what the tests check.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { POLL_INTERVAL_MS = 20 };

static long parse_num(const char *what, const char *s)
{
	char *end = NULL;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 0) {
		fprintf(stderr, "lockhelper: %s must be a non-negative integer, got '%s'\n", what, s);
		exit(1);
	}
	return v;
}

static int set_lock(int fd, short type, long start, long len)
{
	struct flock fl;
	memset(&fl, 0, sizeof(fl));
	fl.l_type = type;
	fl.l_whence = SEEK_SET;
	fl.l_start = start;
	fl.l_len = len;
	return fcntl(fd, F_SETLK, &fl);
}

int main(int argc, char **argv)
{
	if (argc == 7 && strcmp(argv[1], "hold") == 0) {
		long start = parse_num("START", argv[3]), len = parse_num("LEN", argv[4]);
		long max_s = parse_num("MAX_S", argv[5]);
		int fd = open(argv[2], O_RDWR);
		if (fd < 0 || set_lock(fd, F_WRLCK, start, len) != 0) {
			fprintf(stderr, "lockhelper hold: %s: %s\n", argv[2], strerror(errno));
			return 1;
		}
		int flag = open(argv[6], O_CREAT | O_WRONLY, 0644);
		if (flag < 0) {
			fprintf(stderr, "lockhelper hold: flag %s: %s\n", argv[6], strerror(errno));
			return 1;
		}
		close(flag);
		struct timespec nap = { 0, POLL_INTERVAL_MS * 1000000L };
		for (long waited_ms = 0; waited_ms < max_s * 1000 && access(argv[6], F_OK) == 0;
		     waited_ms += POLL_INTERVAL_MS)
			nanosleep(&nap, NULL);
		if (set_lock(fd, F_UNLCK, start, len) != 0) {
			fprintf(stderr, "lockhelper hold: unlock: %s\n", strerror(errno));
			return 1;
		}
		return 0;
	}
	if (argc == 5 && strcmp(argv[1], "try") == 0) {
		long start = parse_num("START", argv[3]), len = parse_num("LEN", argv[4]);
		int fd = open(argv[2], O_RDWR);
		if (fd < 0) {
			fprintf(stderr, "lockhelper try: %s: %s\n", argv[2], strerror(errno));
			return 1;
		}
		if (set_lock(fd, F_WRLCK, start, len) == 0)
			return 0;
		if (errno == EAGAIN || errno == EACCES)
			return 2;
		fprintf(stderr, "lockhelper try: %s: %s\n", argv[2], strerror(errno));
		return 1;
	}
	fprintf(stderr, "usage: lockhelper hold FILE START LEN MAX_S FLAG | try FILE START LEN\n");
	return 1;
}
