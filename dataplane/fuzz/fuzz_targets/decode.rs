//! libFuzzer entry point: see src/lib.rs for the input format.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

static TARGETS: OnceLock<Vec<chimera_fuzz::Target>> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let targets = TARGETS.get_or_init(chimera_fuzz::targets);
    chimera_fuzz::run(targets, data);
});
