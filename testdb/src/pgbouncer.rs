//! A PgBouncer in front of a [`Server`], in transaction pooling mode: the way many
//! deployments put a pooler between their services and PostgreSQL.

use std::env;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tokio_postgres::{Config, NoTls};

use crate::bootstrap::{self, OWNER, TENANT};
use crate::cluster;
use crate::process::{self, RunAs};
use crate::{Server, block_on};

/// Where distribution packages install the binary when it is not on `PATH`.
const WELL_KNOWN: [&str; 2] = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"];
/// The configuration file, in the bouncer's directory.
const CONFIG_FILE: &str = "pgbouncer.ini";
/// The users PgBouncer knows, in the bouncer's directory.
const AUTH_FILE: &str = "userlist.txt";
/// PgBouncer's log, in the bouncer's directory.
const LOG_FILE: &str = "pgbouncer.log";
/// What PgBouncer writes to stdout and stderr before its log is open.
const OUTPUT_FILE: &str = "pgbouncer.out";
/// How long a starting PgBouncer may take to answer a query.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How many ports to try when the chosen one is taken before PgBouncer binds it.
const PORT_ATTEMPTS: usize = 8;
/// How long a stopping PgBouncer may take before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// The first PgBouncer that carries protocol-level named prepared statements
/// from one server connection to the next (`max_prepared_statements`).
const PREPARED_STATEMENTS_SINCE: (u32, u32) = (1, 21);
/// `max_prepared_statements` where the bouncer has it.
const MAX_PREPARED_STATEMENTS: u32 = 100;

/// A PgBouncer in front of a [`Server`], in transaction pooling mode: each client
/// transaction (or statement outside one) borrows a server connection and gives it back
/// when it ends, so consecutive transactions of one client may run on different server
/// connections, and one server connection serves many clients in turn.
///
/// It listens on a free TCP port on 127.0.0.1, forwards every database name to the
/// server, and lets in `limit_owner`, `limit_tenant` and the server's superuser without
/// checking a password (`auth_type = trust`); it logs into the server with the server's
/// password, if it has one. When the tests run as root, it runs as the same unprivileged
/// account as throwaway servers.
///
/// It is stopped, and its directory removed, when dropped. Like a throwaway server, it
/// never outlives the test process: it is killed when the process dies, however it dies.
pub struct PgBouncer {
    port: u16,
    pool_size: u32,
    binary: PathBuf,
    /// `(major, minor)`, from `pgbouncer --version`.
    version: (u32, u32),
    /// `<base>/<pid>-<n>`: holds the configuration and the log; removed on drop.
    dir: PathBuf,
    log_path: PathBuf,
    output_path: PathBuf,
    child: Option<Child>,
}

impl fmt::Debug for PgBouncer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgBouncer")
            .field("binary", &self.binary)
            .field("version", &self.version)
            .field("port", &self.port)
            .field("pool_size", &self.pool_size)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

enum StartFailure {
    PortTaken,
    Failed(String),
}

impl PgBouncer {
    /// Starts a PgBouncer in front of `server` with `pool_size` server connections per
    /// (database, user) pair, and waits until a query goes through it. A PgBouncer that
    /// can carry named prepared statements (1.21 or newer) is started with
    /// `max_prepared_statements` set; see [`PgBouncer::carries_prepared_statements`].
    ///
    /// `None` when there is no PgBouncer to run: the binary is looked for in the file
    /// named by the environment variable `PGBOUNCER`, on `PATH`, then as
    /// `/usr/sbin/pgbouncer` and `/usr/bin/pgbouncer` (where Debian's `pgbouncer`
    /// package installs it).
    ///
    /// Blocks; may be called from inside or outside a Tokio runtime. Panics, with
    /// PgBouncer's log, when it cannot be started or does not answer within 30 seconds,
    /// and when `PGBOUNCER` names no file.
    pub fn start(server: &Server, pool_size: u32) -> Option<PgBouncer> {
        assert!(
            pool_size > 0,
            "a PgBouncer pool needs at least one connection"
        );
        let binary = find_binary()?;
        let version = version_of(&binary);
        let run_as = RunAs::get();
        let dir = process::new_cluster_dir();
        let mut bouncer = PgBouncer {
            port: 0,
            pool_size,
            binary,
            version,
            log_path: dir.join(LOG_FILE),
            output_path: dir.join(OUTPUT_FILE),
            dir,
            child: None,
        };
        // From here on, a panic drops `bouncer`, which stops PgBouncer and removes `dir`.
        bouncer.write_auth_file(server, run_as);
        for _ in 0..PORT_ATTEMPTS {
            bouncer.port = cluster::free_port();
            match bouncer.launch(server, run_as) {
                Ok(()) => {
                    bouncer.wait_ready(server);
                    return Some(bouncer);
                }
                Err(StartFailure::PortTaken) => bouncer.stop(),
                Err(StartFailure::Failed(reason)) => bouncer.fail(&reason),
            }
        }
        bouncer.fail(&format!(
            "the chosen port was taken {PORT_ATTEMPTS} times in a row"
        ))
    }

