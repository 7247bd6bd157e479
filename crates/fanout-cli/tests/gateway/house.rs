//! House rules a reader relies on, checked on the source tree (docs/ARCHITECTURE.md, "Code map").

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A file's module path inside its crate (`src/exec/mod.rs` → `["exec"]`, `src/lib.rs` → `[]`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The non-test code of a file, without line comments.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The module paths `code` names after `prefix::` (`crate::a::b::C` → `[a, b, C]`), including
/// the first segment of each item of a `crate::{a::b, c}` group. A `prefix` that continues a
/// path (`x::prefix::`, `xprefix::`) is not one.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| is_ident(c) || c == ':') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let first: String = item.trim().chars().take_while(|c| is_ident(*c)).collect();
                if !first.is_empty() {
                    out.push(vec![first]);
                }
            }
            continue;
        }
        let mut segs = Vec::new();
        let mut s = rest;
        loop {
            let seg: String = s.chars().take_while(|c| is_ident(*c)).collect();
            if seg.is_empty() {
                break;
            }
            s = &s[seg.len()..];
            segs.push(seg);
            match s.strip_prefix("::") {
                Some(t) if t.starts_with(|c: char| is_ident(c)) => s = t,
                _ => break,
            }
        }
        if !segs.is_empty() {
            out.push(segs);
        }
    }
    out
}

/// The child modules a file declares in its own files (`mod name;`, `pub(crate) mod name;`): its
/// code names them by relative paths (`name::item`).
fn child_modules(code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|line| {
            let mut l = line.trim();
            if let Some(rest) = l.strip_prefix("pub") {
                l = match rest.strip_prefix('(') {
                    Some(vis) => &vis[vis.find(')')? + 1..],
                    None => rest,
                };
            }
            let name = l
                .trim_start()
                .strip_prefix("mod ")?
                .trim()
                .strip_suffix(';')?;
            name.chars()
                .all(is_ident)
                .then(|| name.trim_start_matches("r#").to_string())
        })
        .collect()
}

/// Cycles of imports across the files of one crate: strongly connected components of more than
/// one file, an edge from each file to every module its code names (`crate::m`, `super::m`,
/// `self::m`, and `m::…` where `m` is a child module it declares), a module's own ancestors
/// excepted.
fn file_cycles(src: &Path) -> Vec<Vec<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> =
        files.into_iter().map(|f| (module_of(src, &f), f)).collect();
    let mut edges: BTreeMap<&Vec<String>, BTreeSet<&Vec<String>>> = BTreeMap::new();
    for (m, file) in &modules {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let mut targets = Vec::new();
        for p in paths_after(&code, "crate::") {
            targets.push(p);
        }
        for p in paths_after(&code, "super::") {
            // `super` of `a/b.rs` and of `a/b/mod.rs` (module `a::b`) is `a`; each further
            // `super::` one more level up.
            let up = 1 + p.iter().take_while(|s| *s == "super").count();
            let mut full = m[..m.len().saturating_sub(up)].to_vec();
            full.extend(p.into_iter().skip(up - 1));
            targets.push(full);
        }
        for p in paths_after(&code, "self::") {
            let mut full = m.clone();
            full.extend(p);
            targets.push(full);
        }
        for child in child_modules(&code) {
            for p in paths_after(&code, &format!("{child}::")) {
                let mut full = m.clone();
                full.push(child.clone());
                full.extend(p);
                targets.push(full);
            }
        }
        let out = edges.entry(m).or_default();
        for t in targets {
            // The longest prefix that is a file of this crate.
            let found = (1..=t.len())
                .rev()
                .find_map(|k| modules.get_key_value(&t[..k]).map(|(key, _)| key));
            if let Some(target) = found
                && target != m
                && !m.starts_with(target)
            {
                out.insert(target);
            }
        }
    }
    // Tarjan's strongly connected components.
    struct State<'a> {
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(
        v: &'a Vec<String>,
        edges: &BTreeMap<&'a Vec<String>, BTreeSet<&'a Vec<String>>>,
        st: &mut State<'a>,
    ) {
        st.index.insert(v, st.next);
        st.low.insert(v, st.next);
        st.next += 1;
        st.stack.push(v);
        st.on_stack.insert(v);
        for &w in edges.get(v).into_iter().flatten() {
            if !st.index.contains_key(w) {
                visit(w, edges, st);
                let lw = st.low[w];
                let lv = st.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if st.on_stack.contains(w) {
                let iw = st.index[w];
                let lv = st.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if st.low[v] == st.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack.remove(w);
                comp.push(if w.is_empty() {
                    "lib".to_string()
                } else {
                    w.join("/")
                });
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                st.found.push(comp);
            }
        }
    }
    let mut st = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for m in modules.keys() {
        if !st.index.contains_key(m) {
            visit(m, &edges, &mut st);
        }
    }
    st.found
}

