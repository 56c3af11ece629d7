//! Portmapper version 2 (RFC 1833 §3): enough for stock clients to find our
//! NFS and MOUNT ports with no rpcbind on the host. Registrations are fixed
//! at start-up; SET and UNSET from the network are refused.

use proto::portmap::*;
use proto::xdr::{Decoder, Encoder, Xdr};
use rpc::{CallContext, CallError, Program};

pub const PROC_NAMES: [&str; 6] = ["null", "set", "unset", "getport", "dump", "callit"];

/// IPPROTO_TCP, as PMAP mappings name protocols.
pub const IPPROTO_TCP: u32 = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    pub prog: u32,
    pub vers: u32,
    pub prot: u32,
    pub port: u32,
}

pub struct PortmapProgram {
    regs: Vec<Registration>,
}

impl PortmapProgram {
    pub fn new(regs: Vec<Registration>) -> Self {
        PortmapProgram { regs }
    }

    /// §3.2 PMAPPROC_GETPORT: the port, or 0 when not registered.
    fn getport(&self, m: &mapping) -> u32 {
        self.regs
            .iter()
            .find(|r| r.prog == m.prog && r.vers == m.vers && r.prot == m.prot)
            .map_or(0, |r| r.port)
    }
}

impl Program for PortmapProgram {
    fn program(&self) -> u32 {
        PMAP_PROG
    }
    fn version(&self) -> u32 {
        PMAP_VERS
    }
    fn call(&self, ctx: &CallContext<'_>, args: &[u8], e: &mut Encoder<'_>) -> Result<(), CallError> {
        let sys = |r: Result<(), proto::xdr::XdrError>| r.map_err(|_| CallError::SystemErr);
        match ctx.proc_num {
            PMAPPROC_NULL => Ok(()),
            PMAPPROC_SET | PMAPPROC_UNSET => {
                mapping::decode(&mut Decoder::new(args)).map_err(|_| CallError::GarbageArgs)?;
                sys(e.bool(false))
            }
            PMAPPROC_GETPORT => {
                let m = mapping::decode(&mut Decoder::new(args)).map_err(|_| CallError::GarbageArgs)?;
                sys(e.u32(self.getport(&m)))
            }
            PMAPPROC_DUMP => {
                for r in &self.regs {
                    sys(e.bool(true))?;
                    sys(mapping { prog: r.prog, vers: r.vers, prot: r.prot, port: r.port }.encode(e))?;
                }
                sys(e.bool(false))
            }
            _ => Err(CallError::ProcUnavail),
        }
    }
}
