//! The lab's TLS certificate: one self-signed certificate for `localhost` and `127.0.0.1` (ECDSA
//! P-256, rcgen) written into the run directory for a target that listens with TLS. A variant's
//! config names the directory as [`TLS_DIR`]; the lab replaces it when it writes the config, and
//! its clients connect with `https://` without checking the certificate (the handshakes cost the
//! same: signatures are still verified).

use std::path::{Path, PathBuf};

/// What a variant's config writes for the directory holding `cert.pem` and `key.pem`.
pub const TLS_DIR: &str = "@LAB_TLS_DIR@";

/// Whether a variant's config listens with TLS (it names the lab's certificate).
pub fn speaks_tls(yaml: &str) -> bool {
    yaml.contains(TLS_DIR)
}

/// Write `cert.pem` and `key.pem` into `out/tls` (once per run; kept when already there) and
/// return the directory.
pub fn ensure(out: &Path) -> Result<PathBuf, String> {
    let dir = out.join("tls");
    if dir.join("cert.pem").is_file() && dir.join("key.pem").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .map_err(|e| format!("the lab's certificate: {e}"))?;
    for (file, text) in [
        ("cert.pem", ck.cert.pem()),
        ("key.pem", ck.signing_key.serialize_pem()),
    ] {
        let f = dir.join(file);
        std::fs::write(&f, text).map_err(|e| format!("{}: {e}", f.display()))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_and_its_key_are_written_once() {
        let out = std::env::temp_dir().join(format!("fanout-lab-certs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let dir = ensure(&out).unwrap_or_else(|e| panic!("{e}"));
        let cert = std::fs::read_to_string(dir.join("cert.pem")).unwrap_or_default();
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"), "{cert}");
        let key = std::fs::read_to_string(dir.join("key.pem")).unwrap_or_default();
        assert!(key.contains("PRIVATE KEY"), "{key}");
        assert_eq!(ensure(&out).ok(), Some(dir.clone()));
        assert_eq!(
            std::fs::read_to_string(dir.join("cert.pem")).ok(),
            Some(cert)
        );
        assert!(speaks_tls("tls:\n  cert: @LAB_TLS_DIR@/cert.pem"));
        assert!(!speaks_tls("listen: x"));
        let _ = std::fs::remove_dir_all(&out);
    }
}
