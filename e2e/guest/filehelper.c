/*
 * filehelper: the file calls the guest tests need and busybox lacks.
 *
 *   filehelper copy SRC DST
 *       copy SRC into a new DST with copy_file_range(2) only (on NFSv4.2 the
 *       client turns it into COPY: the server copies, no data crosses the
 *       wire); prints "copied BYTES"; exit 1 if the kernel copies less.
 *   filehelper sparse-copy SRC DST
 *       copy only SRC's data segments (lseek SEEK_DATA / SEEK_HOLE: NFSv4.2
 *       SEEK) into a new DST of the same size, leaving the holes unwritten;
 *       prints "segments N data BYTES".
 *   filehelper xattr-set FILE NAME VALUE | xattr-get FILE NAME |
 *              xattr-list FILE | xattr-remove FILE NAME
 *       setxattr / getxattr (prints the value) / listxattr (one name per
 *       line) / removexattr; xattr-get exits 3 when the attribute is absent
 *       (ENODATA).
 *
 * Exit 0 on success, 1 on any error (named on stderr), 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

enum { XATTR_BYTES_MAX = 65536, CHUNK_BYTES = 1 << 20 };

static int die(const char *what, const char *path)
{
	fprintf(stderr, "filehelper: %s %s: %s\n", what, path, strerror(errno));
	return 1;
}

static int open_pair(const char *src, const char *dst, int *in, int *out, off_t *size)
{
	struct stat st;
	*in = open(src, O_RDONLY);
	if (*in < 0)
		return die("open", src);
	if (fstat(*in, &st) < 0)
		return die("stat", src);
	*size = st.st_size;
	*out = open(dst, O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (*out < 0)
		return die("create", dst);
	return 0;
}

static int copy(const char *src, const char *dst)
{
	int in, out;
	off_t size, done = 0;
	if (open_pair(src, dst, &in, &out, &size))
		return 1;
	while (done < size) {
		ssize_t n = copy_file_range(in, NULL, out, NULL, (size_t)(size - done), 0);
		if (n < 0)
			return die("copy_file_range to", dst);
		if (n == 0)
			break;
		done += n;
	}
	if (fsync(out) < 0)
		return die("fsync", dst);
	printf("copied %lld\n", (long long)done);
	return done == size ? 0 : 1;
}

static int sparse_copy(const char *src, const char *dst)
{
	int in, out;
	off_t size, pos = 0, data_bytes = 0;
	long segments = 0;
	static char buf[CHUNK_BYTES];
	if (open_pair(src, dst, &in, &out, &size))
		return 1;
	while (pos < size) {
		off_t start = lseek(in, pos, SEEK_DATA);
		if (start < 0) {
			if (errno == ENXIO)
				break; /* only a hole is left */
			return die("SEEK_DATA in", src);
		}
		off_t end = lseek(in, start, SEEK_HOLE);
		if (end < 0)
			return die("SEEK_HOLE in", src);
		segments++;
		for (off_t at = start; at < end;) {
			size_t want = (size_t)(end - at) < sizeof buf ? (size_t)(end - at) : sizeof buf;
			ssize_t n = pread(in, buf, want, at);
			if (n <= 0)
				return die("read", src);
			if (pwrite(out, buf, (size_t)n, at) != n)
				return die("write", dst);
			at += n;
			data_bytes += n;
		}
		pos = end;
	}
	if (ftruncate(out, size) < 0 || fsync(out) < 0)
		return die("size", dst);
	printf("segments %ld data %lld\n", segments, (long long)data_bytes);
	return 0;
}

int main(int argc, char **argv)
{
	static char val[XATTR_BYTES_MAX];
	if (argc == 4 && !strcmp(argv[1], "copy"))
		return copy(argv[2], argv[3]);
	if (argc == 4 && !strcmp(argv[1], "sparse-copy"))
		return sparse_copy(argv[2], argv[3]);
	if (argc == 5 && !strcmp(argv[1], "xattr-set")) {
		if (setxattr(argv[2], argv[3], argv[4], strlen(argv[4]), 0) < 0)
			return die("setxattr", argv[2]);
		return 0;
	}
	if (argc == 4 && !strcmp(argv[1], "xattr-get")) {
		ssize_t n = getxattr(argv[2], argv[3], val, sizeof val);
		if (n < 0)
			return errno == ENODATA ? 3 : die("getxattr", argv[2]);
		printf("%.*s\n", (int)n, val);
		return 0;
	}
	if (argc == 3 && !strcmp(argv[1], "xattr-list")) {
		ssize_t n = listxattr(argv[2], val, sizeof val);
		if (n < 0)
			return die("listxattr", argv[2]);
		for (ssize_t i = 0; i < n; i += (ssize_t)strlen(val + i) + 1)
			printf("%s\n", val + i);
		return 0;
	}
	if (argc == 4 && !strcmp(argv[1], "xattr-remove")) {
		if (removexattr(argv[2], argv[3]) < 0)
			return die("removexattr", argv[2]);
		return 0;
	}
	fprintf(stderr, "usage: filehelper copy|sparse-copy SRC DST | xattr-set FILE NAME VALUE | xattr-get FILE NAME | xattr-list FILE | xattr-remove FILE NAME\n");
	return 2;
}