    /// The TCP port PgBouncer listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The version of the binary, `(major, minor)`: `(1, 18)` for PgBouncer 1.18.0.
    pub fn version(&self) -> (u32, u32) {
        self.version
    }

    /// Whether this PgBouncer carries protocol-level named prepared statements from one
    /// server connection to the next (1.21 or newer, started here with
    /// `max_prepared_statements` set). An older one does not: a statement a client
    /// prepared may be missing from the server connection its next transaction gets, or
    /// another client's statement of the same name may be there (what sqlx's statement
    /// cache runs into).
    pub fn carries_prepared_statements(&self) -> bool {
        self.version >= PREPARED_STATEMENTS_SINCE
    }

    /// `config` (for example [`TestDb::config`](crate::TestDb::config)) pointed at the
    /// bouncer: the same user, password, database and other settings, with the host and
    /// port replaced by the bouncer's.
    pub fn config_for(&self, config: &Config) -> Config {
        let mut through = Config::new();
        through
            .host("127.0.0.1")
            .port(self.port)
            .ssl_mode(config.get_ssl_mode())
            .ssl_negotiation(config.get_ssl_negotiation())
            .keepalives(config.get_keepalives())
            .keepalives_idle(config.get_keepalives_idle())
            .target_session_attrs(config.get_target_session_attrs())
            .channel_binding(config.get_channel_binding());
        if let Some(user) = config.get_user() {
            through.user(user);
        }
        if let Some(password) = config.get_password() {
            through.password(password);
        }
        if let Some(dbname) = config.get_dbname() {
            through.dbname(dbname);
        }
        if let Some(options) = config.get_options() {
            through.options(options);
        }
        if let Some(name) = config.get_application_name() {
            through.application_name(name);
        }
        if let Some(timeout) = config.get_connect_timeout() {
            through.connect_timeout(*timeout);
        }
        if let Some(timeout) = config.get_tcp_user_timeout() {
            through.tcp_user_timeout(*timeout);
        }
        if let Some(interval) = config.get_keepalives_interval() {
            through.keepalives_interval(interval);
        }
        if let Some(retries) = config.get_keepalives_retries() {
            through.keepalives_retries(retries);
        }
        through
    }

    /// Every user the tests connect as, with the password PgBouncer logs into the server
    /// with: the server's, which the harness also gives `limit_owner` and `limit_tenant`.
    fn write_auth_file(&self, server: &Server, run_as: Option<RunAs>) {
        let admin = server.admin_config();
        let password = admin
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default();
        let mut users = vec![OWNER, TENANT, cluster::SUPERUSER];
        if let Some(user) = admin.get_user().filter(|user| !users.contains(user)) {
            users.push(user);
        }
        let contents: String = users
            .iter()
            .map(|user| format!("{} {}\n", quote_userlist(user), quote_userlist(&password)))
            .collect();
        let path = self.dir.join(AUTH_FILE);
        write_private(&path, &contents, run_as)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    fn write_config(&self, server: &Server, run_as: Option<RunAs>) {
        let prepared = if self.carries_prepared_statements() {
            format!("max_prepared_statements = {MAX_PREPARED_STATEMENTS}\n")
        } else {
            String::new()
        };
        let contents = format!(
            "; Written by platformkit-limit-testdb.\n\
             [databases]\n\
             * = host={host} port={server_port}\n\
             \n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             pool_mode = transaction\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 200\n\
             auth_type = trust\n\
             auth_file = {auth_file}\n\
             ignore_startup_parameters = extra_float_digits,options\n\
             server_reset_query =\n\
             server_login_retry = 1\n\
             logfile = {log_file}\n\
             {prepared}",
            host = server.host(),
            server_port = server.port(),
            port = self.port,
            pool_size = self.pool_size,
            auth_file = self.dir.join(AUTH_FILE).display(),
            log_file = self.log_path.display(),
        );
        let path = self.dir.join(CONFIG_FILE);
        write_private(&path, &contents, run_as)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        // PgBouncer opens its log as the account it runs as.
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .and_then(|_| RunAs::chown(run_as, &self.log_path))
            .unwrap_or_else(|e| panic!("creating {}: {e}", self.log_path.display()));
    }

    fn spawn(&self, run_as: Option<RunAs>) -> Child {
        let output = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.output_path)
            .unwrap_or_else(|e| panic!("creating {}: {e}", self.output_path.display()));
        let output_for_stderr = output.try_clone().unwrap_or_else(|e| {
            panic!(
                "duplicating the handle of {}: {e}",
                self.output_path.display()
            )
        });
        let mut command = Command::new(&self.binary);
        process::sanitize_env(&mut command);
        RunAs::apply(run_as, &mut command);
        command
            .arg(self.dir.join(CONFIG_FILE))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(output_for_stderr);
        // Nothing to clean up after PgBouncer (no pid file, no socket file): when this
        // process dies, it is simply killed, and its server connections end with it.
        process::spawn_tied_to_process_with(command, libc::SIGKILL)
            .unwrap_or_else(|e| panic!("spawning {}: {e}", self.binary.display()))
    }

