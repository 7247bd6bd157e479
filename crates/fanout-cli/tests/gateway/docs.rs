//! Every complete YAML example in the docs loads: blocks with a top-level `routes:` as gateway
//! configs, blocks with a top-level `services:` as stub configs. Fragments are not checked.
//! Examples with `protos: {include: [protos]}` load the grpc-gateway example's `.proto` files,
//! those with `models: {dir: ./models}` the antispam example's models.

use std::path::Path;

fn yaml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match &mut current {
            None if line.trim_start() == "```yaml" => current = Some((i + 2, String::new())),
            Some(_) if line.trim_start() == "```" => out.extend(current.take()),
            Some((_, buf)) => {
                buf.push_str(line);
                buf.push('\n');
            }
            None => {}
        }
    }
    out
}

#[test]
fn doc_examples_load() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            files.push(e.path());
        }
    }
    let no_env = |_: &str| None;
    let mut checked = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let protos = root.join("examples/grpc-gateway/protos");
        for (line, block) in yaml_blocks(&text) {
            let at = format!("{name}:{line}");
            let models = root.join("examples/antispam/models");
            let block = block
                .replace(
                    "include: [protos]",
                    &format!("include: [\"{}\"]", protos.display()),
                )
                .replace("dir: ./models", &format!("dir: \"{}\"", models.display()));
            if block.lines().any(|l| l.starts_with("routes:")) {
                fanout::load_gateway(&at, &block, &no_env).unwrap_or_else(|e| panic!("{at}:\n{e}"));
                checked += 1;
            } else if block.lines().any(|l| l.starts_with("services:")) {
                fanout_stub::load(&at, &block, &no_env).unwrap_or_else(|e| panic!("{at}:\n{e}"));
                checked += 1;
            }
        }
    }
    assert!(checked >= 5, "only {checked} doc examples found");
}

/// The README's status list against what the code has (README.md, "Status"):
/// - every "Not yet" item is a bullet; an item whose title names a feature that exists (its
///   evidence below: a schema property, a CLI command or flag) fails, as does a backticked name in
///   an item that the config schema or the CLI has (`sql:` is fine until a step kind `sql` exists);
/// - every step kind of the schema is named in "What works today", and every command and every
///   `serve` flag of the CLI is in the commands table.
#[test]
fn readme_status_is_honest() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let status = &readme[readme
        .find("\n## Status")
        .expect("README has a `## Status` section")..];
    let (works, rest) = status
        .split_once("\nNot yet")
        .expect("the status section has a `Not yet` list");
    let not_yet = rest.split("\n## ").next().unwrap_or(rest);
    let not_yet = not_yet.split("\nA test (").next().unwrap_or(not_yet);

    // What exists: every property name of the config schema, the step kinds, the CLI's commands and
    // flags.
    let schema = fanout_proxy::registry::schema();
    let mut props = std::collections::BTreeSet::new();
    collect_properties(&schema, &mut props);
    let step_kinds: Vec<String> = ["http", "grpc", "value", "fail", "sql", "model"]
        .into_iter()
        .filter(|k| schema["$defs"]["Step"]["properties"].get(*k).is_some())
        .map(String::from)
        .collect();
    let help = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let commands: Vec<String> = help(&[])
        .split("Commands:")
        .nth(1)
        .unwrap()
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect();
    assert!(commands.len() >= 8, "commands from --help: {commands:?}");
    let flags = |cmd: &str| -> Vec<String> {
        help(&[cmd])
            .split_whitespace()
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(|w| w.trim_end_matches([',', '.', ')']).to_string())
            .filter(|w| !["--help", "--version", "--log-format"].contains(&w.as_str()))
            .collect()
    };
    let serve_flags = flags("serve");
    let all_flags: std::collections::BTreeSet<String> =
        commands.iter().flat_map(|c| flags(c)).collect();
    let exists = |name: &str| {
        let n = name.trim_end_matches(':').trim_start_matches("--");
        props.contains(n)
            || commands.iter().any(|c| c == n)
            || all_flags.contains(&format!("--{n}"))
    };

    // Feature titles: a pattern over an item's title, and the thing whose existence proves it.
    type Feature<'a> = (&'a str, &'a dyn Fn(&str) -> bool, bool);
    let features: [Feature; 11] = [
        (
            "grpc",
            &|t| t == "grpc" || t == "grpc steps" || t == "grpc routes",
            props.contains("grpc"),
        ),
        (
            "reload",
            &|t| t.contains("reload"),
            serve_flags.iter().any(|f| f == "--watch"),
        ),
        (
            "traces",
            &|t| t.contains("trace") || t.contains("tracing") || t.contains("opentelemetry"),
            props.contains("tracing"),
        ),
        (
            "metrics",
            &|t| t.contains("metrics") || t.contains("prometheus"),
            commands.iter().any(|c| c == "serve") && props.contains("admin"),
        ),
        ("redis", &|t| t.contains("redis"), props.contains("redis")),
        (
            "tls",
            &|t| t.split_whitespace().any(|w| w == "tls" || w == "https"),
            props.contains("tls"),
        ),
        (
            "explain",
            &|t| t.contains("explain"),
            commands.iter().any(|c| c == "explain"),
        ),
        (
            "postgres",
            &|t| t.contains("postgres") || t.contains("sql") || t.contains("database"),
            step_kinds.iter().any(|k| k == "sql"),
        ),
        (
            "models",
            &|t| t.contains("model"),
            step_kinds.iter().any(|k| k == "model"),
        ),
        (
            "coalescing",
            &|t| t.contains("coalesc"),
            props.contains("coalesce"),
        ),
        ("hedging", &|t| t.contains("hedg"), props.contains("hedge")),
    ];

    let mut wrong = Vec::new();
    for line in not_yet.lines().skip(1) {
        // a bullet, its indented continuation, or a blank line
        if !(line.trim().is_empty() || line.starts_with("- ") || line.starts_with("  ")) {
            wrong.push(format!(
                "`{line}`: write each missing feature as a `- **title** …` bullet"
            ));
        }
    }
    let mut items: Vec<String> = not_yet
        .split("\n- ")
        .skip(1)
        .map(|i| i.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    // a stray line is checked as a whole (its every part is a title)
    items.extend(
        not_yet
            .lines()
            .skip(1)
            .filter(|l| !(l.trim().is_empty() || l.starts_with("- ") || l.starts_with("  ")))
            .map(|l| l.trim_start_matches("Not yet:").to_string()),
    );
    assert!(!items.is_empty(), "no `- ` items under `Not yet`");
    for item in &items {
        let title = item
            .strip_prefix("**")
            .and_then(|t| t.split_once("**"))
            .map_or(item.as_str(), |(t, _)| t)
            .to_lowercase()
            .replace(['.', '(', ')', '`'], " ");
        for part in title.split([',', ';']).flat_map(|p| p.split(" and ")) {
            let part = part.trim().trim_end_matches(" steps").trim();
            for (name, matches, present) in &features {
                if *present && matches(part) {
                    wrong.push(format!("`{item}` says {name} is missing, but it exists"));
                }
            }
        }
        for name in item.split('`').skip(1).step_by(2) {
            if exists(name) {
                wrong.push(format!(
                    "`{item}` names `{name}`, which the config schema or the CLI has"
                ));
            }
        }
    }
    for kind in &step_kinds {
        if !works.contains(&format!("`{kind}`")) {
            wrong.push(format!(
                "step kind `{kind}` is not named under \"What works today\""
            ));
        }
    }
    let table = &readme[readme
        .find("| command |")
        .expect("README has a commands table")..];
    let table = table.split("\n\n").next().unwrap_or(table);
    for c in &commands {
        if !table.contains(&format!("`fanout {c}")) {
            wrong.push(format!("command `{c}` is missing from the commands table"));
        }
    }
    for f in &serve_flags {
        if !table.contains(f.as_str()) {
            wrong.push(format!("`serve {f}` is missing from the commands table"));
        }
    }
    assert!(
        wrong.is_empty(),
        "README.md's status is not honest:\n{}",
        wrong.join("\n")
    );
}

