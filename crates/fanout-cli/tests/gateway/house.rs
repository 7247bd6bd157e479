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
/// the first segment of each item of a `crate::{a::b, c}` group.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(is_ident) {
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

/// Cycles of imports across the files of one crate: strongly connected components of more than
/// one file, an edge from each file to every module its code names (`crate::m`, `super::m`), a
/// module's own ancestors excepted.
fn file_cycles(src: &Path) -> Vec<Vec<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> =
        files.into_iter().map(|f| (module_of(src, &f), f)).collect();
    let mut edges: BTreeMap<&Vec<String>, BTreeSet<&Vec<String>>> = BTreeMap::new();
    for (m, file) in &modules {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        // `super` of `a/b.rs` and of `a/b/mod.rs` (module `a::b`) is `a`.
        let parent = &m[..m.len().saturating_sub(1)];
        let mut targets = Vec::new();
        for p in paths_after(&code, "crate::") {
            targets.push(p);
        }
        for p in paths_after(&code, "super::") {
            let mut full = parent.to_vec();
            full.extend(p);
            targets.push(full);
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
