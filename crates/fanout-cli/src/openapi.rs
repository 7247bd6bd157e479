//! `fanout openapi`: the OpenAPI 3.1 document of a config's routes (`fanout-openapi`), as JSON
//! or YAML (docs/openapi.md).

use fanout_config::{Config, ConfigErrors, VarLookup};

/// The document of the config in `path`, as text: JSON (pretty) or YAML. Errors: the config's
/// (every structural mistake, and a declared schema that does not load), with FILE:LINE:COL.
pub fn export(path: &str, vars: VarLookup<'_>, yaml: bool) -> Result<String, ConfigErrors> {
    let (cfg, errs) = Config::from_file_checked(path, vars)?;
    if !errs.is_empty() {
        return Err(ConfigErrors(errs));
    }
    let doc = fanout_openapi::document(&cfg).map_err(|mut e| {
        fanout_config::locate(&mut e, &cfg.source);
        ConfigErrors(e)
    })?;
    Ok(if yaml {
        serde_saphyr::to_string(&doc).unwrap_or_default()
    } else {
        let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
        s.push('\n');
        s
    })
}