fn collect_properties(v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            if let Some(serde_json::Value::Object(p)) = m.get("properties") {
                out.extend(p.keys().cloned());
            }
            m.values().for_each(|x| collect_properties(x, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect_properties(x, out)),
        _ => {}
    }
}

/// docs/config.md's status endpoint table lists every top-level key `/__fanout/status` has (and
/// no other), and every key of the objects it describes inline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_table_lists_every_key() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = std::fs::read_to_string(root.join("docs/config.md")).unwrap();
    let section = &doc[doc.find("## Status endpoint").unwrap()..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let rows: std::collections::BTreeMap<String, String> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| {
            let key = l.split('`').nth(1)?;
            Some((key.to_string(), l.to_string()))
        })
        .collect();
    let no_env = |_: &str| None;
    let gw = fanout::load_gateway(
        "f.yaml",
        "routes:\n  - path: /a\n    respond: { body: '1' }\n",
        &no_env,
    )
    .unwrap();
    // a running gateway: its watchdog fills `runtime`
    let running = fanout::start_gateway(gw, "127.0.0.1:0", None)
        .await
        .unwrap();
    let status = running.gateway.status_json();
    let keys: std::collections::BTreeSet<String> =
        status.as_object().unwrap().keys().cloned().collect();
    let listed: std::collections::BTreeSet<String> = rows.keys().cloned().collect();
    assert_eq!(keys, listed, "status keys vs docs/config.md's table");
    for (key, inner) in [
        ("runtime", &status["runtime"]),
        ("config", &status["config"]),
    ] {
        let inner = inner
            .as_object()
            .unwrap_or_else(|| panic!("`{key}` is {inner}"));
        for k in inner.keys() {
            assert!(
                rows[key].contains(k.as_str()),
                "`{key}.{k}` is not described in docs/config.md's status table"
            );
        }
    }
}
