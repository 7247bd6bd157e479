//! TLS on a listener (`tls:` for the client port, which also serves the gRPC routes, and
//! `admin.tls`): certificates chosen by SNI, TLS 1.2/1.3, ALPN `h2` and `http/1.1`, the
//! handshake timeout, client certificates (mTLS). The files are read (and re-read when they
//! change) by the server (`fanout-transport/src/tls.rs`); here only their names and settings.

use crate::{ConfigError, Dur, Located};
use schemars::JsonSchema;
use serde::Deserialize;

/// TLS on a listener: every connection to it speaks TLS (HTTP/1.1 and h2 chosen by ALPN).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListenerTls {
    /// Certificate chains and their keys (PEM files). The one whose names (subject alternative
    /// names, `*.example.com` wildcards included) match the client's SNI is presented; the first
    /// one is presented for an unknown or absent SNI (unless `unknown_sni: refuse`). Re-read when
    /// a file changes (the directory is watched, so a Kubernetes Secret's symlink swap is seen).
    pub certificates: Vec<CertificatePair>,
    /// Oldest TLS version accepted: `"1.2"` or `"1.3"`. Default `"1.2"` (older ones never).
    #[serde(default)]
    pub min_version: TlsVersion,
    /// What a client whose SNI names none of the certificates gets: `default` (the first
    /// certificate) or `refuse` (the handshake fails). Default `default`.
    #[serde(default)]
    pub unknown_sni: UnknownSni,
    /// Time a new connection has to complete the TLS handshake; a slower (or silent) client is
    /// closed and counted (`connections.timeouts.tls_handshake` on `/__fanout/status`).
    /// Default 10s.
    #[serde(default = "default_handshake_timeout")]
    pub handshake_timeout: Dur,
    /// Client certificates (mTLS), verified against a CA file. Default: none asked for.
    pub client_auth: Option<ClientAuth>,
    /// How often the certificate, key and CA files are read again and compared, besides the
    /// file-system events of their directories (a safety net for lost events). Default 5s.
    #[serde(default = "default_poll")]
    pub poll: Dur,
}

/// One certificate chain and its private key.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CertificatePair {
    /// PEM file with the certificate chain, the server's certificate first.
    pub cert_file: Located<String>,
    /// PEM file with the private key (PKCS#8, PKCS#1 or SEC1) of the first certificate.
    pub key_file: Located<String>,
}

/// A TLS protocol version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum TlsVersion {
    /// TLS 1.2 (and 1.3).
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3 only.
    #[serde(rename = "1.3")]
    Tls13,
}

/// What a ClientHello naming no loaded certificate gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum UnknownSni {
    /// The first certificate.
    #[default]
    Default,
    /// A failed handshake.
    Refuse,
}

/// Client certificates: verified against `ca_file`; `$request.tls.client` holds the verified
/// client's subject, issuer, serial, expiry, fingerprint and SANs.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientAuth {
    /// PEM file of the CA certificates client certificates must chain to (re-read when it
    /// changes, like the certificates).
    pub ca_file: Located<String>,
    /// `required`: a client without a valid certificate is refused in the handshake;
    /// `optional`: a client may present none (`$request.tls.client` is `null`), but one it
    /// presents must be valid. Default `required`.
    #[serde(default)]
    pub mode: ClientAuthMode,
}

/// Whether a client certificate is required.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ClientAuthMode {
    /// Refuse clients without one.
    #[default]
    Required,
    /// Accept clients without one.
    Optional,
}

/// An error about the `tls` section as a whole (its lists and durations carry no position).
pub fn whole(message: String) -> ConfigError {
    ConfigError {
        path: None,
        file: String::new(),
        pos: None,
        message,
        hint: None,
    }
}

fn default_handshake_timeout() -> Dur {
    Dur::secs(10)
}

fn default_poll() -> Dur {
    Dur::secs(5)
}

impl ListenerTls {
    /// The checks that need no file: at least one certificate, timeouts above zero.
    pub(crate) fn check(&self, at: &str, errs: &mut Vec<ConfigError>) {
        if self.certificates.is_empty() {
            errs.push(
                ConfigError::at_path(
                    format!("{at}.certificates"),
                    format!("`{at}.certificates` is empty"),
                )
                .hint("name at least one `{cert_file, key_file}` pair"),
            );
        }
        if self.handshake_timeout.0.is_zero() {
            errs.push(
                ConfigError::at_path(
                    format!("{at}.handshake_timeout"),
                    format!("`{at}.handshake_timeout` must be above 0"),
                )
                .hint("e.g. `10s` (the default)"),
            );
        }
        if self.poll.0.is_zero() {
            errs.push(
                ConfigError::at_path(format!("{at}.poll"), format!("`{at}.poll` must be above 0"))
                    .hint("e.g. `5s` (the default)"),
            );
        }
    }

    /// Every file this listener reads: the certificates and keys, then the client CA.
    pub fn files(&self) -> impl Iterator<Item = &Located<String>> {
        self.certificates
            .iter()
            .flat_map(|p| [&p.cert_file, &p.key_file])
            .chain(self.client_auth.as_ref().map(|c| &c.ca_file))
    }
}
