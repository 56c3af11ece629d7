//! TLS for the admin API: the server certificate and key from PEM files
//! (`admin.tls.cert_file`, `admin.tls.key_file`), checked once by the config
//! parser (so `--check-config` catches them) and loaded again at start.
//! rustls with the `ring` provider; TLS 1.2 and 1.3, no client certificates
//! (clients authenticate with the bearer token). A renewed certificate is
//! picked up without a restart (`RELOAD_CHECK_INTERVAL`).

use crate::config::ConfigError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

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

/// How often a handshake may look at the files' modification times; a
/// renewed certificate (the operator rewrites its Secret, the kubelet swaps
/// the mounted files) is served within this long.
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// The certificate chain (leaf first) in `cert_file` and the private key in
/// `key_file`, as a rustls server config. Errors name the config key
/// (`cert_key` / `key_key`) and the file: unreadable, no PEM block of the
/// right kind, bad PEM, a key that is not the certificate's. The files are
/// watched: when either changes, the next handshake after
/// `RELOAD_CHECK_INTERVAL` loads them again (a pair that does not load is
/// logged and the one in use kept).
pub fn server_config(cert_key: &str, cert_file: &Path, key_key: &str, key_file: &Path) -> Result<Arc<rustls::ServerConfig>, ConfigError> {
    server_config_checked_every(cert_key, cert_file, key_key, key_file, RELOAD_CHECK_INTERVAL)
}

/// `server_config` with another reload check interval (tests).
pub fn server_config_checked_every(
    cert_key: &str,
    cert_file: &Path,
    key_key: &str,
    key_file: &Path,
    every: Duration,
) -> Result<Arc<rustls::ServerConfig>, ConfigError> {
    let files = Files { cert_key: cert_key.into(), cert_file: cert_file.into(), key_key: key_key.into(), key_file: key_file.into() };
    let (certified, stamp) = files.load()?;
    let resolver = Reloading { files, every, state: Mutex::new(State { certified, stamp, checked: Instant::now() }) };
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(cert_key, format!("TLS setup: {e}")))?
        .with_no_client_auth();
    let mut cfg = builder.with_cert_resolver(Arc::new(resolver));
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

#[derive(Debug)]
struct Files {
    cert_key: String,
    cert_file: PathBuf,
    key_key: String,
    key_file: PathBuf,
}

/// Modification times of the two files (following symlinks, as a mounted
/// Secret's are).
type Stamp = (Option<SystemTime>, Option<SystemTime>);

impl Files {
    fn stamp(&self) -> Stamp {
        let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        (m(&self.cert_file), m(&self.key_file))
    }

    fn load(&self) -> Result<(Arc<CertifiedKey>, Stamp), ConfigError> {
        let stamp = self.stamp();
        let (cert_key, cert_file, key_key, key_file) = (&self.cert_key, &self.cert_file, &self.key_key, &self.key_file);
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
        let certified = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                fail(key_key, format!("{key_file:?} is not the private key of the certificate in {cert_file:?}"))
            }
            rustls::Error::General(m) => fail(key_key, format!("{key_file:?}: unusable private key: {m}")),
            e => fail(cert_key, format!("{cert_file:?}: unusable certificate: {e}")),
        })?;
        Ok((Arc::new(certified), stamp))
    }
}

#[derive(Debug)]
struct State {
    certified: Arc<CertifiedKey>,
    stamp: Stamp,
    checked: Instant,
}

/// Serves the loaded pair; reloads it when the files change.
#[derive(Debug)]
struct Reloading {
    files: Files,
    every: Duration,
    state: Mutex<State>,
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.checked.elapsed() >= self.every {
            st.checked = Instant::now();
            if self.files.stamp() != st.stamp {
                match self.files.load() {
                    Ok((certified, stamp)) => {
                        st.certified = certified;
                        st.stamp = stamp;
                        crate::log::info("admin certificate reloaded", &[("file", self.files.cert_file.to_string_lossy().as_ref().into())]);
                    }
                    // Half-written files, or a pair that does not match yet:
                    // keep serving the pair in use and look again later.
                    Err(e) => crate::log::warn("admin certificate not reloaded", &[("error", e.to_string().as_str().into())]),
                }
            }
        }
        Some(st.certified.clone())
    }
}
