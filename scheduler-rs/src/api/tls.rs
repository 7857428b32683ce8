//! HTTPS (`--ssl-certfile` / `--ssl-keyfile`, as vLLM's): rustls with the ring provider,
//! TLS 1.2 and 1.3, HTTP/1.1 by ALPN. The accept loop (api/listen.rs) runs each handshake.

use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsFiles;

/// The acceptor for `files`: the PEM certificate chain (leaf first) and its private key
/// (PKCS#8, PKCS#1 or SEC1).
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor> {
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading certificates from {}", files.cert.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{}: no PEM certificate in it",
        files.cert.display()
    );
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .with_context(|| format!("reading a private key from {}", files.key.display()))?;
    // NOTE: ring (no post-quantum key exchange, hence rustls's deprecation note) builds with
    // a C compiler alone; aws-lc-rs, which has it, needs cmake and doubles the build.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the certificate and the private key do not go together")?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}
