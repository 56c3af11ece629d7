//! Export access rules: which clients may use an export, read-write or
//! read-only, and how their credentials are squashed.
//!
//! The shape is the one NFS-Ganesha users know: an export carries a list of
//! client rules, each naming clients (a CIDR, a host address or `*`), an
//! access type (`rw`, `ro`, `none`), a squash mode (`root_squash`,
//! `all_squash`, `no_root_squash`) and the anonymous uid/gid squashed
//! credentials become.
//!
//! Evaluation: the rules of the export a handle belongs to are tried in
//! order (document order) and the first rule with a matching client decides;
//! when none matches, the client has no access. An export without a rule
//! list is open to every client, read-write, without squashing (the
//! behaviour before rules existed). IPv4-mapped IPv6 addresses
//! (`::ffff:a.b.c.d`) are the IPv4 address, on both sides.
//!
//! Volumes (quota roots, the admin API's volumes) may carry rules of their
//! own. A call whose handle lives inside such a volume gets the export's
//! grant narrowed by the volume's (`Grant::narrow`): a volume's rules can
//! take rights away, never add any. Which volume a handle is in is the
//! backend's answer (`Vfs::volume_of`), asked only when the handle's
//! export has volume rules at all.
//!
//! Nothing here allocates on the call path: a lookup takes a read lock,
//! finds the export's rule slice and walks it (and, for an export with
//! volume rules, asks the backend for the volume and looks it up).

use crate::idhash::IdHashMap;
use crate::{Cred, ExportId, FileHandle, Ino, Vfs};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// Anonymous uid/gid when a rule does not name one (Linux's `nobody`).
pub const ANON_ID_DEFAULT: u32 = 65534;
/// Most rules in one export's list.
pub const RULES_MAX: usize = 256;
/// Most client specifications in one rule.
pub const CLIENTS_MAX: usize = 256;

/// What a matching client may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessType {
    ReadWrite,
    ReadOnly,
    /// Matched, and refused (a rule that carves a hole out of a wider one).
    None,
}

