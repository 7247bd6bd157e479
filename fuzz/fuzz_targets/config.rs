//! The config loader (`Config::from_yaml_checked`: what `fanout serve`, `validate` and a reload
//! read, without the file): any text is a config with its located errors or `ConfigErrors`,
//! never a panic, a hang or unbounded memory (YAML aliases included).

#![no_main]

use fanout_config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // every `${VAR}` is defined, as an address: the examples' configs name their backends so
    let vars = |_: &str| Some("127.0.0.1:9".to_string());
    let _ = Config::from_yaml_checked("fuzz.yaml", text, &vars);
});
