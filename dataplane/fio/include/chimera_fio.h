/* The C ABI of dataplane/fio (src/capi.rs): one engine per fio job.
 * Functions returning int answer 0 / an index, or -errno with a message in
 * `err` (NUL-terminated, at most errlen bytes). */
#ifndef CHIMERA_FIO_H
#define CHIMERA_FIO_H

#include <stddef.h>
#include <stdint.h>

struct chimera_fio;

struct chimera_fio_config {
	const char *server;   /* host or host:port (2049 when left out) */
	const char *export;   /* e.g. "/memfs" */
	unsigned int mount_port; /* 0: MOUNT on the NFS connection */
	unsigned int conns;   /* TCP connections, 1..64 */
	unsigned int iodepth; /* calls in flight together */
	unsigned int uid, gid; /* AUTH_SYS */
	unsigned int pnfs;    /* 1: NFSv4.1 to the MDS, I/O straight to the data servers */
	unsigned int busy_poll_us; /* poll without sleeping this long before blocking, 0..1000 */
	unsigned int retry_s; /* I/Os of a lost connection wait this long for a reconnect, 0..3600 */
	unsigned int hold_mib; /* MiB of answered UNSTABLE writes kept to resend after a server restart, 0..4096 */
	const char *transport; /* "tcp" (NULL: tcp) or "rdma": RPC-over-RDMA, server port 20049 when left out */
};

enum chimera_fio_op { CHIMERA_FIO_READ = 0, CHIMERA_FIO_WRITE = 1, CHIMERA_FIO_SYNC = 2 };

struct chimera_fio *chimera_fio_connect(const struct chimera_fio_config *cfg, char *err, size_t errlen);
int chimera_fio_open(struct chimera_fio *h, const char *path, int create, char *err, size_t errlen);
int chimera_fio_close(struct chimera_fio *h, int file, char *err, size_t errlen);
/* 0: queued; -EAGAIN: busy (the send queue is full while other I/Os are in
 * flight; nothing was queued: reap, then queue it again); other -errno:
 * failed, the message in err. */
int chimera_fio_queue(struct chimera_fio *h, int file, int op, uint64_t offset, void *buf, uint64_t len,
		      uint64_t tag, char *err, size_t errlen);
int chimera_fio_commit(struct chimera_fio *h); /* send what queue queued */
int chimera_fio_reap(struct chimera_fio *h, unsigned int min, unsigned int max, int64_t timeout_ns,
		     uint64_t *tags, int64_t *results);
unsigned int chimera_fio_in_flight(const struct chimera_fio *h);
void chimera_fio_free(struct chimera_fio *h);

#endif
