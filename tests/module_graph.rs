//! The crate's modules import one another in no cycle, counting a name
//! taken through a root re-export (`crate::Error`) as an import of the
//! module `lib.rs` takes it from: each module can be read, and changed,
//! above the ones it uses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `text` without its `//` comments (doc comments included: a link is not an
/// import).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each name `lib.rs` re-exports (`pub use crate::MODULE::…::Name`), and its module.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for statement in code(lib).split(';') {
        let Some(path) = statement.trim().strip_prefix("pub use crate::") else {
            continue;
        };
        let module = path.split("::").next().unwrap_or_default().to_owned();
        let last = path.rsplit("::").next().unwrap_or_default();
        for name in last.trim_matches(|c| c == '{' || c == '}').split(',') {
            let name = name.split(" as ").last().unwrap_or_default().trim();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.clone());
            }
        }
    }
    names
}

/// The modules a file's code names after `crate::`, directly or through a
/// root re-export.
fn imports(
    text: &str,
    modules: &BTreeSet<String>,
    reexported: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let code = code(text);
    for after in code.split("crate::").skip(1) {
        let named: Vec<&str> = match after.strip_prefix('{') {
            // `crate::{a::B, C}`: the first segment of each path listed.
            Some(group) => group
                .split('}')
                .next()
                .unwrap_or_default()
                .split(',')
                .map(|path| path.trim().split("::").next().unwrap_or_default())
                .collect(),
            None => vec![
                after
                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or_default(),
            ],
        };
        for name in named {
            if modules.contains(name) {
                found.insert(name.to_owned());
            } else if let Some(module) = reexported.get(name) {
                found.insert(module.clone());
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The edges of `graph` that lie on a cycle, by strongly connected component.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    // A module is on a cycle with another when each reaches the other.
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in &graph[&m] {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut components: Vec<BTreeSet<String>> = Vec::new();
    for (m, from_m) in &reached {
        let component: BTreeSet<String> = from_m
            .iter()
            .filter(|other| reached[other].contains(*m))
            .cloned()
            .collect();
        if !component.is_empty() && !components.contains(&component) {
            components.push(component);
        }
    }
    components
}

#[test]
fn the_modules_import_one_another_in_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let modules: BTreeSet<String> = std::fs::read_dir(&src)
        .expect("src/")
        .map(|entry| entry.expect("an entry").path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_owned();
            match name.strip_suffix(".rs") {
                Some("lib") => None,
                Some(stem) => Some(stem.to_owned()),
                None => path.is_dir().then_some(name),
            }
        })
        .collect();
    let reexported = reexports(&lib);
    assert!(
        reexported.get("Limiter").map(String::as_str) == Some("limiter"),
        "the re-exports are not read: {reexported:?}"
    );
    let mut graph: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src/");
        let top = relative.components().next().expect("a first component");
        let top = top.as_os_str().to_str().expect("a UTF-8 name");
        let top = top.strip_suffix(".rs").unwrap_or(top);
        if top == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a source file");
        let imported = imports(&text, &modules, &reexported);
        graph
            .get_mut(top)
            .expect("a module of src/")
            .extend(imported.into_iter().filter(|m| m != top));
    }
    let edges: usize = graph.values().map(BTreeSet::len).sum();
    assert!(
        edges >= modules.len(),
        "only {edges} imports read: the scan no longer finds them"
    );
    let cycles = cycles(&graph);
    assert!(
        cycles.is_empty(),
        "modules importing one another in a cycle: {cycles:?}"
    );
}

/// The scan finds a cycle through a root re-export: the test above can fail.
#[test]
fn a_cycle_through_a_root_reexport_is_found() {
    let modules: BTreeSet<String> = ["error", "metric"].map(String::from).into();
    let reexported = reexports("pub use crate::error::{BoxError, Error, ErrorKind};");
    let graph = BTreeMap::from([
        (
            "error".to_owned(),
            imports("use crate::metric::Operation;", &modules, &reexported),
        ),
        (
            "metric".to_owned(),
            imports(
                "use crate::{Error, Limit}; // crate::nothing",
                &modules,
                &reexported,
            ),
        ),
    ]);
    assert_eq!(cycles(&graph), vec![modules]);
}
