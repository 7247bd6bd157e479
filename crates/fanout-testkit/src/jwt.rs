//! Test tokens minted by an independent library (`jsonwebtoken`'s `encode`, `ring` keys made in
//! the test), and the JWK set that serves their public keys.

use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};

/// Base64url without padding.
pub fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Unix seconds now.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An ES256 (P-256) key pair made in the test, with its `kid`.
pub struct EsKey {
    /// The key id in tokens and the JWK set.
    pub kid: String,
    pkcs8: Vec<u8>,
    /// The uncompressed public point (`04 || x || y`).
    pub public: Vec<u8>,
}

impl EsKey {
    /// A new random key.
    pub fn generate(kid: &str) -> EsKey {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let kp = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        EsKey {
            kid: kid.to_string(),
            pkcs8: pkcs8.as_ref().to_vec(),
            public: kp.public_key().as_ref().to_vec(),
        }
    }

    /// The public key as a JWK.
    pub fn jwk(&self) -> serde_json::Value {
        serde_json::json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
            "x": b64url(&self.public[1..33]), "y": b64url(&self.public[33..65]),
        })
    }

    /// A token of `claims` signed with this key, its header naming `kid`.
    pub fn sign(&self, claims: &serde_json::Value) -> String {
        self.sign_as(&self.kid, claims)
    }

    /// A token of `claims` signed with this key, its header naming `kid` (another key's, or an
    /// unknown one).
    pub fn sign_as(&self, kid: &str, claims: &serde_json::Value) -> String {
        let mut h = Header::new(Algorithm::ES256);
        h.kid = Some(kid.to_string());
        jsonwebtoken::encode(&h, claims, &EncodingKey::from_ec_der(&self.pkcs8)).unwrap()
    }

    /// A token of `claims` under the header `header` exactly as given (fields `jsonwebtoken`'s
    /// `Header` cannot carry, such as `crit`), signed ES256 with this key.
    pub fn sign_header(&self, header: &serde_json::Value, claims: &serde_json::Value) -> String {
        let input = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let key = EncodingKey::from_ec_der(&self.pkcs8);
        let sig = jsonwebtoken::crypto::sign(input.as_bytes(), &key, Algorithm::ES256).unwrap();
        format!("{input}.{sig}")
    }
}

/// A JWK set document of `keys`.
pub fn jwks(keys: &[&EsKey]) -> String {
    serde_json::json!({ "keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>() }).to_string()
}

/// An unsigned token (`alg: none`) of `claims`.
pub fn unsigned(claims: &serde_json::Value) -> String {
    let header = b64url(br#"{"alg":"none","typ":"JWT"}"#);
    format!("{header}.{}.", b64url(claims.to_string().as_bytes()))
}

/// An HS256 token of `claims` whose secret is `secret` (the classic attack signs with the
/// provider's public key as the HMAC secret), naming `kid`.
pub fn hmac_signed(secret: &[u8], kid: &str, claims: &serde_json::Value) -> String {
    let mut h = Header::new(Algorithm::HS256);
    h.kid = Some(kid.to_string());
    jsonwebtoken::encode(&h, claims, &EncodingKey::from_secret(secret)).unwrap()
}

/// Claims valid for an hour from now, for `iss`, `aud` and `sub`.
pub fn claims(iss: &str, aud: &str, sub: &str) -> serde_json::Value {
    let now = now();
    serde_json::json!({ "iss": iss, "aud": aud, "sub": sub, "iat": now, "exp": now + 3600 })
}

/// An Ed25519 key pair made in the test, with its `kid` (EdDSA tokens).
pub struct EdKey {
    /// The key id in tokens and the JWK set.
    pub kid: String,
    pkcs8: Vec<u8>,
    /// The raw public key.
    pub public: Vec<u8>,
}

impl EdKey {
    /// A new random key.
    pub fn generate(kid: &str) -> EdKey {
        use ring::signature::Ed25519KeyPair;
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let kp = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        EdKey {
            kid: kid.to_string(),
            pkcs8: pkcs8.as_ref().to_vec(),
            public: kp.public_key().as_ref().to_vec(),
        }
    }

    /// The public key as a JWK (`OKP`, `Ed25519`).
    pub fn jwk(&self) -> serde_json::Value {
        serde_json::json!({
            "kty": "OKP", "crv": "Ed25519", "use": "sig", "alg": "EdDSA", "kid": self.kid,
            "x": b64url(&self.public),
        })
    }

    /// An EdDSA token of `claims`, its header naming this key's `kid`.
    pub fn sign(&self, claims: &serde_json::Value) -> String {
        let mut h = Header::new(Algorithm::EdDSA);
        h.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&h, claims, &EncodingKey::from_ed_der(&self.pkcs8)).unwrap()
    }
}
