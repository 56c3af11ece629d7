//! nfs4
