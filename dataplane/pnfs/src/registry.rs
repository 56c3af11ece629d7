//! Data-server membership: the current list (by name), each DS's stable id
//! (its device id), health, drain state, counters, and its control
//! connection.

use crate::client3::{Client3, CtlError, CtlResult};
use nfs4::layout::DeviceId;
use std::net::ToSocketAddrs;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Netid {
    Tcp,
    Rdma,
}

/// A data server as configured or pushed by the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DsSpec {
    pub name: String,
    pub host: String,
    /// Port of `netid` (the RPC-over-RDMA port for rdma).
    pub port: u16,
    pub netid: Netid,
    /// TCP port (the MDS's control calls; the second netaddr of an rdma DS).
    pub tcp_port: u16,
    /// Directory on the DS for data files (None: its first mount).
    pub backing_path: Option<String>,
    pub ready: bool,
    pub draining: bool,
}

/// What the admin API and metrics show of one DS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DsState {
    pub name: String,
    pub address: String,
    pub device_id: String,
    pub ready: bool,
    pub draining: bool,
    pub healthy: bool,
    pub errors: u64,
    pub layouts_granted: u64,
    /// Layout states held now (granted, not yet returned, recalled away or
    /// fenced) that name the DS: a drain is done when this is 0.
    pub layouts_held: u64,
    pub files: u64,
    /// Copies on this DS that missed writes (in-memory placements): a
    /// rolling restart waits for 0 (resynced) before the next DS goes.
    pub stale_copies: u64,
}

/// The control connection of one DS and the handle of its data directory.
pub(crate) struct DsConn {
    pub id: u64,
    pub client: Client3,
    backing_path: Option<String>,
    root: Option<Vec<u8>>,
}

impl DsConn {
    /// Handle of the data-file directory: `backing_path` walked from the
    /// DS's pseudo-root, or its first mount.
    pub fn root(&mut self) -> CtlResult<Vec<u8>> {
        if let Some(r) = &self.root {
            return Ok(r.clone());
        }
        let mut fh = vfs::router::PSEUDO_ROOT.to_bytes().to_vec();
        match self.backing_path.clone() {
            Some(path) => {
                for comp in path.split('/').filter(|c| !c.is_empty()) {
                    fh = self.client.lookup(&fh, comp.as_bytes())?;
                }
            }
            None => {
                let first = self.client.first_entry(&fh)?.ok_or_else(|| CtlError::Protocol("the DS has no mount".into()))?;
                fh = self.client.lookup(&fh, &first)?;
            }
        }
        self.root = Some(fh.clone());
        Ok(fh)
    }
}

pub(crate) struct DsRec {
    pub id: u64,
    pub spec: DsSpec,
    /// In the current list.
    pub present: bool,
    pub healthy: bool,
    pub unhealthy_since_ms: u64,
    pub errors: u64,
    pub layouts_granted: u64,
    pub files: u64,
    pub conn: Arc<Mutex<DsConn>>,
    /// Resolved address for netaddr4 (IP literal), if resolvable.
    pub ip: Option<std::net::IpAddr>,
    /// Address generation: moves with the address (`device_id_gen`).
    pub gen: u32,
}

impl DsRec {
    /// The device id layouts name now.
    pub fn device(&self) -> DeviceId {
        device_id_gen(self.id, self.gen)
    }

    /// May take new files and new layouts.
    pub fn active(&self) -> bool {
        self.present && self.spec.ready && !self.spec.draining && self.healthy
    }
}

pub(crate) struct Registry {
    pub recs: Vec<DsRec>,
    timeout: Duration,
}

/// Device id of DS `id` at address generation 0.
pub fn device_id(id: u64) -> DeviceId {
    device_id_gen(id, 0)
}

/// "CHDS", the DS's address generation, its id. The generation moves when
/// the DS's address does (a restarted pod with a new IP), so a client
/// asks GETDEVICEINFO again instead of dialling the old address it cached
/// for the id (the Linux client keeps a device's addresses as long as the
/// id lives).
pub fn device_id_gen(id: u64, gen: u32) -> DeviceId {
    let mut d = [0u8; 16];
    d[..4].copy_from_slice(b"CHDS");
    d[4..8].copy_from_slice(&gen.to_be_bytes());
    d[8..].copy_from_slice(&id.to_be_bytes());
    d
}

