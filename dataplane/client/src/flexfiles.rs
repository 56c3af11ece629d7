//! pNFS flex-files (RFC 8435) on the client side: LAYOUTGET, GETDEVICEINFO,
//! LAYOUTCOMMIT and LAYOUTRETURN (with error reports) on an `Nfs41`
//! session to the metadata server, and the decoded layout and device
//! bodies a caller needs to do I/O straight to the data servers over NFSv3
//! with the layout's synthetic uid/gid.
//!
//! The caller maps a file offset to a segment (`FfSegment::covers`); inside
//! a segment every mirror holds the same bytes at the same offsets (data
//! files are sparse: DS offset = file offset; `stripe_unit` 0 means one data
//! server per mirror, which is what chimerad hands out — striping is
//! expressed by segments). Writes go to every mirror, reads to any.

use crate::error::{xdr, Error, Result};
use crate::nfs4::{Nfs41, Stateid};
use proto::flexfiles as ff;
use proto::nfs4 as p;
use proto::xdr::{Decoder, Xdr};

/// LAYOUT4_FLEX_FILES.
pub const LAYOUT_TYPE: i32 = 4;
/// Bytes of layout (or device address) the server may answer with.
pub const BODY_BYTES_MAX: u32 = 64 << 10;
/// Mirrors per segment and addresses per device this client accepts.
pub const MIRRORS_MAX: usize = 8;
/// `length` of a segment that runs to the end of the file.
pub const TO_EOF: u64 = u64::MAX;

/// What a layout allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoMode {
    Read,
    Rw,
}

impl IoMode {
    fn wire(self) -> p::layoutiomode4 {
        match self {
            IoMode::Read => p::layoutiomode4::LAYOUTIOMODE4_READ,
            IoMode::Rw => p::layoutiomode4::LAYOUTIOMODE4_RW,
        }
    }
}

/// One mirror's data server for a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FfMirror {
    pub deviceid: [u8; 16],
    /// The data file's NFSv3 handle on that data server.
    pub fh: Vec<u8>,
    /// The synthetic identity to use on the data server (AUTH_SYS).
    pub uid: u32,
    pub gid: u32,
}

/// A granted layout segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FfSegment {
    pub stateid: Stateid,
    pub offset: u64,
    /// `TO_EOF` for a segment to the end of the file.
    pub length: u64,
    pub iomode: IoMode,
    pub stripe_unit: u64,
    pub mirrors: Vec<FfMirror>,
    pub flags: u32,
}

impl FfSegment {
    /// Whether [offset, offset + len) lies inside the segment.
    pub fn covers(&self, offset: u64, len: u64) -> bool {
        let end = if self.length == TO_EOF { u64::MAX } else { self.offset.saturating_add(self.length) };
        offset >= self.offset && offset.saturating_add(len) <= end
    }
}

/// A data server's address and the NFS versions it speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FfDevice {
    /// `host:port` of each TCP address (RFC 5665 universal addresses decoded).
    pub tcp_addrs: Vec<String>,
    /// `host:port` of each RDMA address (netid `rdma` / `rdma6`).
    pub rdma_addrs: Vec<String>,
    /// (version, minor version, rsize, wsize, tightly coupled).
    pub versions: Vec<(u32, u32, u32, u32, bool)>,
}

impl FfDevice {
    /// Whether the device speaks NFSv3 (the only data-server protocol here).
    pub fn speaks_v3(&self) -> bool {
        self.versions.iter().any(|v| v.0 == 3)
    }
}

/// An RFC 5665 universal address `h1.h2.h3.h4.p1.p2` (or an IPv6 one
/// `x:...:y.p1.p2`) as `host:port`.
pub fn uaddr_to_addr(uaddr: &str) -> Result<String> {
    let bad = || Error::Malformed(format!("universal address '{uaddr}'"));
    let mut it = uaddr.rsplitn(3, '.');
    let (lo, hi, host) = (it.next().ok_or_else(bad)?, it.next().ok_or_else(bad)?, it.next().ok_or_else(bad)?);
    let port = hi.parse::<u8>().map_err(|_| bad())? as u16 * 256 + lo.parse::<u8>().map_err(|_| bad())? as u16;
    let ip: std::net::IpAddr = host.parse().map_err(|_| bad())?;
    Ok(std::net::SocketAddr::new(ip, port).to_string())
}

