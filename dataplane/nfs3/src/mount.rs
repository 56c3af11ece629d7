//! MOUNT version 3 (RFC 1813 §5): hands out the root handle of an export (or
//! of a directory below one) and keeps the informational mount list.

use crate::status_of;
use proto::mount3::*;
use proto::xdr::{Decoder, Encoder, Xdr};
use rpc::{Auth, CallContext, CallError, Program};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use vfs::clients::AccessTable;
use vfs::{FileHandle, Vfs, VfsResult};

pub const PROC_NAMES: [&str; 6] = ["null", "mnt", "dump", "umnt", "umntall", "export"];

/// Most entries kept in the (purely informational) mount list.
const MOUNT_LIST_MAX: usize = 1024;

/// One exported path: clients mount `name` (or a directory below it), which
/// maps to `path` in the server's namespace.
#[derive(Debug, Clone)]
pub struct Export {
    pub name: Vec<u8>,
    pub path: Vec<u8>,
}

type Resolve = dyn Fn(&[u8]) -> VfsResult<FileHandle> + Send + Sync;

/// Cheap to clone: a call that runs on a worker takes its own.
#[derive(Clone)]
pub struct Mount3Program {
    exports: Arc<[Export]>,
    resolve: Arc<Resolve>,
    mounts: Arc<Mutex<Vec<(String, Vec<u8>)>>>,
    access: Arc<AccessTable>,
    /// The router `resolve` walks, asked where a path's first component
    /// waits (`with_offload`).
    router: Option<Arc<dyn Vfs>>,
}

const AUTH_NONE: i32 = 0;
const AUTH_SYS: i32 = 1;

impl Mount3Program {
    /// `resolve` maps a namespace path ("/share/dir") to a handle.
    pub fn new(exports: Vec<Export>, resolve: Arc<Resolve>) -> Self {
        Mount3Program { exports: exports.into(), resolve, mounts: Default::default(), access: Arc::new(AccessTable::new()), router: None }
    }

    /// MNT and EXPORT resolve paths through `router` (the one `resolve`
    /// walks). Where a path's mount waits on another server (an `nfs`
    /// mount: `Vfs::offload_pool_at` of its first component), the call
    /// parks and resolves on that mount's workers, so a remote that is slow
    /// or away holds the MOUNT call, not the core that decoded it.
    pub fn with_offload(mut self, router: Arc<dyn Vfs>) -> Self {
        self.router = Some(router);
        self
    }

    /// The pool a call of `proc_num` must resolve its paths on, if any.
    fn offload_pool(&self, proc_num: u32, args: &[u8]) -> Option<&vfs::iopool::IoPool> {
        let router = self.router.as_deref()?;
        let first = |path: &[u8]| -> Option<Vec<u8>> {
            path.split(|&c| c == b'/').find(|c| !c.is_empty() && *c != b".").map(<[u8]>::to_vec)
        };
        let pool_of = |path: &[u8]| first(path).and_then(|c| router.offload_pool_at(&vfs::router::PSEUDO_ROOT, &c));
        match proc_num {
            MOUNTPROC3_MNT => pool_of(&self.translate(dirpath(args).ok()?)?),
            MOUNTPROC3_EXPORT => self.exports.iter().find_map(|x| pool_of(&x.path)),
            _ => None,
        }
    }

    /// Park the call and run it on `pool`; false: it could not park.
    fn offload(&self, ctx: &CallContext<'_>, args: &[u8], e: &Encoder<'_>, pool: &vfs::iopool::IoPool) -> bool {
        let (me, proc_num, peer, args) = (self.clone(), ctx.proc_num, ctx.peer.ip(), args.to_vec());
        let room = e.remaining().min(OFFLOADED_REPLY_BYTES_MAX);
        crate::offload_to(ctx, pool, room, move |out| me.serve(proc_num, peer, &args, out))
    }

    /// Export access rules: MNT answers MNT3ERR_ACCES to a client they do
    /// not admit to the export the path resolves into, or to the volume it
    /// is in (default: no rules).
    pub fn with_access(mut self, access: Arc<AccessTable>) -> Self {
        self.access = access;
        self
    }

    /// The namespace path a client's dirpath names, if it is inside an export.
    fn translate(&self, dirpath: &[u8]) -> Option<Vec<u8>> {
        let want = trim_slashes(dirpath);
        for x in self.exports.iter() {
            let name = trim_slashes(&x.name);
            let rest = if want == name {
                Some(&b""[..])
            } else if want.starts_with(name) && want.get(name.len()) == Some(&b'/') {
                Some(&want[name.len()..])
            } else {
                None
            };
            if let Some(rest) = rest {
                if rest.split(|&c| c == b'/').any(|c| c == b".." || c == b".") {
                    return None;
                }
                let mut p = x.path.clone();
                p.extend_from_slice(rest);
                return Some(p);
            }
        }
        None
    }

