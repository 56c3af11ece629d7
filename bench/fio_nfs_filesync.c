/*
 * The pieces that turn fio's own libnfs engine (engines/nfs.c of the fio
 * source tree e2e/peers/fio-libnfs.sh builds) into an external engine that
 * opens every file O_SYNC. libnfs then sends each WRITE with stable_how
 * FILE_SYNC (RFC 1813 3.3.7), which the engine cannot ask for: it ignores
 * fio's sync=1. bench/fio-nfs-filesync.sh compiles engines/nfs.c with
 * nfs_open and the engine (un)registration renamed to the functions below;
 * fio loads the result with ioengine=external:<path>.
 */
#include <fcntl.h>
#include <stddef.h>

struct nfs_context;
struct nfsfh;
struct ioengine_ops;

int nfs_open(struct nfs_context *nfs, const char *path, int flags, struct nfsfh **nfsfh);

int chimera_filesync_nfs_open(struct nfs_context *nfs, const char *path, int flags, struct nfsfh **nfsfh)
{
	return nfs_open(nfs, path, flags | O_SYNC, nfsfh);
}

/* An external engine is found by fio's dlsym of `ioengine`; registering it
 * in fio's list of built-in engines as well would shadow the real "nfs". */
void chimera_filesync_register(struct ioengine_ops *ops)
{
	(void)ops;
}

void chimera_filesync_unregister(struct ioengine_ops *ops)
{
	(void)ops;
}
