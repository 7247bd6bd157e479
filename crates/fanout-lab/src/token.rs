//! The lab's JWT issuer: one ES256 key made per run (ring), its public key as an inline JWK
//! set for a gateway's `auth:` provider, and one token signed with it (jsonwebtoken) that every
//! client of a run sends — what `hh-vacancies`' `fanout-auth` target verifies.

use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use std::sync::OnceLock;

/// The tokens' `iss`.
pub const ISSUER: &str = "fanout-lab";
/// The tokens' `aud`.
pub const AUDIENCE: &str = "lab";

/// A key set and a token it verifies.
pub struct LabToken {
    /// `{"keys": [the public key as a JWK]}`, one line.
    pub jwks: String,
    /// A token for `lab-user`, valid for a day.
    pub token: String,
}

/// The run's token (made once); `None` when the key or the token could not be made (the
/// `fanout-auth` target is then not offered).
pub fn lab_token() -> Option<&'static LabToken> {
    static TOKEN: OnceLock<Option<LabToken>> = OnceLock::new();
    TOKEN
        .get_or_init(|| match make() {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "the lab's JWT could not be made; no fanout-auth target");
                None
            }
        })
        .as_ref()
}

fn make() -> Result<LabToken, String> {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
        .map_err(|e| format!("key: {e}"))?;
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
        .map_err(|e| format!("key: {e}"))?;
    let public = pair.public_key().as_ref();
    if public.len() != 65 {
        return Err(format!("a P-256 public key of {} bytes", public.len()));
    }
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let jwks = serde_json::json!({"keys": [{
        "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": "lab",
        "x": b64(&public[1..33]), "y": b64(&public[33..65]),
    }]})
    .to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs();
    let claims = serde_json::json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "lab-user", "iat": now, "exp": now + 86_400,
    });
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("lab".into());
    let token = jsonwebtoken::encode(&header, &claims, &EncodingKey::from_ec_der(pkcs8.as_ref()))
        .map_err(|e| format!("token: {e}"))?;
    Ok(LabToken { jwks, token })
}
