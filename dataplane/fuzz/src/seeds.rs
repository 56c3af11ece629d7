//! Writes the seed corpus: a few valid encodings of every fuzz target, named
//! by target index and seed, into the directory given as the only argument.
//! Deterministic, so the corpus is the same on every machine.

/// Valid encodings written per target.
const SEEDS_PER_TARGET: u64 = 3;

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| {
        eprintln!("usage: seeds <corpus-dir>");
        std::process::exit(2)
    });
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {dir}: {e}"));
    let targets = chimera_fuzz::targets();
    let mut n = 0;
    for i in 0..targets.len() {
        for s in 0..SEEDS_PER_TARGET {
            let path = format!("{dir}/seed-{i:04}-{s}");
            std::fs::write(&path, chimera_fuzz::seed(&targets, i, s)).unwrap_or_else(|e| panic!("write {path}: {e}"));
            n += 1;
        }
    }
    println!("seeds: wrote {n} inputs for {} targets to {dir}", targets.len());
}
