//! `https://` targets: the client TLS configuration (roots from a CA file, the web PKI roots, or
//! no verification at all for a lab's self-signed gateway), ALPN by protocol (`h2` for HTTP/2
//! and gRPC, `http/1.1` otherwise), session resumption on or off, and the stream type that is
//! either plain TCP or TLS over it.

use crate::{LoadError, Protocol};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// How an `https://` target is spoken to.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM file of the CA certificates to trust (default: the web PKI roots).
    pub ca_file: Option<PathBuf>,
    /// Accept any server certificate (a lab's self-signed gateway): the handshake's cost is the
    /// same, only the check is skipped.
    pub insecure: bool,
    /// Never resume a TLS session: every new connection makes a full handshake (to measure
    /// what full handshakes cost; default: sessions are resumed, as clients do).
    pub no_resumption: bool,
}

/// The TLS side of an `https://` target.
#[derive(Clone)]
pub(crate) struct TlsTarget {
    pub connector: TlsConnector,
    pub name: ServerName<'static>,
}

impl std::fmt::Debug for TlsTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsTarget")
            .field("name", &self.name)
            .finish()
    }
}

impl TlsTarget {
    /// The client configuration for `host` (the SNI name, an IP address is sent as none).
    pub fn new(
        target: &str,
        host: &str,
        opts: &TlsOptions,
        protocol: Protocol,
    ) -> Result<TlsTarget, LoadError> {
        let bad = |reason: String| LoadError::Target {
            target: target.to_string(),
            reason,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(format!("TLS: {e}")))?;
        let mut config = if opts.insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
                .with_no_client_auth()
        } else {
            let mut roots = rustls::RootCertStore::empty();
            match &opts.ca_file {
                Some(path) => {
                    use rustls::pki_types::pem::PemObject;
                    let certs = CertificateDer::pem_file_iter(path)
                        .map_err(|e| bad(format!("CA file {}: {e}", path.display())))?;
                    for c in certs {
                        let c = c.map_err(|e| bad(format!("CA file {}: {e}", path.display())))?;
                        roots
                            .add(c)
                            .map_err(|e| bad(format!("CA file {}: {e}", path.display())))?;
                    }
                }
                None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        };
        config.alpn_protocols = match protocol {
            Protocol::Http1 => vec![b"http/1.1".to_vec()],
            Protocol::Http2 | Protocol::Grpc => vec![b"h2".to_vec()],
        };
        if opts.no_resumption {
            config.resumption = rustls::client::Resumption::disabled();
        }
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| bad(format!("TLS server name `{host}`: {e}")))?;
        Ok(TlsTarget {
            connector: TlsConnector::from(Arc::new(config)),
            name,
        })
    }
}

/// A connection to the target: plain TCP, or TLS over it.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A verifier that accepts every certificate (`insecure`); signatures are still checked, so
/// the handshake does the same work as a verifying client's.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