    /// §5.2.1 MNT
    fn mnt(&self, peer: IpAddr, dirpath: &[u8], e: &mut Encoder<'_>) -> Result<(), CallError> {
        let Some(path) = self.translate(dirpath) else {
            return e.i32(mountstat3::MNT3ERR_NOENT as i32).map_err(|_| CallError::SystemErr);
        };
        match (self.resolve)(&path) {
            Ok(fh) if self.access.check_fh(&fh, peer).is_none() => {
                e.i32(mountstat3::MNT3ERR_ACCES as i32).map_err(|_| CallError::SystemErr)
            }
            Ok(fh) => {
                {
                    let mut m = self.mounts.lock().unwrap();
                    let host = peer.to_string();
                    if !m.iter().any(|(h, d)| *h == host && d == dirpath) {
                        if m.len() >= MOUNT_LIST_MAX {
                            m.remove(0);
                        }
                        m.push((host, dirpath.to_vec()));
                    }
                }
                let bytes = fh.to_bytes();
                e.i32(mountstat3::MNT3_OK as i32).map_err(|_| CallError::SystemErr)?;
                mountres3_ok { fhandle: &bytes, auth_flavors: vec![AUTH_SYS, AUTH_NONE] }
                    .encode(e)
                    .map_err(|_| CallError::SystemErr)
            }
            Err(err) => {
                let s = match status_of(err) as i32 {
                    // A backend that cannot reach its storage (an `nfs` mount
                    // whose remote is away): an I/O error, not "no such export".
                    v if v == mountstat3::MNT3ERR_IO as i32 => mountstat3::MNT3ERR_IO,
                    v if v == mountstat3::MNT3ERR_NOTDIR as i32 => mountstat3::MNT3ERR_NOTDIR,
                    v if v == mountstat3::MNT3ERR_ACCES as i32 => mountstat3::MNT3ERR_ACCES,
                    v if v == mountstat3::MNT3ERR_NAMETOOLONG as i32 => mountstat3::MNT3ERR_NAMETOOLONG,
                    v if v == mountstat3::MNT3ERR_INVAL as i32 => mountstat3::MNT3ERR_INVAL,
                    _ => mountstat3::MNT3ERR_NOENT,
                };
                e.i32(s as i32).map_err(|_| CallError::SystemErr)
            }
        }
    }

    /// §5.2.2 DUMP: the mount list as a linked list of mountbody.
    fn dump(&self, e: &mut Encoder<'_>) -> Result<(), XdrErr> {
        let m = self.mounts.lock().unwrap();
        for (host, dir) in m.iter() {
            e.bool(true)?;
            e.opaque_var(host.as_bytes())?;
            e.opaque_var(dir)?;
        }
        e.bool(false)
    }

    /// §5.2.3 UMNT / §5.2.4 UMNTALL
    fn umnt(&self, peer: IpAddr, dirpath: Option<&[u8]>) {
        let host = peer.to_string();
        self.mounts.lock().unwrap().retain(|(h, d)| !(*h == host && dirpath.is_none_or(|p| p == d.as_slice())));
    }

    /// §5.2.5 EXPORT: the exports this client may mount (empty group
    /// list: the rules are by address and stay the server's).
    fn export(&self, peer: IpAddr, e: &mut Encoder<'_>) -> Result<(), XdrErr> {
        for x in self.exports.iter() {
            let admitted = (self.resolve)(&x.path).map_or(true, |fh| self.access.check(fh.export_id, peer).is_some());
            if !admitted {
                continue;
            }
            e.bool(true)?;
            e.opaque_var(&x.name)?;
            e.bool(false)?;
        }
        e.bool(false)
    }
}

type XdrErr = proto::xdr::XdrError;

fn trim_slashes(p: &[u8]) -> &[u8] {
    let mut p = p;
    while p.len() > 1 && p.ends_with(b"/") {
        p = &p[..p.len() - 1];
    }
    p
}

fn dirpath(args: &[u8]) -> Result<&[u8], CallError> {
    Decoder::new(args).opaque_var(MNTPATHLEN).map_err(|_| CallError::GarbageArgs)
}

impl Program for Mount3Program {
    fn program(&self) -> u32 {
        MOUNT_PROGRAM
    }
    fn version(&self) -> u32 {
        MOUNT_V3
    }
    fn call(&self, ctx: &CallContext<'_>, args: &[u8], e: &mut Encoder<'_>) -> Result<(), CallError> {
        let _ = matches!(ctx.auth, Auth::None);
        if let Some(r) = ctx.resumed {
            // Ran on a worker (`offload`): its result.
            return match r.payload.and_then(|p| p.downcast_ref::<crate::Offloaded>()) {
                Some(Ok(bytes)) => e.opaque_fixed(bytes).map_err(|_| CallError::SystemErr),
                Some(Err(err)) => Err(*err),
                // The worker never answered.
                None if ctx.proc_num == MOUNTPROC3_MNT => e.i32(mountstat3::MNT3ERR_IO as i32).map_err(|_| CallError::SystemErr),
                None => Err(CallError::SystemErr),
            };
        }
        if ctx.park.is_some() {
            if let Some(pool) = self.offload_pool(ctx.proc_num, args) {
                if self.offload(ctx, args, e, pool) {
                    return Ok(());
                }
            }
        }
        self.serve(ctx.proc_num, ctx.peer.ip(), args, e)
    }
}

/// Result room MNT or EXPORT get on a worker (MNT: a status, a handle and
/// two flavors; EXPORT: the export list).
const OFFLOADED_REPLY_BYTES_MAX: usize = 256 << 10;

impl Mount3Program {
    /// One procedure, here or on a worker.
    fn serve(&self, proc_num: u32, peer: IpAddr, args: &[u8], e: &mut Encoder<'_>) -> Result<(), CallError> {
        let sys = |r: Result<(), XdrErr>| r.map_err(|_| CallError::SystemErr);
        match proc_num {
            MOUNTPROC3_NULL => Ok(()),
            MOUNTPROC3_MNT => self.mnt(peer, dirpath(args)?, e),
            MOUNTPROC3_DUMP => sys(self.dump(e)),
            MOUNTPROC3_UMNT => {
                self.umnt(peer, Some(dirpath(args)?));
                Ok(())
            }
            MOUNTPROC3_UMNTALL => {
                self.umnt(peer, None);
                Ok(())
            }
            MOUNTPROC3_EXPORT => sys(self.export(peer, e)),
            _ => Err(CallError::ProcUnavail),
        }
    }
}
