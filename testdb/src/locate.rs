//! Finding the PostgreSQL server binaries (`initdb`, `postgres`, `pg_ctl`).

use std::env;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Directory under which Debian and Ubuntu install one `<version>/bin` per major version.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// The directory holding `initdb` and `postgres`, found once per process.
pub(crate) fn bin_dir() -> &'static Path {
    static BIN_DIR: OnceLock<PathBuf> = OnceLock::new();
    BIN_DIR.get_or_init(|| find().unwrap_or_else(|message| panic!("{message}")))
}

fn has_server_binaries(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("postgres").is_file()
}

fn find() -> Result<PathBuf, String> {
    if let Some(dir) = env::var_os("PG_BIN").filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        return if has_server_binaries(&dir) {
            Ok(dir)
        } else {
            Err(format!(
                "PG_BIN is set to {}, but that directory does not contain both `initdb` and \
                 `postgres`",
                dir.display()
            ))
        };
    }
    if let Some(dir) = newest_debian_bin_dir(Path::new(DEBIAN_ROOT)) {
        return Ok(dir);
    }
    if let Some(dir) = on_path("initdb") {
        return if dir.join("postgres").is_file() {
            Ok(dir)
        } else {
            Err(format!(
                "found `initdb` in {} (via PATH) but no `postgres` beside it; set PG_BIN to the \
                 directory holding the PostgreSQL server binaries",
                dir.display()
            ))
        };
    }
    Err(
        "the tests need a PostgreSQL server, but none could be found: no `initdb` in PG_BIN, \
         in /usr/lib/postgresql/<version>/bin or on PATH. Install PostgreSQL (for example \
         `apt-get install postgresql`), point PG_BIN at its bin directory, or set DATABASE_URL \
         to a superuser URL of a running server"
            .to_owned(),
    )
}

/// The highest-versioned `<root>/<version>/bin` holding the server binaries.
fn newest_debian_bin_dir(root: &Path) -> Option<PathBuf> {
    let mut candidates: Vec<(Vec<u64>, PathBuf)> = std::fs::read_dir(root)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let version = name
                .split('.')
                .map(|part| part.parse::<u64>().ok())
                .collect::<Option<Vec<u64>>>()?;
            let bin = entry.path().join("bin");
            has_server_binaries(&bin).then_some((version, bin))
        })
        .collect();
    candidates.sort();
    candidates.pop().map(|(_, bin)| bin)
}

/// The directory of the first `program` found on PATH.
fn on_path(program: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .filter(|dir| !dir.as_os_str().is_empty())
        .find(|dir| dir.join(program).is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_highest_version() {
        let root = env::temp_dir().join(format!("platformkit-limit-locate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (version, complete) in [
            ("9.6", true),
            ("15", true),
            ("16", false),
            ("notaversion", true),
        ] {
            let bin = root.join(version).join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            std::fs::write(bin.join("initdb"), "").unwrap();
            if complete {
                std::fs::write(bin.join("postgres"), "").unwrap();
            }
        }
        assert_eq!(
            newest_debian_bin_dir(&root),
            Some(root.join("15").join("bin"))
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
