//! Every complete YAML example in the docs loads: blocks with a top-level `routes:` as gateway
//! configs, blocks with a top-level `services:` as stub configs. Fragments are not checked.
//! Examples with `protos: {include: [protos]}` load the grpc-gateway example's `.proto` files.

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
            let block = block.replace(
                "include: [protos]",
                &format!("include: [\"{}\"]", protos.display()),
            );
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
