//! The roots a backend's TLS trusts, the same for every protocol (an HTTP backend's `https://`,
//! a database's `sslmode`).

use fanout_config::{Backend as BackendConfig, ConfigError};

/// The certificates a backend's TLS trusts: `tls.ca_file`'s, else the web PKI roots.
pub fn trusted_roots(
    name: &str,
    cfg: &BackendConfig,
) -> Result<rustls::RootCertStore, ConfigError> {
    let mut roots = rustls::RootCertStore::empty();
    match &cfg.tls.ca_file {
        Some(path) => {
            use rustls_pki_types::{CertificateDer, pem::PemObject};
            let pem = fanout_config::read_limited(&path.value, fanout_config::MAX_CA_FILE_BYTES)
                .map_err(|e| {
                    ConfigError::at(
                        path.pos,
                        format!(
                            "backend `{name}`: cannot read CA file `{}`: {e}",
                            path.value
                        ),
                    )
                })?;
            let certs = CertificateDer::pem_slice_iter(&pem);
            for c in certs {
                let c = c.map_err(|e| {
                    ConfigError::at(
                        path.pos,
                        format!("backend `{name}`: bad certificate in `{}`: {e}", path.value),
                    )
                })?;
                roots.add(c).map_err(|e| {
                    ConfigError::at(
                        path.pos,
                        format!(
                            "backend `{name}`: unusable certificate in `{}`: {e}",
                            path.value
                        ),
                    )
                })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    Ok(roots)
}