impl AccessType {
    pub fn parse(s: &str) -> Option<AccessType> {
        match s {
            "rw" => Some(AccessType::ReadWrite),
            "ro" => Some(AccessType::ReadOnly),
            "none" => Some(AccessType::None),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            AccessType::ReadWrite => "rw",
            AccessType::ReadOnly => "ro",
            AccessType::None => "none",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Squash {
    /// Credentials pass as sent.
    NoRootSquash,
    /// uid 0 becomes the anonymous uid, and its gid the anonymous gid.
    RootSquash,
    /// Every credential becomes the anonymous uid/gid.
    AllSquash,
}

impl Squash {
    pub fn parse(s: &str) -> Option<Squash> {
        match s {
            "no_root_squash" => Some(Squash::NoRootSquash),
            "root_squash" => Some(Squash::RootSquash),
            "all_squash" => Some(Squash::AllSquash),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Squash::NoRootSquash => "no_root_squash",
            Squash::RootSquash => "root_squash",
            Squash::AllSquash => "all_squash",
        }
    }
}

/// An address range: IPv4 or IPv6 network, IPv4-mapped IPv6 folded to IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// Every client (`*`).
    Any,
    V4 { addr: u32, prefix: u8 },
    V6 { addr: u128, prefix: u8 },
}

/// An IPv4-mapped IPv6 address is its IPv4 address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn mask32(prefix: u8) -> u32 {
    if prefix == 0 { 0 } else { u32::MAX << (32 - prefix as u32) }
}

fn mask128(prefix: u8) -> u128 {
    if prefix == 0 { 0 } else { u128::MAX << (128 - prefix as u32) }
}

impl Net {
    /// `*`, `a.b.c.d`, `a.b.c.d/n` (0..=32), an IPv6 address, `v6/n`
    /// (0..=128); an IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`) is the
    /// IPv4 network. Host bits set below the prefix are an error (a typo
    /// such as `10.0.0.1/8` would otherwise silently widen the rule).
    /// Host names are not resolved: an error.
    pub fn parse(s: &str) -> Result<Net, String> {
        if s == "*" {
            return Ok(Net::Any);
        }
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let ip: IpAddr = a.parse().map_err(|_| {
            format!("{s:?} is not an IP address or CIDR (a.b.c.d, a.b.c.d/n, an IPv6 address or v6/n, or \"*\"; host names are not resolved)")
        })?;
        let max: u8 = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => {
                if p.is_empty() || p.len() > 3 || !p.bytes().all(|c| c.is_ascii_digit()) {
                    return Err(format!("{s:?}: prefix length {p:?} is not a number in 0..={max}"));
                }
                let n: u32 = p.parse().map_err(|_| format!("{s:?}: prefix length {p:?} is not a number"))?;
                if n > max as u32 {
                    return Err(format!("{s:?}: prefix length {n} is out of range 0..={max}"));
                }
                n as u8
            }
        };
        let net = match ip {
            IpAddr::V4(v4) => Net::V4 { addr: u32::from(v4), prefix },
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) if prefix >= 96 => Net::V4 { addr: u32::from(v4), prefix: prefix - 96 },
                _ => Net::V6 { addr: u128::from(v6), prefix },
            },
        };
        let host_bits = match net {
            Net::V4 { addr, prefix } => addr & !mask32(prefix) != 0,
            Net::V6 { addr, prefix } => addr & !mask128(prefix) != 0,
            Net::Any => false,
        };
        if host_bits {
            return Err(format!("{s:?} has bits set below its prefix length (did you mean the network address?)"));
        }
        Ok(net)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self, canonical(ip)) {
            (Net::Any, _) => true,
            (Net::V4 { addr, prefix }, IpAddr::V4(a)) => u32::from(a) & mask32(*prefix) == *addr,
            (Net::V6 { addr, prefix }, IpAddr::V6(a)) => u128::from(a) & mask128(*prefix) == *addr,
            _ => false,
        }
    }
}

impl std::fmt::Display for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Net::Any => write!(f, "*"),
            Net::V4 { addr, prefix: 32 } => write!(f, "{}", std::net::Ipv4Addr::from(addr)),
            Net::V4 { addr, prefix } => write!(f, "{}/{prefix}", std::net::Ipv4Addr::from(addr)),
            Net::V6 { addr, prefix: 128 } => write!(f, "{}", std::net::Ipv6Addr::from(addr)),
            Net::V6 { addr, prefix } => write!(f, "{}/{prefix}", std::net::Ipv6Addr::from(addr)),
        }
    }
}

/// One client rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub clients: Vec<Net>,
    pub access: AccessType,
    pub squash: Squash,
    pub anon_uid: u32,
    pub anon_gid: u32,
}

impl Rule {
    /// Everything, read-write, no squashing.
    pub fn open() -> Rule {
        Rule {
            clients: vec![Net::Any],
            access: AccessType::ReadWrite,
            squash: Squash::NoRootSquash,
            anon_uid: ANON_ID_DEFAULT,
            anon_gid: ANON_ID_DEFAULT,
        }
    }
}

/// What the rules grant one client on one export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub writable: bool,
    pub squash: Squash,
    pub anon_uid: u32,
    pub anon_gid: u32,
}

impl Grant {
    pub const OPEN: Grant =
        Grant { writable: true, squash: Squash::NoRootSquash, anon_uid: ANON_ID_DEFAULT, anon_gid: ANON_ID_DEFAULT };

