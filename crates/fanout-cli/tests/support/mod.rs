//! The gateway half of the test harness: a real gateway from YAML text, started in this process
//! against running stubs. The rest (stubs, client, waits, logs) is `fanout_testkit`, which does
//! not depend on the gateway; this file is a module of every test binary that starts gateways.
#![allow(dead_code)]

use fanout::{RunningGateway, addr_var, load_gateway, start_gateway};
use fanout_stub::StubServer;
use std::collections::HashMap;

/// Variables pointing a gateway config at running stubs (`SEARCH_ADDR` → the search stub).
pub fn stub_vars(stubs: &StubServer) -> HashMap<String, String> {
    stubs
        .services()
        .into_iter()
        .map(|(n, a)| (addr_var(&n), a.to_string()))
        .collect()
}

/// Start a gateway from YAML text against running stubs, on an ephemeral port; panics (showing
/// the error) when the config does not load or the port cannot be bound.
pub async fn gateway(yaml: &str, stubs: &StubServer) -> RunningGateway {
    gateway_with(yaml, stubs, &[]).await
}

/// A loaded config from YAML text against running stubs (for reloads); panics on errors.
pub fn config(yaml: &str, stubs: &StubServer) -> fanout_config::Config {
    let vars = stub_vars(stubs);
    let lookup = |n: &str| vars.get(n).cloned();
    fanout_config::Config::from_yaml("fanout.yaml", yaml, &lookup)
        .unwrap_or_else(|e| panic!("gateway config:\n{e}"))
}

/// [`gateway`] with more variables than the stubs' addresses (e.g. `REDIS_URL`).
pub async fn gateway_with(
    yaml: &str,
    stubs: &StubServer,
    extra: &[(&str, String)],
) -> RunningGateway {
    let mut vars = stub_vars(stubs);
    vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let lookup = |n: &str| vars.get(n).cloned();
    let gw = load_gateway("fanout.yaml", yaml, &lookup)
        .unwrap_or_else(|e| panic!("gateway config:\n{e}"));
    start_gateway(gw, "127.0.0.1:0", Some("127.0.0.1:0"))
        .await
        .expect("bind gateway")
}

/// The first of `names` that runs (`NAME --version` succeeds); panics naming the Debian
/// `package` to install (`./scripts/test` installs it) when none does.
pub fn find_tool(names: &[&'static str], package: &str) -> &'static str {
    names
        .iter()
        .copied()
        .find(|b| {
            std::process::Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .unwrap_or_else(|| {
            panic!(
                "{} is needed: `apt-get install {package}` (./scripts/test installs it)",
                names.first().copied().unwrap_or("a tool")
            )
        })
}
