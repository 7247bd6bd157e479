//! Key material: a JWK set (inline or fetched), PEM public keys, or an HMAC secret, as the
//! decoding keys verification picks from by `kid` and `alg`.

use crate::error::KeysError;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk};
use jsonwebtoken::{Algorithm, DecodingKey};
use sha2::{Digest, Sha256};
use std::str::FromStr;

/// What identifies a key across loads of its set: a SHA-256 of its `kid` and its public
/// parameters (or the PEM block, or the HMAC secret). The verified-token cache keeps the id of
/// the key that verified each token, so a token is not taken from the cache once its key has
/// left the set (key removal is how an issuer revokes a leaked key).
pub(crate) type KeyId = [u8; 32];

fn key_id(kind: &[u8], kid: Option<&str>, material: &[u8]) -> KeyId {
    let mut h = Sha256::new();
    h.update(kind);
    h.update([0]);
    if let Some(k) = kid {
        h.update(k.as_bytes());
    }
    h.update([0]);
    h.update(material);
    h.finalize().into()
}

/// What kind of key an algorithm needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Hmac,
    Rsa,
    Ec,
    Ed,
}

/// The family of `alg` (RS and PS share RSA keys).
pub(crate) fn family(alg: Algorithm) -> Family {
    match alg {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => Family::Hmac,
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => Family::Rsa,
        Algorithm::ES256 | Algorithm::ES384 => Family::Ec,
        Algorithm::EdDSA => Family::Ed,
    }
}

/// One key.
pub(crate) struct Key {
    /// `kid`, when the set names it.
    pub(crate) kid: Option<String>,
    /// The one `alg` the key is for, when the set says.
    pub(crate) alg: Option<Algorithm>,
    pub(crate) family: Family,
    pub(crate) key: DecodingKey,
    /// The key's identity ([`KeyId`]).
    pub(crate) id: KeyId,
}

/// The keys of a provider at one moment.
pub(crate) struct KeySet {
    pub(crate) keys: Vec<Key>,
    /// Keys of the document that were not taken (unsupported, HMAC in a public set, bad).
    pub(crate) skipped: usize,
}

/// Which keys may verify a token.
pub(crate) enum Lookup<'a> {
    /// These (one with a `kid`; every key of the alg's family without one).
    Found(Vec<&'a Key>),
    /// The token names a `kid` the set does not have.
    UnknownKid,
    /// No key of the token's alg.
    NoKey,
}

impl KeySet {
    /// An HMAC provider's one key.
    pub(crate) fn hmac(secret: &[u8]) -> KeySet {
        KeySet {
            keys: vec![Key {
                kid: None,
                alg: None,
                family: Family::Hmac,
                key: DecodingKey::from_secret(secret),
                id: key_id(b"hmac", None, secret),
            }],
            skipped: 0,
        }
    }

    /// Inline `keys:`: a JWK set when it looks like JSON, else PEM blocks.
    pub(crate) fn inline(text: &str) -> Result<KeySet, KeysError> {
        if text.trim_start().starts_with('{') {
            KeySet::from_jwks(text.as_bytes())
        } else {
            KeySet::from_pem(text)
        }
    }

    /// A JWK set document. Keys that are not public signing keys of a supported type are
    /// skipped (an `oct` key never verifies anything here: HMAC needs an explicit secret); a
    /// set with no usable key is an error.
    pub(crate) fn from_jwks(doc: &[u8]) -> Result<KeySet, KeysError> {
        #[derive(serde::Deserialize)]
        struct Doc {
            keys: Vec<serde_json::Value>,
        }
        let doc: Doc =
            serde_json::from_slice(doc).map_err(|e| KeysError::NotJwks(e.to_string()))?;
        let mut keys = Vec::with_capacity(doc.keys.len());
        let mut skipped = 0;
        for v in doc.keys {
            match public_key(v) {
                Some(k) => keys.push(k),
                None => skipped += 1,
            }
        }
        if keys.is_empty() {
            return Err(KeysError::NoKeys { skipped });
        }
        Ok(KeySet { keys, skipped })
    }

