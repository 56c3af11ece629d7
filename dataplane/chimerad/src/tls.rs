//! TLS for the admin API: the server certificate and key from PEM files
//! (`admin.tls.cert_file`, `admin.tls.key_file`), checked once by the config
//! parser (so `--check-config` catches them) and loaded again at start.
//! rustls with the `ring` provider; TLS 1.2 and 1.3, no client certificates
//! (clients authenticate with the bearer token).

use crate::config::ConfigError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

/// Largest certificate or key file read (a chain of a few certificates is
/// a few KiB).
pub const PEM_FILE_BYTES_MAX: u64 = 1 << 20;

/// The crypto provider every TLS endpoint of chimerad uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn fail(key: &str, msg: String) -> ConfigError {
    ConfigError { path: key.to_string(), msg }
}

fn read_pem(key: &str, file: &Path) -> Result<Vec<u8>, ConfigError> {
    let meta = std::fs::metadata(file).map_err(|e| fail(key, format!("cannot read {file:?}: {e}")))?;
    if !meta.is_file() {
        return Err(fail(key, format!("{file:?} is not a regular file")));
    }
    if meta.len() > PEM_FILE_BYTES_MAX {
        return Err(fail(key, format!("{file:?} is {} bytes, more than {PEM_FILE_BYTES_MAX}", meta.len())));
    }
    std::fs::read(file).map_err(|e| fail(key, format!("cannot read {file:?}: {e}")))
}

/// The certificate chain (leaf first) in `cert_file` and the private key in
/// `key_file`, as a rustls server config. Errors name the config key
/// (`cert_key` / `key_key`) and the file: unreadable, no PEM block of the
/// right kind, bad PEM, a key that is not the certificate's.
pub fn server_config(cert_key: &str, cert_file: &Path, key_key: &str, key_file: &Path) -> Result<Arc<rustls::ServerConfig>, ConfigError> {
    let cert_pem = read_pem(cert_key, cert_file)?;
    let mut chain = Vec::new();
    for c in CertificateDer::pem_slice_iter(&cert_pem) {
        chain.push(c.map_err(|e| fail(cert_key, format!("{cert_file:?}: bad PEM: {e}")))?);
    }
    if chain.is_empty() {
        return Err(fail(cert_key, format!("{cert_file:?} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")));
    }
    let key_pem = read_pem(key_key, key_file)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            fail(key_key, format!("{key_file:?} holds no PEM private key (-----BEGIN PRIVATE KEY-----, RSA or EC)"))
        }
        e => fail(key_key, format!("{key_file:?}: bad PEM: {e}")),
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(cert_key, format!("TLS setup: {e}")))?
        .with_no_client_auth();
    let mut cfg = builder.with_single_cert(chain, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            fail(key_key, format!("{key_file:?} is not the private key of the certificate in {cert_file:?}"))
        }
        rustls::Error::General(m) => fail(key_key, format!("{key_file:?}: unusable private key: {m}")),
        e => fail(cert_key, format!("{cert_file:?}: unusable certificate: {e}")),
    })?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