/// No crate has files that import each other in a circle, which a reader would have to hold in
/// mind at once: each file reads only files below it.
#[test]
fn no_crate_has_a_cycle_of_imports_across_its_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cycles = Vec::new();
    let mut crates = 0;
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        crates += 1;
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for c in file_cycles(&src) {
            cycles.push(format!("{name}: {}", c.join(" ↔ ")));
        }
    }
    assert!(crates >= 15, "only {crates} crates found under crates/");
    assert!(
        cycles.is_empty(),
        "files that import each other in a circle:\n{}",
        cycles.join("\n")
    );
}

/// The check itself: it finds a cycle where there is one.
#[test]
fn the_cycle_check_finds_a_planted_cycle() {
    let dir = std::env::temp_dir().join(format!("fanout-house-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("exec")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod exec;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::B;\npub struct A;\n").unwrap();
    std::fs::write(src.join("b.rs"), "use crate::{exec, c};\npub struct B;\n").unwrap();
    std::fs::write(
        src.join("exec/mod.rs"),
        "mod keyed;\nfn f() { let _ = super::a::A; }\n",
    )
    .unwrap();
    std::fs::write(src.join("exec/keyed.rs"), "use super::f;\n").unwrap();
    let found = file_cycles(&src);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        found,
        vec![vec!["a".to_string(), "b".into(), "exec".into()]]
    );
}

/// The check reads a parent's relative paths to its child modules (`keyed::compile` in a file
/// that declares `mod keyed;`), and only those: `crate::…::keyed::` and `super::keyed::` are
/// the paths they say.
#[test]
fn the_cycle_check_reads_relative_paths_to_child_modules() {
    let dir = std::env::temp_dir().join(format!("fanout-house-child-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("step")).unwrap();
    std::fs::create_dir_all(src.join("other")).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "mod explain;\nmod other;\nmod plan;\nmod sib;\nmod step;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("explain.rs"),
        "use crate::plan::Plan;\npub fn fmt() {}\n",
    )
    .unwrap();
    std::fs::write(
        src.join("plan.rs"),
        "use crate::step::KINDS;\npub struct Plan;\n",
    )
    .unwrap();
    // The parent names its child only relatively: the circle closes through it.
    std::fs::write(
        src.join("step/mod.rs"),
        "pub(crate) mod keyed;\npub const KINDS: &[fn()] = &[keyed::compile];\n",
    )
    .unwrap();
    std::fs::write(
        src.join("step/keyed.rs"),
        "pub fn compile() { crate::explain::fmt() }\n",
    )
    .unwrap();
    // `other` declares a `keyed` of its own, and names `step`'s by its full paths: no edge to
    // `other/keyed` from those (it would close `other` → `other/keyed` → `sib` → `other`).
    std::fs::write(
        src.join("other.rs"),
        "mod keyed;\nfn f() { crate::step::keyed::compile(); super::step::keyed::compile(); }\npub fn g() {}\n",
    )
    .unwrap();
    std::fs::write(src.join("other/keyed.rs"), "use super::super::sib::S;\n").unwrap();
    std::fs::write(
        src.join("sib.rs"),
        "pub struct S;\nfn h() { crate::other::g() }\n",
    )
    .unwrap();
    let found = file_cycles(&src);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        found,
        vec![vec![
            "explain".to_string(),
            "plan".into(),
            "step".into(),
            "step/keyed".into()
        ]]
    );
}

