//! The JSON Schemas are valid, match the committed snapshots in docs/, and every example config
//! validates against them (and loads).

use fanout_testkit::repo_root as root;
use std::path::{Path, PathBuf};

/// The committed schema `file` is this one (`UPDATE_SNAPSHOTS=1` rewrites it).
fn check_snapshot(file: &str, schema: &serde_json::Value) {
    let text = serde_json::to_string_pretty(schema).unwrap() + "\n";
    fanout_testkit::check_snapshot(file, &text, "cargo test -p fanout --test gateway schema::");
}

#[test]
fn schemas_are_valid_and_match_snapshots() {
    let gw = fanout_proxy::registry::schema();
    let stubs = fanout_stub::schema();
    jsonschema::meta::validate(&gw).expect("gateway schema is a valid JSON Schema");
    jsonschema::meta::validate(&stubs).expect("stub schema is a valid JSON Schema");
    check_snapshot("docs/config.schema.json", &gw);
    check_snapshot("docs/stubs.schema.json", &stubs);
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(p);
        }
    }
}

#[test]
fn every_example_config_validates() {
    let gw = jsonschema::validator_for(&fanout_proxy::registry::schema()).unwrap();
    let st = jsonschema::validator_for(&fanout_stub::schema()).unwrap();
    let mut files = Vec::new();
    yaml_files(&root().join("examples"), &mut files);
    yaml_files(&root().join("docs"), &mut files);
    let no_env = |_: &str| None;
    let mut checked = 0;
    for f in files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&f).unwrap();
        let display = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
        let substituted =
            fanout_config::substitute(&text, &no_env).unwrap_or_else(|e| panic!("{display}: {e}"));
        let value: serde_json::Value =
            serde_saphyr::from_str(&substituted).unwrap_or_else(|e| panic!("{display}: {e}"));
        if name.starts_with("stubs") {
            let errs: Vec<String> = st
                .iter_errors(&value)
                .map(|e| format!("{e} at {}", e.instance_path()))
                .collect();
            assert!(errs.is_empty(), "{display}: {errs:?}");
            // `.proto` files are found relative to the config's own directory.
            fanout_stub::load_in(&display, &text, &no_env, f.parent())
                .unwrap_or_else(|e| panic!("{e}"));
            checked += 1;
        } else if name.starts_with("fanout") {
            let errs: Vec<String> = gw
                .iter_errors(&value)
                .map(|e| format!("{e} at {}", e.instance_path()))
                .collect();
            assert!(errs.is_empty(), "{display}: {errs:?}");
            fanout::load_gateway(&f.display().to_string(), &text, &no_env)
                .unwrap_or_else(|e| panic!("{e}"));
            checked += 1;
        }
    }
    assert!(checked >= 4, "checked {checked} configs");
}

#[test]
fn cli_schema_and_validate_behave() {
    let bin = env!("CARGO_BIN_EXE_fanout");
    let out = std::process::Command::new(bin)
        .arg("schema")
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("fanout schema prints JSON");
    assert_eq!(printed, fanout_proxy::registry::schema());

    let ok = root().join("examples/product-page/fanout.yaml");
    let out = std::process::Command::new(bin)
        .arg("validate")
        .arg(&ok)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = std::env::temp_dir().join(format!("fanout-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        "routes:\n  - path: /a\n    respond: { body: '$nope' }\n",
    )
    .unwrap();
    let out = std::process::Command::new(bin)
        .arg("validate")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!("{}:3:23: ", bad.display())),
        "{stderr}"
    );
    assert!(stderr.contains("hint:"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
