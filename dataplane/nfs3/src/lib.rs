//! nfs3