    /// Both grants at once (an export's and a volume's inside it): read-only
    /// if either is, the stricter squash with its anonymous identity; on
    /// equal squash the anonymous identity is `inner`'s (the volume's, the
    /// narrower scope).
    pub fn narrow(self, inner: Grant) -> Grant {
        fn rank(s: Squash) -> u8 {
            match s {
                Squash::NoRootSquash => 0,
                Squash::RootSquash => 1,
                Squash::AllSquash => 2,
            }
        }
        let ids = if rank(self.squash) > rank(inner.squash) { self } else { inner };
        Grant { writable: self.writable && inner.writable, squash: ids.squash, anon_uid: ids.anon_uid, anon_gid: ids.anon_gid }
    }

    /// The credential the backend sees: `cred` squashed as the rule says
    /// (a squashed credential has no supplementary groups).
    pub fn squash<'a>(&self, cred: Cred<'a>) -> Cred<'a> {
        let squashed = match self.squash {
            Squash::NoRootSquash => false,
            Squash::RootSquash => cred.uid == 0,
            Squash::AllSquash => true,
        };
        if squashed { Cred { uid: self.anon_uid, gid: self.anon_gid, gids: &[] } } else { cred }
    }
}

/// First rule naming `ip` decides; no match (or `none`) → `None`.
pub fn evaluate(rules: &[Rule], ip: IpAddr) -> Option<Grant> {
    let ip = canonical(ip);
    let r = rules.iter().find(|r| r.clients.iter().any(|n| n.contains(ip)))?;
    match r.access {
        AccessType::None => None,
        a => Some(Grant {
            writable: a == AccessType::ReadWrite,
            squash: r.squash,
            anon_uid: r.anon_uid,
            anon_gid: r.anon_gid,
        }),
    }
}

/// Most volumes of one export with rules of their own (the admin API's
/// volume bound).
pub const VOLUMES_WITH_RULES_MAX: usize = 65536;

/// The rules of one export (a mount) and of the volumes in it.
#[derive(Default)]
struct MountRules {
    /// `None`: open to all.
    export: Option<Arc<[Rule]>>,
    /// Per volume root inode; empty for most exports, and then a call
    /// never asks the backend which volume its handle is in.
    volumes: IdHashMap<Ino, Arc<[Rule]>>,
}

impl MountRules {
    fn is_empty(&self) -> bool {
        self.export.is_none() && self.volumes.is_empty()
    }
}

/// Rules per export id, and per volume inside an export, changeable while
/// serving (a change applies to the next call, handles learned earlier
/// included).
#[derive(Default)]
pub struct AccessTable {
    /// False until some export or volume has rules: the common open case
    /// skips the lock.
    any: AtomicBool,
    rules: RwLock<IdHashMap<ExportId, MountRules>>,
    /// Which volume a handle is in (`Vfs::volume_of`); needed only for
    /// volume rules.
    backend: Option<Arc<dyn Vfs>>,
}

impl std::fmt::Debug for AccessTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessTable").field("exports", &self.rules.read().unwrap().len()).finish()
    }
}

impl AccessTable {
    pub fn new() -> AccessTable {
        AccessTable::default()
    }

    /// A table that may also hold volume rules: `backend` says which
    /// volume a handle is in (the router, over every mount).
    pub fn with_volumes(backend: Arc<dyn Vfs>) -> AccessTable {
        AccessTable { backend: Some(backend), ..AccessTable::default() }
    }

    fn update(&self, export: ExportId, f: impl FnOnce(&mut MountRules)) {
        let mut m = self.rules.write().unwrap();
        let e = m.entry(export).or_default();
        f(e);
        if e.is_empty() {
            m.remove(&export);
        }
        self.any.store(!m.is_empty(), Ordering::Release);
    }

    /// Set (`Some`) or clear (`None`: open to all) the rules of an export.
    pub fn set(&self, export: ExportId, rules: Option<Vec<Rule>>) {
        self.update(export, |e| e.export = rules.map(Into::into));
    }

    /// The rules of an export, `None` when it is open to all.
    pub fn get(&self, export: ExportId) -> Option<Arc<[Rule]>> {
        self.rules.read().unwrap().get(&export).and_then(|e| e.export.clone())
    }

