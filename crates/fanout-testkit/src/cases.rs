//! An example's `cases.yaml`: requests, the expected answers and backend calls per service.

use bytes::Bytes;
use http::Method;
use std::collections::BTreeMap;

/// The cases of one example.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cases {
    /// The cases, in file order.
    pub cases: Vec<Case>,
}

impl Cases {
    /// Parse a `cases.yaml` text; panics when it does not parse.
    pub fn parse(yaml: &str) -> Cases {
        serde_saphyr::from_str(yaml).expect("cases.yaml")
    }
}

/// One request and what the example must answer to it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// What the case shows.
    pub name: String,
    /// The request to send.
    pub request: CaseRequest,
    /// The expected status.
    pub status: u16,
    /// Headers the answer must have, with these values.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The expected JSON body.
    pub response: serde_json::Value,
    /// Requests each stub service must have received for this case.
    #[serde(default)]
    pub backend_calls: BTreeMap<String, u64>,
    /// Texts the gateway's log line for this request (found by its `x-request-id`) must contain:
    /// the detail the client does not see.
    #[serde(default)]
    pub log: Vec<String>,
}

/// The request of a [`Case`].
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseRequest {
    /// The method (default GET).
    #[serde(default = "default_method")]
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A JSON body, sent as compact text.
    pub body: Option<serde_json::Value>,
}

fn default_method() -> String {
    "GET".into()
}

impl CaseRequest {
    /// The method; panics when it is not a valid method.
    pub fn method(&self) -> Method {
        Method::from_bytes(self.method.as_bytes()).expect("method")
    }

    /// The body as sent: the JSON text, or empty.
    pub fn body_text(&self) -> Bytes {
        self.body
            .as_ref()
            .map(|b| Bytes::from(b.to_string()))
            .unwrap_or_default()
    }

    /// The headers as [`crate::send`] takes them.
    pub fn header_pairs(&self) -> Vec<(&str, &str)> {
        self.headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}