fn owner_id(s: &[u8], what: &str) -> Result<u32> {
    std::str::from_utf8(s)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| Error::Malformed(format!("layout {what} '{}' is not a numeric id", String::from_utf8_lossy(s))))
}

/// Decode an ff_layout4 body. Segments with more than one data server per
/// mirror (striping inside a segment) are refused: chimerad never sends
/// them and this client does not stripe inside a segment.
pub fn decode_layout_body(body: &[u8]) -> Result<(u64, Vec<FfMirror>, u32)> {
    let l = ff::ff_layout4::decode(&mut Decoder::new(body)).map_err(xdr)?;
    if l.ffl_mirrors.is_empty() || l.ffl_mirrors.len() > MIRRORS_MAX {
        return Err(Error::Malformed(format!("layout with {} mirrors (1..={MIRRORS_MAX})", l.ffl_mirrors.len())));
    }
    let mut mirrors = Vec::with_capacity(l.ffl_mirrors.len());
    for m in &l.ffl_mirrors {
        let [ds] = m.ffm_data_servers.as_slice() else {
            return Err(Error::Malformed(format!("a mirror with {} data servers (this client takes one)", m.ffm_data_servers.len())));
        };
        let fh = ds.ffds_fh_vers.first().ok_or_else(|| Error::Malformed("a data server without a file handle".into()))?;
        mirrors.push(FfMirror {
            deviceid: ds.ffds_deviceid,
            fh: fh.to_vec(),
            uid: owner_id(ds.ffds_user, "user")?,
            gid: owner_id(ds.ffds_group, "group")?,
        });
    }
    Ok((l.ffl_stripe_unit, mirrors, l.ffl_flags))
}

/// Decode an ff_device_addr4 body.
pub fn decode_device_body(body: &[u8]) -> Result<FfDevice> {
    let a = ff::ff_device_addr4::decode(&mut Decoder::new(body)).map_err(xdr)?;
    let (mut tcp_addrs, mut rdma_addrs) = (Vec::new(), Vec::new());
    for na in a.ffda_netaddrs.iter().take(MIRRORS_MAX) {
        let list = match na.na_r_netid {
            b"tcp" | b"tcp6" => &mut tcp_addrs,
            b"rdma" | b"rdma6" => &mut rdma_addrs,
            _ => continue,
        };
        list.push(uaddr_to_addr(&String::from_utf8_lossy(na.na_r_addr))?);
    }
    let versions = a
        .ffda_versions
        .iter()
        .map(|v| (v.ffdv_version, v.ffdv_minorversion, v.ffdv_rsize, v.ffdv_wsize, v.ffdv_tightly_coupled))
        .collect();
    Ok(FfDevice { tcp_addrs, rdma_addrs, versions })
}

/// One data server's failure, reported to the MDS in LAYOUTRETURN.
#[derive(Debug, Clone)]
pub struct DsError {
    pub deviceid: [u8; 16],
    pub offset: u64,
    pub length: u64,
    /// An NFSv4 status: NFS4ERR_NXIO when the server did not answer.
    pub status: p::nfsstat4,
    pub write: bool,
}

impl DsError {
    /// The report of it in LAYOUTERROR and in LAYOUTRETURN's ff_ioerr4.
    fn device_error(&self) -> p::device_error4 {
        p::device_error4 {
            de_deviceid: self.deviceid,
            de_status: self.status,
            de_opnum: if self.write { p::nfs_opnum4::OP_WRITE } else { p::nfs_opnum4::OP_READ },
        }
    }
}

