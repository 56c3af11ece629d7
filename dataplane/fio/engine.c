/*
 * fio's side of the Chimera engine: fio's ioengine_ops over the Rust engine
 * of this crate (include/chimera_fio.h). Compiled against the headers of the
 * fio that e2e/peers/fio-libnfs.sh builds (the structs fio shares with an
 * engine must have the same layout on both sides), by build-engine.sh.
 *
 *   fio --ioengine=external:chimera-fio.so --chimera_server=127.0.0.1:2049 \
 *       --chimera_export=/memfs [--chimera_conns=N] [--chimera_mount_port=P] [--chimera_pnfs=1] ...
 *
 * One engine per job (init runs in the job's own process or thread).
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "fio.h"
#include "optgroup.h"

#include "chimera_fio.h"

#define ERR_LEN 512

struct chimera_options {
	void *pad; /* fio keeps the thread_data pointer here */
	char *server;
	char *export;
	unsigned int mount_port;
	unsigned int conns;
	unsigned int pnfs;
	unsigned int busy_poll_us;
	unsigned int retry_s;
	unsigned int hold_mib;
	char *transport;
};

struct chimera_data {
	struct chimera_fio *h;
	struct io_u **events;
	uint64_t *tags;
	int64_t *results;
	unsigned int depth;
};

static struct fio_option options[] = {
	{
		.name = "chimera_server",
		.lname = "Chimera NFS server",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct chimera_options, server),
		.help = "NFS server: host or host:port (port 2049 when left out)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NFS,
	},
	{
		.name = "chimera_export",
		.lname = "Chimera export",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct chimera_options, export),
		.help = "export to mount, e.g. /memfs; file names are relative to it",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NFS,
	},
	{
		.name = "chimera_mount_port",
		.lname = "Chimera MOUNT port",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct chimera_options, mount_port),
		.def = "0",
		.minval = 0,
		.maxval = 65535,
		.help = "MOUNT's port when the server does not serve it on the NFS port (0: the NFS port)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NFS,
	},
	{
		.name = "chimera_conns",
		.lname = "Chimera connections",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct chimera_options, conns),
		.def = "1",
		.minval = 1,
		.maxval = 64,
		.help = "TCP connections per job; I/Os spread round-robin",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NFS,
	},
	{
		.name = "chimera_pnfs",
		.lname = "Chimera pNFS",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct chimera_options, pnfs),
		.def = "0",
		.help = "1: NFSv4.1 to the server as a pNFS metadata server, I/O straight to the data servers of its flex-files layouts",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NFS,
	},
	{
		.name = "chimera_busy_poll_us",
		.lname = "Chimera busy poll",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct chimera_options, busy_poll_us),
		.def = "0",
		.minval = 0,
		.maxval = 1000,
		.help = "microseconds to poll for replies without sleeping before blocking (0: never); lower latency for more client CPU",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NFS,
	},
	{
		.name = "chimera_retry_s",
		.lname = "Chimera reconnect window",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct chimera_options, retry_s),
		.def = "60",
		.minval = 0,
		.maxval = 3600,
		.help = "seconds the I/Os of a lost connection (a server restarting) wait for a reconnect and go out again before they fail (0: fail at once)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NFS,
	},
	{
		.name = "chimera_hold_mib",
		.lname = "Chimera held writes",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct chimera_options, hold_mib),
		.def = "16",
		.minval = 0,
		.maxval = 4096,
		.help = "MiB of answered UNSTABLE writes kept until a COMMIT covers them, to send again when the server restarted (0: keep none; a restart then fails the next fsync with EIO)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NFS,
	},
	{
		.name = "chimera_transport",
		.lname = "Chimera transport",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct chimera_options, transport),
		.def = "tcp",
		.help = "tcp, or rdma: RPC-over-RDMA v1 (RFC 8166) to the server's RDMA listener (port 20049 when chimera_server leaves it out)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NFS,
	},
	{
		.name = NULL,
	},
};

