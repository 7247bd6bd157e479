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

/// The client certificate chain and key a backend's TLS presents (`tls.cert_file` and
/// `tls.key_file`, both or neither), `None` without them.
pub fn client_identity(
    name: &str,
    cfg: &BackendConfig,
) -> Result<
    Option<(
        Vec<rustls_pki_types::CertificateDer<'static>>,
        rustls_pki_types::PrivateKeyDer<'static>,
    )>,
    ConfigError,
> {
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let (cert, key) = match (&cfg.tls.cert_file, &cfg.tls.key_file) {
        (None, None) => return Ok(None),
        (Some(c), Some(k)) => (c, k),
        (Some(f), None) | (None, Some(f)) => {
            return Err(ConfigError::at(
                f.pos,
                format!("backend `{name}`: `tls.cert_file` and `tls.key_file` go together"),
            )
            .hint("name both the client certificate chain and its private key"));
        }
    };
    let read = |f: &fanout_config::Located<String>| {
        fanout_config::read_limited(&f.value, fanout_config::MAX_CA_FILE_BYTES).map_err(|e| {
            ConfigError::at(
                f.pos,
                format!("backend `{name}`: cannot read `{}`: {e}", f.value),
            )
        })
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<_, _>>()
        .map_err(|e| {
            ConfigError::at(
                cert.pos,
                format!("backend `{name}`: bad certificate in `{}`: {e}", cert.value),
            )
        })?;
    if chain.is_empty() {
        return Err(ConfigError::at(
            cert.pos,
            format!("backend `{name}`: no certificate in `{}`", cert.value),
        ));
    }
    let pk = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| {
        ConfigError::at(
            key.pos,
            format!("backend `{name}`: no private key in `{}`: {e}", key.value),
        )
    })?;
    Ok(Some((chain, pk)))
}