pub fn id_of_device(d: &DeviceId) -> Option<u64> {
    id_and_gen(d).map(|(id, _)| id)
}

pub fn id_and_gen(d: &DeviceId) -> Option<(u64, u32)> {
    if &d[..4] != b"CHDS" {
        return None;
    }
    Some((u64::from_be_bytes(d[8..].try_into().unwrap()), u32::from_be_bytes(d[4..8].try_into().unwrap())))
}

fn addr(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl Registry {
    pub fn new(timeout: Duration) -> Registry {
        Registry { recs: Vec::new(), timeout }
    }

    fn new_conn(&self, id: u64, s: &DsSpec) -> Arc<Mutex<DsConn>> {
        Arc::new(Mutex::new(DsConn {
            id,
            client: Client3::new(&addr(&s.host, s.tcp_port), self.timeout),
            backing_path: s.backing_path.clone(),
            root: None,
        }))
    }

    /// Install a new list; returns the ids that stopped being active for a
    /// reason other than health (left, not ready, draining).
    pub fn replace(&mut self, list: Vec<DsSpec>) -> Result<Vec<u64>, String> {
        let mut seen = std::collections::HashSet::new();
        for s in &list {
            if !seen.insert(s.name.clone()) {
                return Err(format!("duplicate data server name {:?}", s.name));
            }
        }
        let new_names = list.iter().filter(|s| !self.recs.iter().any(|r| r.spec.name == s.name)).count();
        if self.recs.len() + new_names > crate::DS_RECORDS_MAX {
            return Err(format!("more than {} data servers known since start", crate::DS_RECORDS_MAX));
        }
        let was: Vec<(u64, bool)> = self.recs.iter().map(|r| (r.id, r.present && r.spec.ready && !r.spec.draining)).collect();
        for r in &mut self.recs {
            r.present = false;
        }
        for mut s in list {
            if s.backing_path.is_none() {
                // The operator's list carries no backing path: keep the config's.
                s.backing_path = self.recs.iter().find(|r| r.spec.name == s.name).and_then(|r| r.spec.backing_path.clone());
            }
            let ip = (s.host.as_str(), s.port).to_socket_addrs().ok().and_then(|mut a| a.next()).map(|a| a.ip());
            match self.recs.iter().position(|r| r.spec.name == s.name) {
                Some(i) => {
                    let moved = self.recs[i].spec.host != s.host || self.recs[i].spec.tcp_port != s.tcp_port || self.recs[i].spec.backing_path != s.backing_path;
                    if moved {
                        let id = self.recs[i].id;
                        self.recs[i].conn = self.new_conn(id, &s);
                        self.recs[i].gen = self.recs[i].gen.wrapping_add(1);
                    }
                    let r = &mut self.recs[i];
                    r.spec = s;
                    r.present = true;
                    r.ip = ip;
                }
                None => {
                    let id = self.recs.len() as u64 + 1;
                    let conn = self.new_conn(id, &s);
                    self.recs.push(DsRec {
                        id,
                        spec: s,
                        present: true,
                        healthy: true,
                        unhealthy_since_ms: 0,
                        errors: 0,
                        layouts_granted: 0,
                        files: 0,
                        conn,
                        ip,
                        gen: 0,
                    });
                }
            }
        }
        Ok(was
            .into_iter()
            .filter(|(id, active)| *active && self.get(*id).is_some_and(|r| !(r.present && r.spec.ready && !r.spec.draining)))
            .map(|(id, _)| id)
            .collect())
    }

    pub fn get(&self, id: u64) -> Option<&DsRec> {
        self.recs.get((id as usize).wrapping_sub(1))
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut DsRec> {
        self.recs.get_mut((id as usize).wrapping_sub(1))
    }

    pub fn conn(&self, id: u64) -> Option<Arc<Mutex<DsConn>>> {
        self.get(id).map(|r| r.conn.clone())
    }

    /// The id of the DS called `name`. A name not known in this run (a
    /// stored placement names a DS that is no longer listed) gets a record
    /// that is not present — what a DS that left the list is: never
    /// active; listing that name again brings it back. `None` when
    /// `DS_RECORDS_MAX` records exist.
    pub fn id_for_name(&mut self, name: &str) -> Option<u64> {
        if let Some(r) = self.recs.iter().find(|r| r.spec.name == name) {
            return Some(r.id);
        }
        if self.recs.len() >= crate::DS_RECORDS_MAX {
            return None;
        }
        let id = self.recs.len() as u64 + 1;
        // No address: its connection fails at once (Unreachable).
        let spec = DsSpec {
            name: name.to_string(),
            host: String::new(),
            port: 0,
            netid: Netid::Tcp,
            tcp_port: 0,
            backing_path: None,
            ready: false,
            draining: false,
        };
        let conn = self.new_conn(id, &spec);
        self.recs.push(DsRec {
            id,
            spec,
            present: false,
            healthy: true,
            unhealthy_since_ms: 0,
            errors: 0,
            layouts_granted: 0,
            files: 0,
            conn,
            ip: None,
            gen: 0,
        });
        Some(id)
    }

    pub fn name_of(&self, id: u64) -> String {
        self.get(id).map(|r| r.spec.name.clone()).unwrap_or_default()
    }

    /// Ids of DSes that may take new files, in list order.
    pub fn active_ids(&self) -> Vec<u64> {
        self.recs.iter().filter(|r| r.active()).map(|r| r.id).collect()
    }

    pub fn mark_unhealthy(&mut self, id: u64, now_ms: u64) {
        if let Some(r) = self.get_mut(id) {
            r.errors += 1;
            if r.healthy {
                r.healthy = false;
                r.unhealthy_since_ms = now_ms;
            }
        }
    }

    pub fn mark_healthy(&mut self, id: u64) {
        if let Some(r) = self.get_mut(id) {
            r.healthy = true;
        }
    }

    pub fn file_count(&mut self, id: u64, delta: i64) {
        if let Some(r) = self.get_mut(id) {
            r.files = r.files.saturating_add_signed(delta);
        }
    }

    /// Unhealthy, present DSes whose quarantine is over.
    pub fn probe_due(&self, now_ms: u64, recheck_ms: u64) -> Vec<(u64, Arc<Mutex<DsConn>>)> {
        self.recs
            .iter()
            .filter(|r| r.present && !r.healthy && now_ms.saturating_sub(r.unhealthy_since_ms) >= recheck_ms)
            .map(|r| (r.id, r.conn.clone()))
            .collect()
    }

    pub fn states(&self) -> Vec<DsState> {
        self.recs
            .iter()
            .filter(|r| r.present)
            .map(|r| DsState {
                name: r.spec.name.clone(),
                address: addr(&r.spec.host, r.spec.port),
                device_id: r.device().iter().map(|b| format!("{b:02x}")).collect(),
                ready: r.spec.ready,
                draining: r.spec.draining,
                healthy: r.healthy,
                errors: r.errors,
                layouts_granted: r.layouts_granted,
                layouts_held: 0, // filled by Pnfs::ds_states, which sees the layouts
                files: r.files,
                stale_copies: 0, // filled by Pnfs::ds_states, which sees the placements
            })
            .collect()
    }

    /// ff_device_addr4 netaddrs of a DS: (netid, uaddr), RDMA first.
    pub fn netaddrs(&self, id: u64) -> Option<Vec<(String, String)>> {
        let r = self.get(id)?;
        let host = r.ip.map(|i| i.to_string()).unwrap_or_else(|| r.spec.host.clone());
        let v6 = host.contains(':');
        let uaddr = |port: u16| format!("{host}.{}.{}", port >> 8, port & 0xff);
        let mut out = Vec::new();
        if r.spec.netid == Netid::Rdma {
            out.push((if v6 { "rdma6" } else { "rdma" }.to_string(), uaddr(r.spec.port)));
        }
        out.push((if v6 { "tcp6" } else { "tcp" }.to_string(), uaddr(r.spec.tcp_port)));
        Some(out)
    }
}
