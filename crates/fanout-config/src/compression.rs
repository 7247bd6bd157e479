//! HTTP compression (`compression:`; docs/config.md#compression): answers encoded by what the
//! client accepts, request bodies with a `Content-Encoding` decoded (under the decoded-size
//! limit), and — per backend, `accept_encoding` — compressed backend answers. Off unless set.

use crate::ConfigError;
use schemars::JsonSchema;
use serde::Deserialize;

/// A content coding fanout encodes and decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ContentCoding {
    /// `zstd` (RFC 8878; windows up to 8 MiB, RFC 9659).
    Zstd,
    /// `br` (brotli).
    Br,
    /// `gzip`.
    Gzip,
}

/// `compression:` at the top level.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Compression {
    /// The answers to clients.
    pub response: ResponseCompression,
    /// The request bodies of clients.
    pub request: RequestCompression,
}

/// How answers are compressed (`compression.response`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ResponseCompression {
    /// Compress answers by the client's `Accept-Encoding`. Default false.
    pub enabled: bool,
    /// The codings offered, most preferred first (the server's choice when the client weighs
    /// several equally). Default `[zstd, br, gzip]`.
    pub algorithms: Vec<ContentCoding>,
    /// Answers smaller than this many bytes are sent as they are. Default 1024.
    pub min_bytes: usize,
    /// The media types compressed (`Content-Type` without parameters, compared without case);
    /// `type/*` matches a whole type, `*+json` a structured-syntax suffix. Default:
    /// `application/json`, `*+json`, `text/*`, `application/javascript`, `application/xml`,
    /// `*+xml`, `image/svg+xml`, `application/x-ndjson`.
    pub content_types: Vec<String>,
    /// The level of each coding: gzip 1–9 (default 1), br 0–11 (default 3), zstd 1–19
    /// (default 1). Low levels: most of the size saving for a fraction of the CPU.
    pub levels: Levels,
    /// Answers larger than this many bytes are encoded on the compute pool, so an I/O worker
    /// never stalls on a large answer; smaller ones inline. Default 65536.
    pub compute_above_bytes: usize,
}

impl Default for ResponseCompression {
    fn default() -> Self {
        ResponseCompression {
            enabled: false,
            algorithms: vec![ContentCoding::Zstd, ContentCoding::Br, ContentCoding::Gzip],
            min_bytes: 1024,
            content_types: [
                "application/json",
                "*+json",
                "text/*",
                "application/javascript",
                "application/xml",
                "*+xml",
                "image/svg+xml",
                "application/x-ndjson",
            ]
            .map(String::from)
            .to_vec(),
            levels: Levels::default(),
            compute_above_bytes: 64 * 1024,
        }
    }
}

/// The level of each coding (`compression.response.levels`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Levels {
    /// gzip, 1–9. Default 1.
    pub gzip: i32,
    /// brotli, 0–11. Default 3.
    pub br: i32,
    /// zstd, 1–19. Default 1.
    pub zstd: i32,
}

impl Default for Levels {
    fn default() -> Self {
        Levels {
            gzip: 1,
            br: 3,
            zstd: 1,
        }
    }
}

/// Request bodies with a `Content-Encoding` (`compression.request`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RequestCompression {
    /// The codings accepted and decoded; a body in any other (or any coding when empty) is
    /// refused with 415 `unsupported_encoding`. `server.bodies.max_bytes` (and the route's
    /// limit) apply to the decoded size: a body that decodes past it is refused with 413
    /// `body_too_large`, decoding stopped there. Default: none.
    pub decode: Vec<ContentCoding>,
}

/// A route's (or the defaults') `compression`: `off` sends its answers as they are, whatever
/// the client accepts — for answers that mix secrets with what the request reflects (the
/// BREACH class of attacks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RouteCompression {
    /// Compress as `compression.response` says (the default).
    On,
    /// Never compress this route's answers.
    Off,
}

impl Compression {
    /// Load-time checks: levels within their ranges, no coding listed twice.
    pub(crate) fn check(&self, errs: &mut Vec<ConfigError>) {
        let l = &self.response.levels;
        // The ranges fanout-compress accepts (`Coding::levels`).
        for (name, level, min, max) in [
            ("gzip", l.gzip, 1, 9),
            ("br", l.br, 0, 11),
            ("zstd", l.zstd, 1, 19),
        ] {
            if !(min..=max).contains(&level) {
                errs.push(
                    ConfigError::at_path(
                        format!("compression.response.levels.{name}"),
                        format!("`compression.response.levels.{name}` is {level}, outside {min}..={max}"),
                    )
                    .hint("low levels (gzip 1–4, br 3–4, zstd 1–3) keep most of the saving for a fraction of the CPU"),
                );
            }
        }
        for (what, list) in [
            ("compression.response.algorithms", &self.response.algorithms),
            ("compression.request.decode", &self.request.decode),
        ] {
            for (i, c) in list.iter().enumerate() {
                if list.get(..i).is_some_and(|before| before.contains(c)) {
                    errs.push(ConfigError::at_path(
                        format!("{what}[{i}]"),
                        format!("`{what}` lists {c:?} twice"),
                    ));
                }
            }
        }
        if self.response.enabled && self.response.algorithms.is_empty() {
            errs.push(
                ConfigError::at_path(
                    "compression.response.algorithms",
                    "`compression.response.algorithms` is empty: no answer could be compressed",
                )
                .hint("list e.g. `[zstd, br, gzip]`, or set `enabled: false`"),
            );
        }
        for (i, t) in self.response.content_types.iter().enumerate() {
            if !t.contains('/') && !t.starts_with("*+") {
                errs.push(
                    ConfigError::at_path(
                        format!("compression.response.content_types[{i}]"),
                        format!(
                            "`compression.response.content_types` entry `{t}` is not a media type"
                        ),
                    )
                    .hint("write `type/subtype`, `type/*` or `*+suffix`, e.g. `application/json`"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;

    fn load(yaml: &str) -> Result<Config, String> {
        let full = format!("{yaml}\nroutes: []\n");
        Config::from_yaml("fanout.yaml", &full, &|_: &str| None).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_off_with_low_levels() {
        let c = load("").unwrap();
        let r = &c.compression.response;
        assert!(!r.enabled);
        assert_eq!((r.levels.gzip, r.levels.br, r.levels.zstd), (1, 3, 1));
        assert_eq!(r.min_bytes, 1024);
        assert!(c.compression.request.decode.is_empty());
    }

    #[test]
    fn bad_settings_are_refused_at_load() {
        for (yaml, says) in [
            (
                "compression: {response: {levels: {gzip: 0}}}",
                "levels.gzip` is 0",
            ),
            ("compression: {response: {levels: {br: 12}}}", "levels.br"),
            (
                "compression: {response: {levels: {zstd: 22}}}",
                "levels.zstd",
            ),
            (
                "compression: {response: {algorithms: [gzip, gzip]}}",
                "twice",
            ),
            (
                "compression: {response: {enabled: true, algorithms: []}}",
                "is empty",
            ),
            (
                "compression: {response: {content_types: [json]}}",
                "not a media type",
            ),
            ("compression: {request: {decode: [deflate]}}", "deflate"),
        ] {
            let e = load(yaml).expect_err(yaml);
            assert!(e.contains(says), "{yaml}: {e}");
        }
        assert!(load("compression: {response: {levels: {gzip: 9, br: 11, zstd: 19}}}").is_ok());
    }
}