static int chimera_init(struct thread_data *td)
{
	struct chimera_options *o = td->eo;
	struct chimera_data *d;
	struct chimera_fio_config cfg;
	char err[ERR_LEN] = "";
	unsigned int depth = td->o.iodepth ? td->o.iodepth : 1;

	if (!o->server || !o->server[0]) {
		log_err("chimera: chimera_server is required (host or host:port of the NFS server)\n");
		return 1;
	}
	if (!o->export || !o->export[0]) {
		log_err("chimera: chimera_export is required (e.g. /memfs)\n");
		return 1;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return 1;
	d->depth = depth;
	d->events = calloc(depth, sizeof(*d->events));
	d->tags = calloc(depth, sizeof(*d->tags));
	d->results = calloc(depth, sizeof(*d->results));
	if (!d->events || !d->tags || !d->results)
		goto fail;
	memset(&cfg, 0, sizeof(cfg));
	cfg.server = o->server;
	cfg.export = o->export;
	cfg.mount_port = o->mount_port;
	cfg.conns = o->conns;
	cfg.iodepth = depth;
	cfg.uid = getuid();
	cfg.gid = getgid();
	cfg.pnfs = o->pnfs;
	cfg.busy_poll_us = o->busy_poll_us;
	cfg.retry_s = o->retry_s;
	cfg.hold_mib = o->hold_mib;
	cfg.transport = o->transport;
	d->h = chimera_fio_connect(&cfg, err, sizeof(err));
	if (!d->h) {
		log_err("chimera: %s\n", err);
		goto fail;
	}
	td->io_ops_data = d;
	return 0;
fail:
	free(d->events);
	free(d->tags);
	free(d->results);
	free(d);
	return 1;
}

static void chimera_cleanup(struct thread_data *td)
{
	struct chimera_data *d = td->io_ops_data;

	if (!d)
		return;
	chimera_fio_free(d->h);
	free(d->events);
	free(d->tags);
	free(d->results);
	free(d);
	td->io_ops_data = NULL;
}

static int chimera_open_file(struct thread_data *td, struct fio_file *f)
{
	struct chimera_data *d = td->io_ops_data;
	char err[ERR_LEN] = "";
	int create = td_write(td) ? 1 : 0;
	int idx = chimera_fio_open(d->h, f->file_name, create, err, sizeof(err));

	if (idx < 0) {
		log_err("chimera: %s\n", err);
		td_verror(td, -idx, "chimera_open_file");
		/* End the job: a time-based job would otherwise pick the next
		 * file and fail to open it for as long as it runs. */
		fio_mark_td_terminate(td);
		return -idx;
	}
	FILE_SET_ENG_DATA(f, (void *)(uintptr_t)(idx + 1));
	return 0;
}

static int chimera_close_file(struct thread_data *td, struct fio_file *f)
{
	struct chimera_data *d = td->io_ops_data;
	char err[ERR_LEN] = "";
	uintptr_t idx = (uintptr_t)FILE_ENG_DATA(f);
	int r;

	if (!idx)
		return 0;
	FILE_SET_ENG_DATA(f, NULL);
	r = chimera_fio_close(d->h, (int)(idx - 1), err, sizeof(err));
	if (r < 0) {
		log_err("chimera: %s\n", err);
		return -r;
	}
	return 0;
}

static enum fio_q_status chimera_queue(struct thread_data *td, struct io_u *io_u)
{
	struct chimera_data *d = td->io_ops_data;
	uintptr_t idx = (uintptr_t)FILE_ENG_DATA(io_u->file);
	char err[ERR_LEN] = "";
	int op, r;

	fio_ro_check(td, io_u);
	switch (io_u->ddir) {
	case DDIR_READ:
		op = CHIMERA_FIO_READ;
		break;
	case DDIR_WRITE:
		op = CHIMERA_FIO_WRITE;
		break;
	case DDIR_SYNC:
	case DDIR_DATASYNC:
	case DDIR_SYNC_FILE_RANGE:
		op = CHIMERA_FIO_SYNC;
		break;
	default:
		log_err("chimera: %s is not supported (NFSv3 has no trim)\n", io_ddir_name(io_u->ddir));
		io_u->error = EOPNOTSUPP;
		return FIO_Q_COMPLETED;
	}
	if (!idx) {
		io_u->error = EBADF;
		return FIO_Q_COMPLETED;
	}
	r = chimera_fio_queue(d->h, (int)(idx - 1), op, io_u->offset, io_u->xfer_buf, io_u->xfer_buflen,
			      (uint64_t)(uintptr_t)io_u, err, sizeof(err));
	/* EAGAIN: back-pressure (the send queue is full while other I/Os are
	 * in flight); fio reaps some and queues this one again. */
	if (r == -EAGAIN)
		return FIO_Q_BUSY;
	if (r < 0) {
		log_err("chimera: %s\n", err);
		io_u->error = -r;
		return FIO_Q_COMPLETED;
	}
	return FIO_Q_QUEUED;
}

static int chimera_commit(struct thread_data *td)
{
	struct chimera_data *d = td->io_ops_data;

	return chimera_fio_commit(d->h);
}

static int chimera_getevents(struct thread_data *td, unsigned int min, unsigned int max,
			     const struct timespec *t)
{
	struct chimera_data *d = td->io_ops_data;
	int64_t timeout_ns = t ? (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec : -1;
	int n, i;

	if (max > d->depth)
		max = d->depth;
	n = chimera_fio_reap(d->h, min, max, timeout_ns, d->tags, d->results);
	if (n < 0) {
		log_err("chimera: reaping completions failed (%s)\n", strerror(-n));
		return n;
	}
	for (i = 0; i < n; i++) {
		struct io_u *io_u = (struct io_u *)(uintptr_t)d->tags[i];
		int64_t res = d->results[i];

		if (res < 0) {
			io_u->error = (unsigned int)-res;
			io_u->resid = io_u->xfer_buflen;
		} else if (ddir_rw(io_u->ddir)) {
			io_u->resid = io_u->xfer_buflen - (unsigned long long)res;
		} else {
			io_u->resid = 0;
		}
		d->events[i] = io_u;
	}
	return n;
}

static struct io_u *chimera_event(struct thread_data *td, int event)
{
	struct chimera_data *d = td->io_ops_data;

	return d->events[event];
}

struct ioengine_ops ioengine = {
	.name = "chimera",
	.version = FIO_IOOPS_VERSION,
	.flags = FIO_DISKLESSIO | FIO_NOEXTEND | FIO_NODISKUTIL,
	.init = chimera_init,
	.cleanup = chimera_cleanup,
	.open_file = chimera_open_file,
	.close_file = chimera_close_file,
	.queue = chimera_queue,
	.commit = chimera_commit,
	.getevents = chimera_getevents,
	.event = chimera_event,
	.options = options,
	.option_struct_size = sizeof(struct chimera_options),
};