    /// Writes the configuration for the chosen port, spawns PgBouncer and waits until it
    /// reports that it listens on that port.
    fn launch(&mut self, server: &Server, run_as: Option<RunAs>) -> Result<(), StartFailure> {
        self.write_config(server, run_as);
        let log_offset = fs::metadata(&self.log_path).map_or(0, |m| m.len());
        let output_offset = fs::metadata(&self.output_path).map_or(0, |m| m.len());
        self.child = Some(self.spawn(run_as));
        let listening = format!("listening on 127.0.0.1:{}", self.port);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let child = self.child.as_mut().expect("PgBouncer was spawned");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                let said = cluster::read_from(&self.log_path, log_offset)
                    + &cluster::read_from(&self.output_path, output_offset);
                return Err(if said.contains("Address already in use") {
                    StartFailure::PortTaken
                } else {
                    StartFailure::Failed(format!("PgBouncer exited during startup ({status})"))
                });
            }
            if cluster::read_from(&self.log_path, log_offset).contains(&listening) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StartFailure::Failed(format!(
                    "PgBouncer did not listen on port {} within {} seconds",
                    self.port,
                    READY_TIMEOUT.as_secs()
                )));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until a query goes through PgBouncer to the server, as the superuser.
    fn wait_ready(&mut self, server: &Server) {
        let config = self.config_for(&server.admin_config());
        let deadline = Instant::now() + READY_TIMEOUT;
        let answered = block_on(async {
            loop {
                let error = match query_through(&config).await {
                    Ok(()) => return Ok(()),
                    // PgBouncer or the server refused: waiting will not change that.
                    Err(e) if e.as_db_error().is_some() => return Err(bootstrap::describe(&e)),
                    Err(e) => bootstrap::describe(&e),
                };
                if Instant::now() >= deadline {
                    return Err(format!(
                        "no answer within {} seconds; last error: {error}",
                        READY_TIMEOUT.as_secs()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        if let Err(reason) = answered {
            self.fail(&format!(
                "`SELECT 1` through PgBouncer as {} failed: {reason}",
                bootstrap::target(&config)
            ));
        }
    }

    /// Stops PgBouncer (if running), then panics with `reason` and its log.
    fn fail(&mut self, reason: &str) -> ! {
        self.stop();
        let log = cluster::tail_of(&self.log_path);
        let output = cluster::tail_of(&self.output_path);
        let mut message = format!(
            "could not start PgBouncer ({}) on port {}: {reason}\n--- tail of {} ---\n{log}",
            self.binary.display(),
            self.port,
            self.log_path.display(),
        );
        // Until its log is open, PgBouncer writes to stderr; afterwards to both.
        if !output.trim().is_empty() && !log.contains(output.trim()) {
            message.push_str(&format!(
                "\n--- {} ---\n{output}",
                self.output_path.display()
            ));
        }
        panic!("{message}")
    }

    /// Stops PgBouncer with SIGTERM (a fast exit that closes every connection), falling
    /// back to SIGKILL, and reaps it.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(None) = child.try_wait() {
            // SAFETY: plain kill(2) of our own, not yet reaped, child.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
            }
        }
        if let Ok(None) = child.try_wait() {
            let _ = child.kill();
        }
        let _ = child.wait();
    }

    #[cfg(test)]
    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.stop();
        match fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => eprintln!(
                "platformkit-limit-testdb: could not remove {}: {e}",
                self.dir.display()
            ),
            _ => {}
        }
    }
}

