//! Stubs from YAML text, started in this process on ephemeral ports.

use fanout_stub::{CompiledStubs, StubServer};

/// A variable lookup that knows no variable (`${VAR:-default}` takes its default).
pub fn no_vars(_: &str) -> Option<String> {
    None
}

/// Load stubs from YAML text without variables; panics (showing the error) when it does not load.
pub fn load_stubs(yaml: &str) -> CompiledStubs {
    match fanout_stub::load("stubs.yaml", yaml, &no_vars) {
        Ok(c) => c,
        Err(e) => panic!("config should load:\n{e}"),
    }
}

/// Start stubs from YAML text without variables (addresses are written in the text).
pub async fn start_stubs(yaml: &str) -> StubServer {
    load_stubs(yaml).start().await.expect("stub starts")
}

/// Start stubs from YAML text; every `*_ADDR` variable becomes an ephemeral port.
pub async fn stubs(yaml: &str) -> StubServer {
    let any = |n: &str| n.ends_with("_ADDR").then(|| "127.0.0.1:0".to_string());
    fanout_stub::load("stubs.yaml", yaml, &any)
        .unwrap_or_else(|e| panic!("stub config: {e}"))
        .start()
        .await
        .unwrap_or_else(|e| panic!("stub start: {e}"))
}

/// Total requests a stub service received (all routes; 0 for an unknown service).
pub fn calls(stubs: &StubServer, service: &str) -> u64 {
    stubs
        .stats(service)
        .map(|s| s.routes.values().map(|r| r.requests).sum())
        .unwrap_or(0)
}

/// Requests one route of a stub service received (`route` as in its stats: `GET /items`; 0 for
/// an unknown service or route).
pub fn route_calls(stubs: &StubServer, service: &str, route: &str) -> u64 {
    stubs
        .stats(service)
        .and_then(|s| s.routes.get(route).map(|r| r.requests))
        .unwrap_or(0)
}