    /// Set (`Some`) or clear (`None`: the export's rules alone decide) the
    /// rules of the volume whose root directory is inode `root` of
    /// `export`. Refused (`Err`) on a table without a backend to find
    /// volumes with, and beyond `VOLUMES_WITH_RULES_MAX` volumes.
    pub fn set_volume(&self, export: ExportId, root: Ino, rules: Option<Vec<Rule>>) -> Result<(), String> {
        if self.backend.is_none() {
            return Err("this access table cannot find volumes (no backend)".into());
        }
        let mut full = false;
        self.update(export, |e| match rules {
            Some(r) => {
                if !e.volumes.contains_key(&root) && e.volumes.len() >= VOLUMES_WITH_RULES_MAX {
                    full = true;
                } else {
                    e.volumes.insert(root, r.into());
                }
            }
            None => {
                e.volumes.remove(&root);
            }
        });
        if full {
            return Err(format!("more than {VOLUMES_WITH_RULES_MAX} volumes with rules in one export"));
        }
        Ok(())
    }

    /// The rules of a volume, `None` when it has none of its own.
    pub fn get_volume(&self, export: ExportId, root: Ino) -> Option<Arc<[Rule]>> {
        self.rules.read().unwrap().get(&export).and_then(|e| e.volumes.get(&root).cloned())
    }

    /// What `ip` may do on `export` by the export's rules alone (volume
    /// rules not applied: for what is not inside a volume, such as an
    /// export's root); `None`: no access.
    pub fn check(&self, export: ExportId, ip: IpAddr) -> Option<Grant> {
        if !self.any.load(Ordering::Acquire) {
            return Some(Grant::OPEN);
        }
        let m = self.rules.read().unwrap();
        match m.get(&export).and_then(|e| e.export.as_deref()) {
            None => Some(Grant::OPEN),
            Some(rules) => evaluate(rules, ip),
        }
    }

