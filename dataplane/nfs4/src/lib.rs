//! NFSv4.1 (RFC 8881) server: program 100003 version 4.
pub mod state;
pub mod attrs;
