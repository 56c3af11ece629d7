//! chimerad: configuration, the admin API, the metrics endpoint and the glue
//! that starts the data path. The binary (`main.rs`) is a thin shell over this
//! library so that tests drive the same code in-process.

pub mod admin;
pub mod config;
pub mod http;
pub mod log;
pub mod metrics;
pub mod volumes;
pub mod serve;
pub mod tls;