impl Nfs41 {
    /// LAYOUTGET of a flex-files segment covering [offset, offset +
    /// minlength) with `stateid` (the open's, or the layout's once held).
    pub fn layoutget(&mut self, fh: &[u8], stateid: &Stateid, iomode: IoMode, offset: u64, minlength: u64) -> Result<FfSegment> {
        let ops = [
            p::nfs_argop4::OP_PUTFH(p::PUTFH4args { object: fh }),
            p::nfs_argop4::OP_LAYOUTGET(p::LAYOUTGET4args {
                loga_signal_layout_avail: false,
                loga_layout_type: p::layouttype4::LAYOUT4_FLEX_FILES,
                loga_iomode: iomode.wire(),
                loga_offset: offset,
                loga_length: TO_EOF,
                loga_minlength: minlength,
                loga_stateid: stateid.clone(),
                loga_maxcount: BODY_BYTES_MAX,
            }),
        ];
        self.compound(&ops, |r| match r {
            [_, p::nfs_resop4::OP_LAYOUTGET(p::LAYOUTGET4res::NFS4_OK(ok))] => {
                let [l] = ok.logr_layout.as_slice() else {
                    return Err(Error::Malformed(format!("LAYOUTGET with {} layouts (this client asks one)", ok.logr_layout.len())));
                };
                if l.lo_content.loc_type != p::layouttype4::LAYOUT4_FLEX_FILES {
                    return Err(Error::Malformed(format!("layout type {:?}, not flex files", l.lo_content.loc_type)));
                }
                let (stripe_unit, mirrors, flags) = decode_layout_body(l.lo_content.loc_body)?;
                Ok(FfSegment {
                    stateid: ok.logr_stateid.clone(),
                    offset: l.lo_offset,
                    length: l.lo_length,
                    iomode: if l.lo_iomode == p::layoutiomode4::LAYOUTIOMODE4_READ { IoMode::Read } else { IoMode::Rw },
                    stripe_unit,
                    mirrors,
                    flags,
                })
            }
            _ => Err(Error::Malformed("LAYOUTGET result".into())),
        })
    }

    /// GETDEVICEINFO of a flex-files device.
    pub fn getdeviceinfo(&mut self, deviceid: &[u8; 16]) -> Result<FfDevice> {
        let ops = [p::nfs_argop4::OP_GETDEVICEINFO(p::GETDEVICEINFO4args {
            gdia_device_id: *deviceid,
            gdia_layout_type: p::layouttype4::LAYOUT4_FLEX_FILES,
            gdia_maxcount: BODY_BYTES_MAX,
            gdia_notify_types: vec![],
        })];
        self.compound(&ops, |r| match r {
            [p::nfs_resop4::OP_GETDEVICEINFO(p::GETDEVICEINFO4res::NFS4_OK(ok))] => decode_device_body(ok.gdir_device_addr.da_addr_body),
            _ => Err(Error::Malformed("GETDEVICEINFO result".into())),
        })
    }

    /// LAYOUTCOMMIT of writes up to `last_write_offset` (the last byte
    /// written): the new size when the server changed it.
    pub fn layoutcommit(&mut self, fh: &[u8], stateid: &Stateid, last_write_offset: u64) -> Result<Option<u64>> {
        let ops = [
            p::nfs_argop4::OP_PUTFH(p::PUTFH4args { object: fh }),
            p::nfs_argop4::OP_LAYOUTCOMMIT(p::LAYOUTCOMMIT4args {
                loca_offset: 0,
                loca_length: TO_EOF,
                loca_reclaim: false,
                loca_stateid: stateid.clone(),
                loca_last_write_offset: p::newoffset4::TRUE(last_write_offset),
                loca_time_modify: p::newtime4::FALSE,
                loca_layoutupdate: p::layoutupdate4 { lou_type: p::layouttype4::LAYOUT4_FLEX_FILES, lou_body: &[] },
            }),
        ];
        self.compound(&ops, |r| match r {
            [_, p::nfs_resop4::OP_LAYOUTCOMMIT(p::LAYOUTCOMMIT4res::NFS4_OK(ok))] => Ok(match ok.locr_newsize {
                p::newsize4::TRUE(n) => Some(n),
                p::newsize4::FALSE => None,
            }),
            _ => Err(Error::Malformed("LAYOUTCOMMIT result".into())),
        })
    }