    /// What `ip` may do with the object `fh` names: its export's grant,
    /// narrowed by its volume's rules when it lives in a volume that has
    /// some; `None`: no access. An export without volume rules costs what
    /// `check` costs; otherwise one `Vfs::volume_of` and a map lookup, no
    /// allocation. A handle the backend does not know (stale, bad) gets the
    /// export's grant: the operation itself then fails on it.
    pub fn check_fh(&self, fh: &FileHandle, ip: IpAddr) -> Option<Grant> {
        if !self.any.load(Ordering::Acquire) {
            return Some(Grant::OPEN);
        }
        let m = self.rules.read().unwrap();
        let Some(e) = m.get(&fh.export_id) else { return Some(Grant::OPEN) };
        let grant = match e.export.as_deref() {
            None => Grant::OPEN,
            Some(rules) => evaluate(rules, ip)?,
        };
        if e.volumes.is_empty() {
            return Some(grant);
        }
        let backend = self.backend.as_ref()?;
        match backend.volume_of(fh) {
            Ok(Some(root)) => match e.volumes.get(&root) {
                Some(rules) => Some(grant.narrow(evaluate(rules, ip)?)),
                None => Some(grant),
            },
            Ok(None) | Err(_) => Some(grant),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn rule(clients: &[&str], access: AccessType, squash: Squash) -> Rule {
        Rule {
            clients: clients.iter().map(|c| Net::parse(c).unwrap()).collect(),
            access,
            squash,
            anon_uid: 1234,
            anon_gid: 4321,
        }
    }

    #[test]
    fn cidr_edges() {
        let n = Net::parse("10.1.0.0/16").unwrap();
        assert!(n.contains(ip("10.1.0.0")));
        assert!(n.contains(ip("10.1.255.255")));
        assert!(!n.contains(ip("10.2.0.0")));
        assert!(!n.contains(ip("10.0.255.255")));
        assert!(Net::parse("0.0.0.0/0").unwrap().contains(ip("255.255.255.255")));
        assert!(!Net::parse("0.0.0.0/0").unwrap().contains(ip("::1")), "a v4 network never holds a v6 address");
        let host = Net::parse("192.168.1.7").unwrap();
        assert_eq!(host, Net::V4 { addr: 0xc0a8_0107, prefix: 32 });
        assert!(host.contains(ip("192.168.1.7")));
        assert!(!host.contains(ip("192.168.1.6")));
        assert!(Net::parse("192.168.1.7/32").unwrap().contains(ip("192.168.1.7")));
        assert!(Net::parse("128.0.0.0/1").unwrap().contains(ip("200.0.0.1")));
        assert!(!Net::parse("128.0.0.0/1").unwrap().contains(ip("127.255.255.255")));
        assert!(Net::parse("*").unwrap().contains(ip("::1")));
        assert_eq!(Net::parse("10.1.0.0/16").unwrap().to_string(), "10.1.0.0/16");
        assert_eq!(Net::parse("10.1.0.9").unwrap().to_string(), "10.1.0.9");
    }

    #[test]
    fn ipv6_and_v4_mapped() {
        let n = Net::parse("fd00:1::/32").unwrap();
        assert!(n.contains(ip("fd00:1::5")));
        assert!(n.contains(ip("fd00:1:ffff::")));
        assert!(!n.contains(ip("fd00:2::")));
        assert!(!n.contains(ip("10.0.0.1")));
        assert!(Net::parse("::/0").unwrap().contains(ip("2001:db8::1")));
        assert!(Net::parse("::1").unwrap().contains(ip("::1")));
        // A v4-mapped peer is its v4 address.
        let v4 = Net::parse("10.0.0.0/8").unwrap();
        assert!(v4.contains(ip("::ffff:10.9.8.7")));
        assert!(!v4.contains(ip("::ffff:11.0.0.1")));
        // A v4-mapped rule is the v4 rule.
        assert_eq!(Net::parse("::ffff:10.0.0.0/104").unwrap(), Net::V4 { addr: 0x0a00_0000, prefix: 8 });
        assert_eq!(Net::parse("::ffff:10.0.0.1").unwrap(), Net::V4 { addr: 0x0a00_0001, prefix: 32 });
        assert!(Net::parse("::ffff:10.0.0.1").unwrap().contains(ip("10.0.0.1")));
        assert_eq!(canonical(ip("::ffff:1.2.3.4")), ip("1.2.3.4"));
        assert_eq!(canonical(ip("::1")), ip("::1"));
    }

    #[test]
    fn hostile_specs_are_errors() {
        for bad in [
            "", " ", "10.0.0.0/", "10.0.0.0/33", "10.0.0.0/-1", "10.0.0.0/+8", "10.0.0.0/8/8", "10.0.0.1/8",
            "10.0.0.256", "10.0.0", "1.2.3.4.5", "::/129", "fd00::1/64", "host.example", "*/8", "10.0.0.0/0008",
            "10.0.0.0/ 8", "[::1]", "::1%eth0", "0x0a000001", "10.0.0.0/99999999999999999999", "\u{0}",
        ] {
            assert!(Net::parse(bad).is_err(), "{bad:?} must not parse");
        }
        assert!(Net::parse("10.0.0.0/008").is_ok(), "leading zeros within three digits are a number");
    }

    #[test]
    fn first_match_wins_in_order() {
        let rules = vec![
            rule(&["10.0.0.5"], AccessType::None, Squash::RootSquash),
            rule(&["10.0.0.0/24"], AccessType::ReadOnly, Squash::AllSquash),
            rule(&["10.0.0.0/8", "fd00::/8"], AccessType::ReadWrite, Squash::RootSquash),
        ];
        assert_eq!(evaluate(&rules, ip("10.0.0.5")), None);
        let g = evaluate(&rules, ip("10.0.0.6")).unwrap();
        assert!(!g.writable);
        assert_eq!(g.squash, Squash::AllSquash);
        let g = evaluate(&rules, ip("10.9.0.1")).unwrap();
        assert!(g.writable);
        assert_eq!(g.squash, Squash::RootSquash);
        assert!(evaluate(&rules, ip("fd12::1")).unwrap().writable);
        assert_eq!(evaluate(&rules, ip("11.0.0.1")), None, "no match, no access");
        assert_eq!(evaluate(&[], ip("10.0.0.1")), None, "an empty list admits nobody");
        // Document order, not specificity: a wide rule first shadows a narrow one.
        let rules = vec![
            rule(&["10.0.0.0/8"], AccessType::ReadWrite, Squash::NoRootSquash),
            rule(&["10.0.0.5"], AccessType::None, Squash::NoRootSquash),
        ];
        assert!(evaluate(&rules, ip("10.0.0.5")).is_some());
    }

    #[test]
    fn squashing() {
        let gids = [5u32, 6];
        let root = Cred { uid: 0, gid: 0, gids: &gids };
        let user = Cred { uid: 1000, gid: 100, gids: &gids };
        let g = |s| Grant { writable: true, squash: s, anon_uid: 77, anon_gid: 88 };
        let c = g(Squash::RootSquash).squash(root);
        assert_eq!((c.uid, c.gid, c.gids.len()), (77, 88, 0));
        let c = g(Squash::RootSquash).squash(user);
        assert_eq!((c.uid, c.gid, c.gids.len()), (1000, 100, 2));
        let c = g(Squash::AllSquash).squash(user);
        assert_eq!((c.uid, c.gid, c.gids.len()), (77, 88, 0));
        let c = g(Squash::NoRootSquash).squash(root);
        assert_eq!((c.uid, c.gid), (0, 0));
    }

    #[test]
    fn table_defaults_open_and_changes_apply() {
        let t = AccessTable::new();
        assert_eq!(t.check(1, ip("1.2.3.4")), Some(Grant::OPEN));
        t.set(1, Some(vec![rule(&["10.0.0.0/8"], AccessType::ReadOnly, Squash::RootSquash)]));
        assert_eq!(t.check(1, ip("1.2.3.4")), None);
        assert!(!t.check(1, ip("::ffff:10.1.1.1")).unwrap().writable);
        assert_eq!(t.check(2, ip("1.2.3.4")), Some(Grant::OPEN), "other exports stay open");
        t.set(1, None);
        assert_eq!(t.check(1, ip("1.2.3.4")), Some(Grant::OPEN));
        assert!(t.get(1).is_none());
    }

    #[test]
    fn narrowing_takes_the_stricter_of_each() {
        let g = |w, s, id| Grant { writable: w, squash: s, anon_uid: id, anon_gid: id };
        use Squash::*;
        assert!(!g(true, NoRootSquash, 1).narrow(g(false, NoRootSquash, 2)).writable, "ro inside wins");
        assert!(!g(false, NoRootSquash, 1).narrow(g(true, NoRootSquash, 2)).writable, "ro outside wins");
        assert!(g(true, NoRootSquash, 1).narrow(g(true, NoRootSquash, 2)).writable);
        for (outer, inner, want, id) in [
            (NoRootSquash, RootSquash, RootSquash, 2),
            (RootSquash, NoRootSquash, RootSquash, 1),
            (AllSquash, RootSquash, AllSquash, 1),
            (RootSquash, AllSquash, AllSquash, 2),
            (RootSquash, RootSquash, RootSquash, 2),
        ] {
            let n = g(true, outer, 1).narrow(g(true, inner, 2));
            assert_eq!((n.squash, n.anon_uid, n.anon_gid), (want, id, id), "{outer:?} then {inner:?}");
        }
    }

    /// Volume rules over a real memfs: a handle inside a volume with rules
    /// gets them on top of the export's; a handle in another volume or
    /// outside any gets the export's alone; removing the rules reopens.
    #[test]
    fn volume_rules_narrow_handles_inside_the_volume() {
        use crate::memfs::{MemFs, MemFsConfig};
        use crate::{CreateMode, NodeKind};
        let fs = Arc::new(MemFs::new(MemFsConfig { export_id: 3, capacity_bytes: 16 << 20 }));
        let root = fs.root(3).unwrap();
        let mk = |dir: &FileHandle, name: &[u8], kind| fs.create(dir, name, kind, 0o777, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
        let a = mk(&root, b"a", NodeKind::Directory);
        let b = mk(&root, b"b", NodeKind::Directory);
        fs.set_quota(&a, 1 << 20).unwrap();
        fs.set_quota(&b, 1 << 20).unwrap();
        let in_a = mk(&a, b"f", NodeKind::File);
        let in_b = mk(&b, b"f", NodeKind::File);
        let outside = mk(&root, b"f", NodeKind::File);
        assert_eq!(fs.volume_of(&in_a).unwrap(), Some(a.ino));
        assert_eq!(fs.volume_of(&a).unwrap(), Some(a.ino), "a volume's root is inside it");
        assert_eq!(fs.volume_of(&outside).unwrap(), None);

        assert!(AccessTable::new().set_volume(3, a.ino, Some(vec![])).is_err(), "no backend, no volume rules");
        let t = AccessTable::with_volumes(fs.clone());
        let peer = ip("10.0.0.1");
        t.set_volume(3, a.ino, Some(vec![rule(&["*"], AccessType::ReadOnly, Squash::RootSquash)])).unwrap();
        assert_eq!(t.check(3, peer), Some(Grant::OPEN), "the export alone is open");
        let g = t.check_fh(&in_a, peer).unwrap();
        assert!(!g.writable);
        assert_eq!((g.squash, g.anon_uid), (Squash::RootSquash, 1234));
        assert!(!t.check_fh(&a, peer).unwrap().writable, "the volume root too");
        assert_eq!(t.check_fh(&in_b, peer), Some(Grant::OPEN), "another volume");
        assert_eq!(t.check_fh(&outside, peer), Some(Grant::OPEN), "outside every volume");
        assert_eq!(t.check_fh(&root, peer), Some(Grant::OPEN));

        // The export's rules still apply, and refuse before the volume's.
        t.set(3, Some(vec![rule(&["10.0.0.0/8"], AccessType::ReadWrite, Squash::AllSquash)]));
        let g = t.check_fh(&in_a, peer).unwrap();
        assert_eq!((g.writable, g.squash), (false, Squash::AllSquash));
        assert_eq!(t.check_fh(&in_a, ip("11.0.0.1")), None);
        assert!(t.check_fh(&in_b, peer).unwrap().writable);
        // A volume rule of `none`, or no match, refuses inside it only.
        t.set_volume(3, a.ino, Some(vec![rule(&["10.9.0.0/16"], AccessType::ReadWrite, Squash::NoRootSquash)])).unwrap();
        assert_eq!(t.check_fh(&in_a, peer), None);
        assert!(t.check_fh(&in_a, ip("10.9.1.1")).is_some());
        assert!(t.check_fh(&in_b, peer).is_some());
        assert_eq!(t.get_volume(3, a.ino).unwrap().len(), 1);
        // Cleared: the export's rules alone; with those gone too, open.
        t.set_volume(3, a.ino, None).unwrap();
        assert!(t.check_fh(&in_a, peer).unwrap().writable);
        t.set(3, None);
        assert_eq!(t.check_fh(&in_a, ip("11.0.0.1")), Some(Grant::OPEN));
        assert!(t.get_volume(3, a.ino).is_none());
        // A stale handle gets the export's grant (its call fails on it).
        t.set_volume(3, a.ino, Some(vec![])).unwrap();
        fs.remove(&a, b"f").unwrap();
        assert_eq!(t.check_fh(&in_a, peer), Some(Grant::OPEN));
        assert_eq!(t.check_fh(&a, peer), None);
    }
}
