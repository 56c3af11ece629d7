//! The userspace NFS client library (README.md): ONC RPC over TCP with many
//! calls in flight per connection (`rpc`), NFSv3 + MOUNT (`nfs3`) and
//! NFSv4.1 sessions (`nfs4`), on the generated wire types of `proto`.

pub mod error;
pub mod flexfiles;
pub mod nfs3;
pub mod nfs4;
pub mod rpc;
mod writes;

pub use error::{Error, Result};
pub use rpc::{Auth, Completion, Limits, Reply, RpcConn, XidMap};