    /// LAYOUTERROR (NFSv4.2, RFC 7862 §15.6): report `errors` under the
    /// layout `stateid` without returning it, one call per range. A
    /// session of minor version 1 has no LAYOUTERROR: `Error::Invalid`.
    pub fn layouterror(&mut self, fh: &[u8], stateid: &Stateid, errors: &[DsError]) -> Result<()> {
        if self.minor < 2 {
            return Err(Error::Invalid("LAYOUTERROR needs NFSv4.2 (the session is 4.1)".into()));
        }
        for e in errors {
            let ops = [
                p::nfs_argop4::OP_PUTFH(p::PUTFH4args { object: fh }),
                p::nfs_argop4::OP_LAYOUTERROR(p::LAYOUTERROR4args {
                    lea_offset: e.offset,
                    lea_length: e.length,
                    lea_stateid: stateid.clone(),
                    lea_errors: vec![e.device_error()],
                }),
            ];
            self.compound(&ops, |r| match r {
                [_, p::nfs_resop4::OP_LAYOUTERROR(_)] => Ok(()),
                _ => Err(Error::Malformed("LAYOUTERROR result".into())),
            })?;
        }
        Ok(())
    }

    /// LAYOUTRETURN of the whole file's `iomode` layout, reporting `errors`
    /// (the MDS then stops handing out the failed data servers' copies).
    pub fn layoutreturn(&mut self, fh: &[u8], stateid: &Stateid, iomode: IoMode, errors: &[DsError]) -> Result<()> {
        let body = ff::ff_layoutreturn4 {
            fflr_ioerr_report: errors
                .iter()
                .map(|e| ff::ff_ioerr4 {
                    ffie_offset: e.offset,
                    ffie_length: e.length,
                    ffie_stateid: stateid.clone(),
                    ffie_errors: vec![e.device_error()],
                })
                .collect(),
            fflr_iostats_report: vec![],
        };
        let body = proto::xdr::to_vec(&body).map_err(xdr)?;
        let ops = [
            p::nfs_argop4::OP_PUTFH(p::PUTFH4args { object: fh }),
            p::nfs_argop4::OP_LAYOUTRETURN(p::LAYOUTRETURN4args {
                lora_reclaim: false,
                lora_layout_type: p::layouttype4::LAYOUT4_FLEX_FILES,
                lora_iomode: iomode.wire(),
                lora_layoutreturn: p::layoutreturn4::LAYOUTRETURN4_FILE(p::layoutreturn_file4 {
                    lrf_offset: 0,
                    lrf_length: TO_EOF,
                    lrf_stateid: stateid.clone(),
                    lrf_body: &body,
                }),
            }),
        ];
        self.compound(&ops, |r| match r {
            [_, p::nfs_resop4::OP_LAYOUTRETURN(_)] => Ok(()),
            _ => Err(Error::Malformed("LAYOUTRETURN result".into())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn universal_addresses() {
        assert_eq!(uaddr_to_addr("127.0.0.1.8.1").unwrap(), "127.0.0.1:2049");
        assert_eq!(uaddr_to_addr("10.0.2.16.0.111").unwrap(), "10.0.2.16:111");
        assert_eq!(uaddr_to_addr("::1.8.1").unwrap(), "[::1]:2049");
        for bad in ["", "1.2.3", "127.0.0.1.300.1", "host.8.1", "127.0.0.1.8.x"] {
            assert!(uaddr_to_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hostile_layout_bodies_are_errors() {
        assert!(decode_layout_body(&[]).is_err());
        assert!(decode_layout_body(&[0xff; 64]).is_err());
        // No mirrors.
        let mut b = vec![0u8; 8];
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&[0; 8]);
        assert!(decode_layout_body(&b).is_err());
        assert!(decode_device_body(&[0, 0, 0, 9]).is_err());
    }

    #[test]
    fn segment_coverage() {
        let s = FfSegment {
            stateid: Stateid { seqid: 1, other: [0; 12] },
            offset: 65536,
            length: 65536,
            iomode: IoMode::Rw,
            stripe_unit: 0,
            mirrors: vec![],
            flags: 0,
        };
        assert!(s.covers(65536, 65536));
        assert!(!s.covers(65535, 2));
        assert!(!s.covers(131071, 2));
        let whole = FfSegment { offset: 0, length: TO_EOF, ..s };
        assert!(whole.covers(u64::MAX - 10, 10));
    }
}
