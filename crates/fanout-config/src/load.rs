//! Loading: `${VAR}` substitution, strict YAML deserialization, bounded file reads, the schema.

use crate::{Config, ConfigError, ConfigErrors, Pos, hints, substitute};
use serde::Deserialize;

/// Looks up `${NAME}` values; the process environment by default.
pub type VarLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment as a [`VarLookup`].
pub fn env_lookup(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Substitute `${VARS}` and deserialize YAML into `T`, strictly. `file` names the source in errors.
pub fn from_yaml<T: for<'de> Deserialize<'de>>(
    file: &str,
    text: &str,
    vars: VarLookup<'_>,
) -> Result<T, ConfigError> {
    let text = substitute(text, vars).map_err(|e| e.in_file(file))?;
    let opts = serde_saphyr::options! {
        duplicate_keys: serde_saphyr::options::DuplicateKeyPolicy::Error,
    };
    serde_saphyr::from_str_with_options(&text, opts).map_err(|e| yaml_error(file, &e))
}

/// [`from_yaml`], reporting every unknown field of the file at once (not only the first, where
/// strict deserialization stops), each with its position and did-you-mean hint.
pub fn from_yaml_all<T: for<'de> Deserialize<'de> + schemars::JsonSchema>(
    file: &str,
    text: &str,
    vars: VarLookup<'_>,
) -> Result<T, ConfigErrors> {
    let first = match from_yaml(file, text, vars) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    if !first.message.starts_with("unknown field") {
        return Err(first.into());
    }
    let Ok(text) = substitute(text, vars) else {
        return Err(first.into());
    };
    let schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default();
    let all = crate::unknown::unknown_fields(&text, &schema);
    // used only when the walk agrees with the deserializer on the first one
    if !all.iter().any(|u| u.pos == first.pos) {
        return Err(first.into());
    }
    Err(ConfigErrors(
        all.into_iter()
            .map(|u| {
                let message = hints::polish_yaml_message(u.message);
                ConfigError {
                    path: None,
                    file: file.to_string(),
                    pos: u.pos,
                    hint: Some(hints::yaml_hint(&message)),
                    message,
                }
            })
            .collect(),
    ))
}

fn yaml_error(file: &str, e: &serde_saphyr::Error) -> ConfigError {
    let pos = e.location().and_then(Pos::from_location);
    let full = e.to_string();
    // The library renders a snippet after the first line; we print our own position.
    let first = full.lines().next().unwrap_or("invalid YAML").trim();
    let message = hints::polish_yaml_message(strip_location_suffix(first));
    let hint = Some(hints::yaml_hint(&message));
    ConfigError {
        path: None,
        file: file.to_string(),
        pos,
        message,
        hint,
    }
}

fn strip_location_suffix(s: &str) -> String {
    // serde-saphyr renders "error: line X column Y: message"; we print our own position.
    let mut m = s.strip_prefix("error: ").unwrap_or(s);
    if let Some(rest) = m.strip_prefix("line ")
        && let Some(i) = rest.find(": ")
    {
        m = &rest[i + 2..];
    }
    let m = m
        .trim_end_matches(", set DuplicateKeyPolicy in Options if acceptable")
        .replace("expected sequence start", "expected a list here")
        .replace(
            "expected mapping start",
            "expected a mapping (key: value) here",
        );
    match m.rfind(" at line ") {
        Some(i) => m[..i].to_string(),
        None => m,
    }
}

/// Largest config file read, in bytes (16 MiB): a config is text written by people.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Largest CA bundle read for `tls.ca_file`, in bytes (1 MiB; a full public root bundle is ~250 KiB).
pub const MAX_CA_FILE_BYTES: u64 = 1 << 20;

/// Read a file the config names, refusing anything that is not a regular file (a FIFO would
/// block, `/dev/zero` never ends) and anything larger than `max` bytes.
pub fn read_limited(path: &str, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    // Checked before opening: opening a FIFO for reading blocks until a writer appears.
    if !std::fs::metadata(path)?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    if meta.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "file of {} bytes is larger than the limit of {max} bytes",
                meta.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("file is larger than the limit of {max} bytes"),
        ));
    }
    Ok(out)
}

impl Config {
    /// Load a gateway config from YAML text (with `${VAR}` substitution) and run the structural
    /// checks. Flow-level checks (expressions, references, cycles) happen in the flow compiler.
    pub fn from_yaml(file: &str, text: &str, vars: VarLookup<'_>) -> Result<Config, ConfigErrors> {
        let (cfg, errs) = Config::from_yaml_checked(file, text, vars)?;
        if errs.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigErrors(errs))
        }
    }

    /// [`Config::from_yaml`] that keeps going past the structural checks: the config as read
    /// and the checks' errors (located, in the file), so a caller can add the errors of the
    /// parts built from it (`fanout validate` prints every error at once). `Err` when the text
    /// does not read as a config at all.
    pub fn from_yaml_checked(
        file: &str,
        text: &str,
        vars: VarLookup<'_>,
    ) -> Result<(Config, Vec<ConfigError>), ConfigErrors> {
        let mut cfg: Config = from_yaml_all(file, text, vars)?;
        cfg.source = substitute(text, vars).map_err(|e| e.in_file(file))?;
        cfg.file = file.to_string();
        let mut errs = Vec::new();
        cfg.normalize_grpc_routes(&mut errs);
        crate::graphql::normalize_routes(&mut cfg, &mut errs);
        cfg.check(&mut errs);
        crate::locate(&mut errs, &cfg.source);
        let errs = errs.into_iter().map(|e| e.in_file(file)).collect();
        Ok((cfg, errs))
    }

    /// Read a config file (at most [`MAX_CONFIG_BYTES`]) as [`Config::from_yaml_checked`] does.
    pub fn from_file_checked(
        path: &str,
        vars: VarLookup<'_>,
    ) -> Result<(Config, Vec<ConfigError>), ConfigErrors> {
        Config::from_yaml_checked(path, &read_config_text(path)?, vars)
    }

    /// Read and load a config file (at most [`MAX_CONFIG_BYTES`]).
    pub fn from_file(path: &str, vars: VarLookup<'_>) -> Result<Config, ConfigErrors> {
        Config::from_yaml(path, &read_config_text(path)?, vars)
    }
}

/// A config file's text (at most [`MAX_CONFIG_BYTES`] of UTF-8).
fn read_config_text(path: &str) -> Result<String, ConfigError> {
    {
        let text = read_limited(path, MAX_CONFIG_BYTES)
            .and_then(|b| {
                String::from_utf8(b).map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text")
                })
            })
            .map_err(|e| ConfigError {
                path: None,
                file: path.to_string(),
                pos: None,
                message: format!("cannot read config: {e}"),
                hint: Some(match e.kind() {
                    std::io::ErrorKind::InvalidData => {
                        "a config is UTF-8 text of at most 16 MiB".into()
                    }
                    std::io::ErrorKind::InvalidInput => "pass the path of a regular file".into(),
                    _ => format!("check that the file exists and is readable: {path}"),
                }),
            })?;
        Ok(text)
    }
}

/// The JSON Schema of [`Config`] (what `fanout schema` prints).
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Config)).unwrap_or_default()
}
