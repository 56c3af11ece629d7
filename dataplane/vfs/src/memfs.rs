//! memfs
