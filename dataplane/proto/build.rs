//! Generates the wire types of every protocol from `spec/*.x` with xdrgen
//! into OUT_DIR; `src/lib.rs` includes each as a module.

use std::path::{Path, PathBuf};

/// (module, spec file, modules whose definitions it uses).
const SPECS: &[(&str, &str, &[&str])] = &[
    ("rpc", "rpc.x", &[]),
    ("portmap", "portmap.x", &[]),
    ("mount3", "mount3.x", &[]),
    ("nfs3", "nfs3.x", &[]),
    ("nfs4", "nfs4.x", &["rpc"]),
    ("flexfiles", "flexfiles.x", &["nfs4"]),
];

fn main() {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut parsed: Vec<(&str, xdrgen::Spec)> = Vec::new();
    for (module, file, deps) in SPECS {
        let path = Path::new("spec").join(file);
        println!("cargo:rerun-if-changed={}", path.display());
        let spec = xdrgen::parse_file(&path).unwrap_or_else(|e| fail(&e));
        let dep_paths: Vec<String> = deps.iter().map(|d| format!("crate::{d}")).collect();
        let dep_list: Vec<xdrgen::Dep> = deps
            .iter()
            .zip(&dep_paths)
            .map(|(d, p)| {
                let spec = &parsed.iter().find(|(m, _)| m == d).expect("dependencies are listed first").1;
                xdrgen::Dep { module: p, spec }
            })
            .collect();
        let code = xdrgen::generate(&spec, &dep_list).unwrap_or_else(|e| fail(&e));
        std::fs::write(out_dir.join(format!("{module}.rs")), code).expect("write generated code");
        parsed.push((module, spec));
    }
    println!("cargo:rerun-if-changed=build.rs");
}

fn fail(e: &xdrgen::Error) -> ! {
    // cargo shows build-script stderr on failure: file:line: message.
    eprintln!("error: {e}");
    std::process::exit(1)
}
