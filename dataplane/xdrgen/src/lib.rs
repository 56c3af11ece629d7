//! xdrgen
