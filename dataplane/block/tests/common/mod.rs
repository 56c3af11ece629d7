//! Shared by the block tests: device files where O_DIRECT works, byte
//! patterns, and a conformance run every device must pass.
#![allow(dead_code)]

use block::uring::{probe_direct_io, IoMode, UringOptions};
#[allow(unused_imports)]
pub use block::conformance::{conformance, drain, pattern, pattern_vec, pool};
use std::path::PathBuf;

/// A device file removed on drop. It lives in cargo's per-target temporary
/// directory (on the build's disk, where O_DIRECT works: the system's /tmp
/// may be tmpfs); if even that cannot do direct I/O, the file is opened in
/// the documented buffered test mode and the test says so.
pub struct TempFile {
    pub path: PathBuf,
    pub io_mode: IoMode,
}

impl TempFile {
    pub fn new(name: &str, bytes: u64) -> TempFile {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("block-tests");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}-{}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(bytes).unwrap();
        let io_mode = if probe_direct_io(&dir).unwrap() {
            IoMode::Direct
        } else {
            eprintln!("{}: no O_DIRECT here; buffered test mode", dir.display());
            IoMode::BufferedForTests
        };
        TempFile { path, io_mode }
    }

    pub fn options(&self) -> UringOptions {
        UringOptions { io_mode: self.io_mode, ..UringOptions::new(&self.path) }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