/// The most lines a source file may have before its tests: past that, a reader no longer holds
/// the file in mind, and it has seams to split along.
const MAX_LINES_BEFORE_TESTS: usize = 1200;

/// Whether `line` opens an inline module at the top level (`mod tests {`, `pub(crate) mod x {`).
fn opens_inline_module(line: &str) -> bool {
    let l = line.strip_prefix("pub(crate) ").unwrap_or(line);
    let l = l.strip_prefix("pub ").unwrap_or(l);
    l.starts_with("mod ") && l.trim_end().ends_with('{')
}

/// Lines of a file before its first top-level `#[cfg(test)]` inline module (all its lines when it
/// has none); attributes between the two count as the module's.
fn lines_before_tests(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    (0..lines.len())
        .find(|&i| {
            lines[i] == "#[cfg(test)]"
                && lines[i + 1..]
                    .iter()
                    .find(|l| !l.starts_with("#["))
                    .is_some_and(|l| opens_inline_module(l))
        })
        .unwrap_or(lines.len())
}

/// The files of a crate that are tests themselves: declared `#[cfg(test)] mod name;` by their
/// parent (`h1pool/differential.rs`, `report/tests.rs`).
fn test_only_files(src: &Path) -> BTreeSet<PathBuf> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(src, f), f.clone()))
        .collect();
    let mut out = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, line) in lines.iter().enumerate() {
            if *line != "#[cfg(test)]" {
                continue;
            }
            let Some(next) = lines[i + 1..].iter().find(|l| !l.starts_with("#[")) else {
                continue;
            };
            for child in child_modules(next) {
                let mut m = module_of(src, file);
                m.push(child);
                if let Some(f) = modules.get(&m) {
                    out.insert(f.clone());
                }
            }
        }
    }
    out
}

/// No source file has more than [`MAX_LINES_BEFORE_TESTS`] lines before its tests (issue 70's
/// acceptance); files that are tests themselves are exempt.
#[test]
fn no_source_file_is_over_1200_lines_before_its_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut over = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let exempt = test_only_files(&src);
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for file in files.into_iter().filter(|f| !exempt.contains(f)) {
            checked += 1;
            let n = lines_before_tests(&std::fs::read_to_string(&file).unwrap());
            if n > MAX_LINES_BEFORE_TESTS {
                let name = file
                    .strip_prefix(&root)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                over.push(format!("{name}: {n} lines before its tests"));
            }
        }
    }
    assert!(checked >= 100, "only {checked} source files found");
    over.sort();
    assert!(
        over.is_empty(),
        "files over {MAX_LINES_BEFORE_TESTS} lines before their tests (split them along their seams):\n{}",
        over.join("\n")
    );
}

/// The line check itself: tests counted from their `#[cfg(test)]` module, test-only files
/// known by their declaration.
#[test]
fn the_line_check_counts_up_to_the_tests_and_knows_test_only_files() {
    let text = "fn a() {}\n#[cfg(test)]\nmod differential;\n\n#[cfg(test)]\n#[allow(dead_code)]\nmod tests {\n    fn t() {}\n}\n";
    assert_eq!(lines_before_tests(text), 4);
    assert_eq!(lines_before_tests("fn a() {}\nfn b() {}\n"), 2);
    let dir = std::env::temp_dir().join(format!("fanout-house-lines-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("pool")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod pool;\n#[cfg(test)]\nmod tests;\n").unwrap();
    std::fs::write(src.join("tests.rs"), "").unwrap();
    std::fs::write(
        src.join("pool.rs"),
        "#[cfg(test)]\npub(crate) mod twin;\nmod wire;\n",
    )
    .unwrap();
    std::fs::write(src.join("pool/twin.rs"), "").unwrap();
    std::fs::write(src.join("pool/wire.rs"), "").unwrap();
    let found = test_only_files(&src);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        found,
        BTreeSet::from([src.join("pool/twin.rs"), src.join("tests.rs")])
    );
}
