//! Wire types of every protocol we speak, generated at build time from our own
//! `.x` specifications (see `spec/`), plus the XDR runtime they use.
pub mod xdr;
