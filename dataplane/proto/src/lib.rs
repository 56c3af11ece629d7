//! Wire types of every protocol we speak, generated at build time from our own
//! `.x` specifications (see `spec/` and README.md), plus the XDR runtime they use.
//!
//! Every generated type implements [`xdr::Xdr`]; decoders borrow
//! variable-length data from the receive buffer.
pub mod xdr;

macro_rules! generated {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[allow(
            non_camel_case_types,
            non_snake_case,
            non_upper_case_globals,
            unused_variables,
            unused_imports,
            unused_mut,
            unreachable_patterns,
            clippy::all
        )]
        pub mod $name {
            include!(concat!(env!("OUT_DIR"), "/", stringify!($name), ".rs"));
        }
    };
}

generated!(
    /// ONC RPC message header and AUTH_SYS credentials (RFC 5531), from `spec/rpc.x`.
    rpc
);
generated!(
    /// Port mapper version 2 (RFC 1833 section 3), from `spec/portmap.x`.
    portmap
);
generated!(
    /// MOUNT version 3 (RFC 1813 section 5), from `spec/mount3.x`.
    mount3
);
generated!(
    /// NFS version 3 (RFC 1813), from `spec/nfs3.x`.
    nfs3
);
generated!(
    /// NFS version 4.1 with pNFS and the callback program (RFC 5662 / RFC 8881),
    /// extended by NFSv4.2 (RFC 7862: op numbers, errors, the types of SEEK,
    /// ALLOCATE, DEALLOCATE, READ_PLUS, LAYOUTERROR, LAYOUTSTATS) and its
    /// extended attributes (RFC 8276), from `spec/nfs4.x`.
    nfs4
);
generated!(
    /// pNFS flexible file layout (RFC 8435), from `spec/flexfiles.x`.
    flexfiles
);

#[cfg(test)]
mod tests;
