//! The sections of the edge stages that own their config (docs/config.md#stages): `stages:` on a
//! route and in `defaults`, a map from a stage's name to its section. This crate keeps each
//! section as it was written; the stage that owns it reads it into its own type when the gateway
//! is built (`fanout-edge`), so a new stage adds no field here. An unknown stage name, or a
//! section its stage does not accept, is a config error at its line then.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

/// `stages:`: each edge stage's section by the stage's name (`ip_filter: {…}`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct StageSections(pub IndexMap<String, serde_json::Value>);

impl StageSections {
    /// The section of stage `name`, if written.
    pub fn get(&self, name: &str) -> Option<&serde_json::Value> {
        self.0.get(name)
    }

    /// Whether no section is written.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl JsonSchema for StageSections {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "StageSections".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // Each registered stage's own schema is added where the registry is known (`fanout
        // schema`); here any section is an object.
        schemars::json_schema!({
            "type": "object",
            "description": "Each edge stage's section, by the stage's name (docs/config.md#stages).",
            "additionalProperties": { "type": "object" }
        })
    }
}