    /// One or more PEM public keys (RSA, EC or Ed25519; `-----BEGIN PUBLIC KEY-----` or
    /// `-----BEGIN RSA PUBLIC KEY-----`).
    pub(crate) fn from_pem(text: &str) -> Result<KeySet, KeysError> {
        let mut keys = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find("-----BEGIN ") {
            let block = &rest[start..];
            let Some(end_marker) = block.find("-----END ") else {
                break;
            };
            let end = block[end_marker..]
                .find("\n")
                .map_or(block.len(), |n| end_marker + n);
            let pem = &block[..end];
            let index = keys.len() + 1;
            let (family, key) = if let Ok(k) = DecodingKey::from_rsa_pem(pem.as_bytes()) {
                (Family::Rsa, k)
            } else if let Ok(k) = DecodingKey::from_ec_pem(pem.as_bytes()) {
                (Family::Ec, k)
            } else {
                match DecodingKey::from_ed_pem(pem.as_bytes()) {
                    Ok(k) => (Family::Ed, k),
                    Err(e) => {
                        return Err(KeysError::BadPem {
                            index,
                            why: e.to_string(),
                        });
                    }
                }
            };
            keys.push(Key {
                kid: None,
                alg: None,
                family,
                key,
                id: key_id(b"pem", None, pem.trim().as_bytes()),
            });
            rest = &block[end..];
        }
        if keys.is_empty() {
            return Err(KeysError::NoKeys { skipped: 0 });
        }
        Ok(KeySet { keys, skipped: 0 })
    }

    /// Whether the key of identity `id` is in this set.
    pub(crate) fn has(&self, id: &KeyId) -> bool {
        self.keys.iter().any(|k| k.id == *id)
    }

    /// The keys that may verify a token of `alg` naming `kid`.
    pub(crate) fn find(&self, kid: Option<&str>, alg: Algorithm) -> Lookup<'_> {
        let fits = |k: &&Key| k.family == family(alg) && k.alg.is_none_or(|a| a == alg);
        match kid {
            Some(kid) => {
                let named: Vec<&Key> = self
                    .keys
                    .iter()
                    .filter(|k| k.kid.as_deref() == Some(kid))
                    .collect();
                if named.is_empty() {
                    // Keys without a `kid` (PEM, an HMAC secret) are tried for any `kid`.
                    let anonymous: Vec<&Key> = self
                        .keys
                        .iter()
                        .filter(|k| k.kid.is_none())
                        .filter(fits)
                        .collect();
                    if anonymous.is_empty() {
                        return Lookup::UnknownKid;
                    }
                    return Lookup::Found(anonymous);
                }
                let found: Vec<&Key> = named.into_iter().filter(fits).collect();
                if found.is_empty() {
                    Lookup::NoKey
                } else {
                    Lookup::Found(found)
                }
            }
            None => {
                let found: Vec<&Key> = self.keys.iter().filter(fits).collect();
                if found.is_empty() {
                    Lookup::NoKey
                } else {
                    Lookup::Found(found)
                }
            }
        }
    }
}

/// One JWK as a public verification key, or `None` (skipped).
fn public_key(v: serde_json::Value) -> Option<Key> {
    // A key for encryption only is not a signing key.
    if v.get("use")
        .and_then(|u| u.as_str())
        .is_some_and(|u| u != "sig")
    {
        return None;
    }
    let jwk: Jwk = serde_json::from_value(v).ok()?;
    let family = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Family::Rsa,
        AlgorithmParameters::EllipticCurve(_) => Family::Ec,
        AlgorithmParameters::OctetKeyPair(_) => Family::Ed,
        // Never from a key set: HMAC only with an explicit `hmac_secret`.
        AlgorithmParameters::OctetKey(_) => return None,
    };
    let alg = match &jwk.common.key_algorithm {
        Some(a) => Some(Algorithm::from_str(&a.to_string()).ok()?),
        None => None,
    };
    if alg.is_some_and(|a| self::family(a) != family) {
        return None;
    }
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    let material = serde_json::to_vec(&jwk.algorithm).ok()?;
    Some(Key {
        id: key_id(b"jwk", jwk.common.key_id.as_deref(), &material),
        kid: jwk.common.key_id.clone(),
        alg,
        family,
        key,
    })
}