/// Connects with `config` and runs `SELECT 1`.
async fn query_through(config: &Config) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    let connection = tokio::spawn(connection);
    let result = client.simple_query("SELECT 1").await.map(drop);
    drop(client);
    let _ = connection.await;
    result
}

/// The PgBouncer binary: `PGBOUNCER`, else the first on `PATH`, else a well-known path.
fn find_binary() -> Option<PathBuf> {
    if let Some(path) = env::var_os("PGBOUNCER").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "PGBOUNCER is set to {}, which is not a file; point it at the pgbouncer binary \
             or unset it",
            path.display()
        );
        return Some(path);
    }
    let on_path = env::var_os("PATH").and_then(|path| {
        env::split_paths(&path)
            .filter(|dir| !dir.as_os_str().is_empty())
            .map(|dir| dir.join("pgbouncer"))
            .find(|candidate| is_executable(candidate))
    });
    on_path.or_else(|| {
        WELL_KNOWN
            .iter()
            .map(PathBuf::from)
            .find(|candidate| is_executable(candidate))
    })
}

/// `(major, minor)` of the PgBouncer at `binary`, from the first line of its
/// `--version` ("PgBouncer 1.18.0").
fn version_of(binary: &Path) -> (u32, u32) {
    let output = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {} --version: {e}", binary.display()));
    let said = String::from_utf8_lossy(&output.stdout);
    parse_version(&said).unwrap_or_else(|| {
        panic!(
            "{} --version said {said:?}, not \"PgBouncer <major>.<minor>...\"",
            binary.display()
        )
    })
}

/// `(major, minor)` from "PgBouncer 1.18.0" (the first line of `--version`).
fn parse_version(said: &str) -> Option<(u32, u32)> {
    let version = said.lines().next()?.strip_prefix("PgBouncer ")?;
    let mut numbers = version.trim().split('.');
    let major = numbers.next()?.parse().ok()?;
    let minor = numbers.next()?.parse().ok()?;
    Some((major, minor))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Writes `contents` to a new file at `path` that only `run_as` (or this process) may
/// read: the auth file holds the server's password.
fn write_private(path: &Path, contents: &str, run_as: Option<RunAs>) -> io::Result<()> {
    let mut file = File::create(path)?;
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    file.write_all(contents.as_bytes())?;
    RunAs::chown(run_as, path)
}

/// A user name or password as PgBouncer's auth file takes it: in double quotes, with
/// double quotes doubled.
fn quote_userlist(value: &str) -> String {
    format!("\"{}\"", value.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_unprivileged_and_stops_on_drop() {
        let Some(bouncer) = PgBouncer::start(Server::shared(), 1) else {
            eprintln!("no pgbouncer binary; skipped");
            return;
        };
        let pid = bouncer.pid().expect("a running PgBouncer");
        let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("its /proc entry");
        let uid: u32 = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().next())
            .and_then(|uid| uid.parse().ok())
            .expect("a Uid line");
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            assert_ne!(uid, 0, "PgBouncer must not run as root");
        }
        let dir = bouncer.dir.clone();
        assert!(dir.join(LOG_FILE).is_file());
        drop(bouncer);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "PgBouncer is still running after drop"
        );
        assert!(!dir.exists(), "{} was not removed", dir.display());
    }

    #[test]
    fn a_taken_port_is_reported_as_such() {
        let Some(mut bouncer) = PgBouncer::start(Server::shared(), 1) else {
            return;
        };
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        bouncer.stop();
        bouncer.port = taken.local_addr().unwrap().port();
        assert!(matches!(
            bouncer.launch(Server::shared(), RunAs::get()),
            Err(StartFailure::PortTaken)
        ));
    }

    #[test]
    fn quotes_the_auth_file() {
        assert_eq!(quote_userlist("limit_owner"), "\"limit_owner\"");
        assert_eq!(quote_userlist("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_userlist(""), "\"\"");
    }

    #[test]
    fn the_version_is_read_from_the_first_line() {
        let said = "PgBouncer 1.18.0\nlibevent 2.1.12-stable\nadns: c-ares 1.18.1\n";
        assert_eq!(parse_version(said), Some((1, 18)));
        assert_eq!(parse_version("PgBouncer 1.24.1\n"), Some((1, 24)));
        assert_eq!(parse_version("PgBouncer 2.0\n"), Some((2, 0)));
        assert_eq!(parse_version("pgbouncer version 1.18\n"), None);
        assert_eq!(parse_version(""), None);
    }
}
