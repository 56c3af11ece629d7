//! NFS over RDMA: RPC-over-RDMA version 1 (RFC 8166) with the NFS upper
//! layer binding (RFC 8267) and the NFSv4.1 back channel on the same
//! connection (RFC 8167), over rdma-core loaded at run time.
//!
//! - [`wire`]: transport headers, chunk lists, RFC 8797 private data (pure).
//! - [`verbs`]: our thin dlopen binding of libibverbs and librdmacm.
//! - [`qp`]: the requester's side of a connection: resolve, queue pair,
//!   registered memory, private data exchanged.
//! - [`requester`]: RPC calls over such a connection, for the userspace
//!   client library (`client::rpc::RpcConn::connect_rdma`).
//! - [`client`]: a raw client that sends messages it builds itself (the
//!   probe and the hostile-input suite).
//! - [`server`] (feature `server`): the listener and event loop that feeds
//!   `rpc::Dispatcher`.

pub mod client;
pub mod mem;
pub mod qp;
pub mod requester;
#[cfg(feature = "server")]
pub mod server;
pub mod verbs;
pub mod wire;
