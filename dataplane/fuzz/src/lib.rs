//! What the fuzzer feeds hostile bytes to: the RPC message header, the
//! arguments and results of every procedure of every program we generate,
//! and the flex-files structures that travel inside NFSv4.1 opaques.
//!
//! An input is a 2-byte big-endian selector (taken modulo the number of
//! targets) followed by the bytes to decode. Each target's `check` decodes;
//! when decoding succeeds it re-encodes and asserts that `encoded_len`,
//! `encode` and a second decode agree, so the fuzzer finds inconsistencies
//! as well as panics. Errors are the expected answer to garbage.

use proto::xdr::testgen::{CheckFn, GenFn, Rng};
use proto::{flexfiles, mount3, nfs3, nfs4, portmap, rpc};

/// Bytes of an input that select the target.
pub const SELECTOR_BYTES: usize = 2;

pub struct Target {
    pub name: String,
    pub gen: GenFn,
    pub check: CheckFn,
}

fn type_target(module: &str, name: &str, table: &[proto::xdr::testgen::TypeCheck]) -> Target {
    let t = table.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{module} has no type {name}"));
    Target { name: format!("{module}::{name}"), gen: t.gen, check: t.check }
}

/// Every fuzz target, in a fixed order (the selector indexes it).
pub fn targets() -> Vec<Target> {
    let mut out = vec![type_target("rpc", "rpc_msg", rpc::testgen::TYPES)];
    out.push(type_target("rpc", "authsys_parms", rpc::testgen::TYPES));
    let procs = [
        portmap::testgen::PROCEDURES,
        mount3::testgen::PROCEDURES,
        nfs3::testgen::PROCEDURES,
        nfs4::testgen::PROCEDURES,
    ];
    for p in procs.iter().flat_map(|t| t.iter()) {
        out.push(Target { name: format!("{} args", p.name), gen: p.gen_args, check: p.check_args });
        out.push(Target { name: format!("{} res", p.name), gen: p.gen_res, check: p.check_res });
    }
    // Single NFSv4.1 operations, as a server decodes them one at a time.
    out.push(type_target("nfs4", "nfs_argop4", nfs4::testgen::TYPES));
    out.push(type_target("nfs4", "nfs_cb_resop4", nfs4::testgen::TYPES));
    for name in ["ff_layout4", "ff_device_addr4", "ff_layoutreturn4", "ff_layoutupdate4", "ff_layouthint4"] {
        out.push(type_target("flexfiles", name, flexfiles::testgen::TYPES));
    }
    out
}

/// Run one fuzz input. Panics only when generated code is inconsistent.
pub fn run(targets: &[Target], data: &[u8]) {
    if data.len() < SELECTOR_BYTES {
        return;
    }
    let sel = u16::from_be_bytes([data[0], data[1]]) as usize % targets.len();
    let t = &targets[sel];
    if let Ok((used, _)) = (t.check)(&data[SELECTOR_BYTES..]) {
        assert!(used <= data.len() - SELECTOR_BYTES, "{}: consumed more than it was given", t.name);
    }
}

/// A valid input for target `index` (seed corpus).
pub fn seed(targets: &[Target], index: usize, seed: u64) -> Vec<u8> {
    let mut out = (index as u16).to_be_bytes().to_vec();
    (targets[index].gen)(&mut Rng::new(seed), 0, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proves the harness itself works: every seed is accepted by its target
    /// (so the corpus starts from valid inputs) and selectors stay in range.
    #[test]
    fn seeds_decode_and_selectors_wrap() {
        let t = targets();
        assert!(t.len() >= 80, "only {} targets", t.len());
        assert!(t.len() < u16::MAX as usize);
        for i in 0..t.len() {
            let s = seed(&t, i, 7);
            let (used, again) = (t[i].check)(&s[SELECTOR_BYTES..]).unwrap_or_else(|e| panic!("{}: {e}", t[i].name));
            assert_eq!((used, again.as_slice()), (s.len() - SELECTOR_BYTES, &s[SELECTOR_BYTES..]), "{}", t[i].name);
            run(&t, &s);
        }
        run(&t, &[0xff, 0xff, 0, 0, 0, 1]);
        run(&t, &[]);
    }
}
