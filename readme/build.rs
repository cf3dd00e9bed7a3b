//! Takes the README's example (the first ```rust block of its "Usage"
//! section) out of README.md as it is written, for the test to compile and
//! run: the README cannot drift from what is tested.

use std::path::Path;
use std::{env, fs};

fn main() {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    println!("cargo::rerun-if-changed={}", readme.display());
    let text = fs::read_to_string(&readme).expect("README.md");
    let usage = text
        .split("\n## Usage\n")
        .nth(1)
        .expect("README.md has a \"## Usage\" section");
    let block = usage
        .split("\n```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```\n").next())
        .expect("the Usage section has a ```rust block");
    let out = Path::new(&env::var("OUT_DIR").expect("OUT_DIR")).join("readme_example.rs");
    fs::write(out, format!("{block}\n")).expect("written");
}
