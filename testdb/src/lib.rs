//! Real PostgreSQL servers for the tests, examples and benchmarks of `platformkit-limit`.
//!
//! `platformkit-limit` keeps its state in PostgreSQL, so its tests run against a real
//! server rather than a mock. This crate provides that server and, on it, a fresh database
//! per test, so tests can run in parallel without seeing each other's rows.
//!
//! # Where the server comes from
//!
//! * If the environment variable `DATABASE_URL` is set (and not empty), [`Server::shared`]
//!   and [`Server::from_env_or_start`] use the server it names. **The URL must name a
//!   superuser**: the harness creates roles and databases there. Databases created for
//!   tests are not dropped. Connections are made without TLS.
//! * Otherwise a throwaway server is created on the fly: `initdb` (trust authentication,
//!   UTF-8, no locale) into a directory under `<temp>/platformkit-limit-pg/`, then
//!   `postgres`, listening on a free TCP port on 127.0.0.1 only. [`Server::start`] always
//!   does this, for tests that need a server of their own (to restart or stop it).
//!
//! The binaries are looked for, in order, in the directory named by `PG_BIN`, in the
//! newest `/usr/lib/postgresql/<version>/bin` (where Debian and Ubuntu install them), and
//! beside the `initdb` found on `PATH`. Without any of them the harness panics, asking for
//! PostgreSQL to be installed (`apt-get install postgresql`) or `DATABASE_URL` to be set.
//!
//! PostgreSQL refuses to run as root. When the tests run as root (as in many containers and
//! CI jobs), the server is initialised and run as the `postgres` system account, or as
//! `nobody` when there is no such account.
//!
//! # Settings of throwaway servers
//!
//! `max_connections = 300`, `max_prepared_transactions = 10`, `shared_buffers = 128MB`,
//! `log_min_messages = warning`, with the server log in `postgres.log` beside the data
//! directory; its tail is shown when a server fails to start. Unless
//! [`Options::durable`] is set, `fsync`, `synchronous_commit` and `full_page_writes` are
//! off: the data is thrown away anyway. The settings live in the data directory, so a
//! restart through [`Server::pg_ctl`] keeps the same port and settings.
//!
//! # Cleanup
//!
//! A server from [`Server::start`] is stopped and its directory removed when dropped. The
//! shared server lives until the process ends and never outlives it: its postmaster is
//! tied to the process with a parent-death signal (SIGQUIT, PostgreSQL's immediate
//! shutdown), and a small watchdog process, started with the first server, stops any
//! server of this process that is still running when the process exits (even if it is
//! killed) and removes its directory. Directories left behind by processes that no longer
//! exist are removed when the next process starts its first server.
//!
//! # Roles and databases
//!
//! Every server gets three ordinary roles (created idempotently; concurrent processes may
//! share a `DATABASE_URL` server): `limit_owner` (`LOGIN NOSUPERUSER NOBYPASSRLS
//! NOCREATEDB NOCREATEROLE`), which owns each test database and the schemas and tables
//! its script creates, as a migration role would in production; `limit_tenant` (`LOGIN
//! NOSUPERUSER NOBYPASSRLS`), which may use those schemas, read and write their tables
//! and execute their routines, as an application would; and `limit_stranger`, a login
//! granted nothing, as any other login on a shared server. Throwaway servers need no
//! passwords; on a `DATABASE_URL` server that has one, all three get the URL's password.
//!
//! # Standbys and failover
//!
//! [`Server::standby`] starts a hot standby of a server from [`Server::start`]: a base
//! backup (`pg_basebackup -R`, through a replication slot of its own) into a directory of
//! its own, started on its own port, streaming the primary's WAL. Databases created on
//! the primary before (or after) are on the standby too; [`TestDb::on`] reaches one
//! there. [`Server::wait_for_standby`] waits until the standby has replayed everything
//! the primary had written, [`Server::make_synchronous`] makes a primary started with
//! [`Options::durable`] acknowledge commits only once the standby has them,
//! [`Server::stop_streaming`] cuts the standby off from its primary, and
//! [`Server::promote`] turns the standby into a primary, for failover tests. A standby is
//! run and cleaned up like any throwaway server.
//!
//! # PgBouncer
//!
//! [`PgBouncer::start`] puts a PgBouncer in transaction pooling mode in front of a server,
//! for tests of what a pooler between the application and PostgreSQL changes. Its binary is
//! looked for in `PGBOUNCER`, on `PATH`, and as `/usr/sbin/pgbouncer` or
//! `/usr/bin/pgbouncer` (`apt-get install pgbouncer`); without one, `start` returns `None`.
//! Like a throwaway server, it runs unprivileged when the tests run as root, is stopped
//! when dropped, and never outlives the test process.
//!
//! # Example
//!
//! ```no_run
//! use platformkit_limit_testdb::Server;
//!
//! # async fn example() {
//! let db = Server::shared()
//!     .database("CREATE TABLE hits (key text PRIMARY KEY, n bigint NOT NULL);")
//!     .await;
//! let tenant = db.connect_tenant().await;
//! tenant
//!     .execute("INSERT INTO hits VALUES ('a', 1)", &[])
//!     .await
//!     .unwrap();
//! # }
//! ```

#![warn(missing_docs)]

mod bootstrap;
mod cluster;
pub mod events;
mod locate;
mod pgbouncer;
mod process;

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::str::FromStr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls};

use crate::bootstrap::{OWNER, STRANGER, TENANT};
use crate::cluster::Cluster;

pub use crate::pgbouncer::PgBouncer;

/// How a throwaway server is configured.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Keep PostgreSQL's crash-safety defaults (`fsync`, `synchronous_commit` and
    /// `full_page_writes` on), for benchmarks that should measure realistic commits. When
    /// `false` (the default, for tests) they are turned off.
    pub durable: bool,
}

/// A PostgreSQL server to run tests against: either the one named by `DATABASE_URL`, or a
/// throwaway one started by this process.
pub struct Server {
    admin: Config,
    host: String,
    port: u16,
    cluster: Option<Cluster>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// The server shared by the whole process: the one named by `DATABASE_URL` if it is
    /// set, else a throwaway server (with [`Options::default`]) started on first use.
    ///
    /// Blocks; may be called from inside or outside a Tokio runtime.
    pub fn shared() -> &'static Server {
        static SHARED: OnceLock<Server> = OnceLock::new();
        SHARED.get_or_init(|| Server::from_env_or_start(Options::default()))
    }

    /// Starts a throwaway server of its own (never the `DATABASE_URL` one), for a test that
    /// restarts or stops it. It is stopped and its directory removed when dropped.
    ///
    /// Blocks; may be called from inside or outside a Tokio runtime.
    pub fn start(options: Options) -> Server {
        let server = Server::owned(Cluster::start(&options));
        server.ensure_roles();
        server
    }

    /// A server for a cluster this process started.
    fn owned(cluster: Cluster) -> Server {
        let host = "127.0.0.1".to_owned();
        let port = cluster.port();
        let mut admin = Config::new();
        admin
            .host(&host)
            .port(port)
            .user(cluster::SUPERUSER)
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(30));
        Server {
            admin,
            host,
            port,
            cluster: Some(cluster),
        }
    }

    /// The server named by `DATABASE_URL` if it is set, else a new throwaway server
    /// started with `options` (for benchmarks, which want [`Options::durable`]). Unlike
    /// [`Server::shared`], every call returns a new `Server`.
    ///
    /// Blocks; may be called from inside or outside a Tokio runtime.
    pub fn from_env_or_start(options: Options) -> Server {
        match std::env::var("DATABASE_URL") {
            Ok(url) if !url.trim().is_empty() => Server::from_url(&url),
            _ => Server::start(options),
        }
    }

    fn from_url(url: &str) -> Server {
        let mut admin = Config::from_str(url).unwrap_or_else(|e| {
            panic!("DATABASE_URL is not a valid PostgreSQL connection string: {e}")
        });
        if admin.get_hosts().is_empty() {
            admin.host("localhost");
        }
        if admin.get_user().is_none() {
            admin.user("postgres");
        }
        if admin.get_dbname().is_none() {
            admin.dbname("postgres");
        }
        let host = match &admin.get_hosts()[0] {
            Host::Tcp(host) => host.clone(),
            Host::Unix(path) => path.display().to_string(),
        };
        let port = admin.get_ports().first().copied().unwrap_or(5432);
        let server = Server {
            admin,
            host,
            port,
            cluster: None,
        };
        server.ensure_roles();
        server
    }

    fn ensure_roles(&self) {
        block_on(bootstrap::ensure_roles(&self.admin));
    }

    /// The host the server listens on (`127.0.0.1` for a throwaway server).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Superuser connection settings, for the `postgres` database (or, for a
    /// `DATABASE_URL` server, the database the URL names, if any).
    pub fn admin_config(&self) -> Config {
        self.admin.clone()
    }

    /// Whether this process started the server (`false` for a `DATABASE_URL` server).
    pub fn is_owned(&self) -> bool {
        self.cluster.is_some()
    }

    /// The directory of the PostgreSQL binaries in use (`None` for a `DATABASE_URL`
    /// server).
    pub fn bin_dir(&self) -> Option<&Path> {
        self.cluster.as_ref().map(Cluster::bin_dir)
    }

    /// Runs `pg_ctl <args> -D <data directory>` and waits for it, for example
    /// `&["restart", "-m", "fast", "-w"]`, `&["stop", "-m", "immediate"]` or
    /// `&["start", "-w"]`. `start` and `restart` log to the server log unless `args`
    /// names another file with `-l`. The port and settings survive restarts.
    ///
    /// Panics, with pg_ctl's output and the tail of the server log, if pg_ctl fails, and
    /// for a server this process did not start.
    pub fn pg_ctl(&self, args: &[&str]) {
        match &self.cluster {
            Some(cluster) => cluster.pg_ctl(args),
            None => panic!(
                "pg_ctl {}: the server at {}:{} comes from DATABASE_URL, not from this \
                 process; only servers from Server::start can be controlled",
                args.join(" "),
                self.host,
                self.port
            ),
        }
    }

    /// Starts a hot standby of this server (which must be one this process started): a
    /// base backup taken with `pg_basebackup -R` as the superuser (initdb's
    /// `pg_hba.conf` trusts replication connections from 127.0.0.1), through a
    /// replication slot of its own on this server, into a directory of its own, started
    /// on a port of its own with `options` and the same settings as any throwaway server.
    /// It streams this server's WAL asynchronously (see [`Server::make_synchronous`]) and
    /// answers read-only queries; everything this server holds when it is called, roles
    /// and databases included, is on the standby when it returns (reach a database there
    /// with [`TestDb::on`]). Later writes arrive as it replays them: wait for them with
    /// [`Server::wait_for_standby`].
    ///
    /// The standby is cleaned up like any server from [`Server::start`]: stopped and its
    /// directory removed when dropped, and never outliving the process. Promote it with
    /// [`Server::promote`].
    ///
    /// Blocks; may be called from inside or outside a Tokio runtime. Panics, with
    /// `pg_basebackup`'s output or the tail of a server log, if a step fails, and for a
    /// server this process did not start.
    pub fn standby(&self, options: Options) -> Server {
        let Some(primary) = &self.cluster else {
            panic!(
                "a standby of the server at {}:{}: it comes from DATABASE_URL, not from this \
                 process; only servers from Server::start can have one",
                self.host, self.port
            )
        };
        Server::owned(Cluster::standby(primary, &options))
    }

    /// For a standby from [`Server::standby`], the name it streams under: its
    /// `application_name` on the primary (in `pg_stat_replication`, and as
    /// `synchronous_standby_names` names it) and its replication slot's name there.
    /// `None` for any other server.
    pub fn standby_name(&self) -> Option<&str> {
        self.cluster.as_ref().and_then(Cluster::standby_name)
    }

    /// Makes `standby` (from [`Server::standby`] on this server) synchronous: sets this
    /// server's `synchronous_standby_names` to its name (with `ALTER SYSTEM`, so a restart
    /// keeps it), reloads the configuration, and waits until `pg_stat_replication` reports
    /// the standby as `sync`. From then on, a commit on this server with
    /// `synchronous_commit = on` is acknowledged only once the standby has flushed its
    /// WAL, so a promoted standby has every acknowledged commit.
    ///
    /// Panics if this server runs with `synchronous_commit` off or `local` (start it with
    /// [`Options::durable`]), where nothing would wait for the standby; if `standby` is not
    /// a standby from [`Server::standby`]; and if the standby is not `sync` within a
    /// minute.
    pub async fn make_synchronous(&self, standby: &Server) {
        let name = standby.standby_name().unwrap_or_else(|| {
            panic!(
                "make_synchronous: the server at {}:{} is not a standby from Server::standby",
                standby.host, standby.port
            )
        });
        let client = connect(&self.admin).await;
        let commit: String = client
            .query_one("SHOW synchronous_commit", &[])
            .await
            .unwrap_or_else(|e| panic!("SHOW synchronous_commit: {}", bootstrap::describe(&e)))
            .get(0);
        assert!(
            commit != "off" && commit != "local",
            "make_synchronous: the server at {}:{} runs with synchronous_commit = {commit}, so \
             no commit would wait for the standby; start it with Options {{ durable: true }}",
            self.host,
            self.port
        );
        client
            .batch_execute(&format!(
                "ALTER SYSTEM SET synchronous_standby_names = '\"{name}\"'"
            ))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "setting synchronous_standby_names: {}",
                    bootstrap::describe(&e)
                )
            });
        client
            .batch_execute("SELECT pg_catalog.pg_reload_conf()")
            .await
            .unwrap_or_else(|e| panic!("reloading the configuration: {}", bootstrap::describe(&e)));
        let deadline = Deadline::after(STANDBY_TIMEOUT);
        loop {
            let state: Option<String> = client
                .query_opt(
                    "SELECT sync_state FROM pg_catalog.pg_stat_replication \
                     WHERE application_name = $1",
                    &[&name],
                )
                .await
                .unwrap_or_else(|e| {
                    panic!("reading pg_stat_replication: {}", bootstrap::describe(&e))
                })
                .map(|row| row.get(0));
            if state.as_deref() == Some("sync") {
                return;
            }
            assert!(
                !deadline.passed(),
                "make_synchronous: {name} was not a synchronous standby of {}:{} within {} seconds \
             (its sync_state: {state:?})\n{}",
                self.host,
                self.port,
                STANDBY_TIMEOUT.as_secs(),
                standby.log_tail()
            );
            deadline.pause().await;
        }
    }

    /// Waits until `standby` (a standby of this server) has replayed all the WAL this
    /// server had written when called: until its `pg_last_wal_replay_lsn()` has reached
    /// this server's `pg_current_wal_insert_lsn()`. Every commit made here before the call
    /// is then visible on the standby, and survives this server's loss.
    ///
    /// The insert position, not `pg_current_wal_lsn()` (the write position): with
    /// `synchronous_commit` off, as on servers without [`Options::durable`], the last
    /// commits may still be in WAL buffers, behind the write position, until the WAL
    /// writer writes them (within `wal_writer_delay`).
    ///
    /// Panics if the standby has not caught up within a minute.
    pub async fn wait_for_standby(&self, standby: &Server) {
        let primary = connect(&self.admin).await;
        let target: String = primary
            .query_one("SELECT pg_catalog.pg_current_wal_insert_lsn()::text", &[])
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "reading the current WAL position: {}",
                    bootstrap::describe(&e)
                )
            })
            .get(0);
        let replica = connect(&standby.admin).await;
        let deadline = Deadline::after(STANDBY_TIMEOUT);
        loop {
            let row = replica
                .query_one(
                    "SELECT pg_catalog.pg_last_wal_replay_lsn()::text, \
                            COALESCE(pg_catalog.pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)",
                    &[&target],
                )
                .await
                .unwrap_or_else(|e| {
                    panic!("reading the standby's replay position: {}", bootstrap::describe(&e))
                });
            if row.get::<_, bool>(1) {
                return;
            }
            let replayed: Option<String> = row.get(0);
            assert!(
                !deadline.passed(),
                "the standby at {}:{} had not replayed up to {target} within {} seconds (replayed \
             up to {replayed:?})\n{}",
                standby.host,
                standby.port,
                STANDBY_TIMEOUT.as_secs(),
                standby.log_tail()
            );
            deadline.pause().await;
        }
    }

    /// Cuts this standby (from [`Server::standby`]) off from its primary, as a network
    /// partition would: empties its `primary_conninfo` (with `ALTER SYSTEM`), reloads its
    /// configuration and waits until its WAL receiver is gone. It keeps what it has
    /// received and can still be promoted; it receives nothing more, so a primary that
    /// made it synchronous acknowledges no commit from then on.
    ///
    /// Panics if this server is not a standby from [`Server::standby`], and if its WAL
    /// receiver is still running a minute later.
    pub async fn stop_streaming(&self) {
        assert!(
            self.standby_name().is_some(),
            "stop_streaming: the server at {}:{} is not a standby from Server::standby",
            self.host,
            self.port
        );
        let client = connect(&self.admin).await;
        for statement in [
            "ALTER SYSTEM SET primary_conninfo = ''",
            "SELECT pg_catalog.pg_reload_conf()",
        ] {
            client
                .batch_execute(statement)
                .await
                .unwrap_or_else(|e| panic!("{statement}: {}", bootstrap::describe(&e)));
        }
        let deadline = Deadline::after(STANDBY_TIMEOUT);
        loop {
            let receivers: i64 = client
                .query_one("SELECT count(*) FROM pg_catalog.pg_stat_wal_receiver", &[])
                .await
                .unwrap_or_else(|e| {
                    panic!("reading pg_stat_wal_receiver: {}", bootstrap::describe(&e))
                })
                .get(0);
            if receivers == 0 {
                return;
            }
            assert!(
                !deadline.passed(),
                "the standby at {}:{} still had its WAL receiver {} seconds after its \
                 primary_conninfo was emptied\n{}",
                self.host,
                self.port,
                STANDBY_TIMEOUT.as_secs(),
                self.log_tail()
            );
            deadline.pause().await;
        }
    }

    /// Promotes this standby (from [`Server::standby`]) to a primary with
    /// `pg_ctl promote -w`, and waits until it accepts writes (`pg_is_in_recovery()` is
    /// false). It keeps its port; it no longer follows anything.
    ///
    /// Blocks; may be called from inside or outside a Tokio runtime. Panics if pg_ctl
    /// fails (for example, for a server that is not a standby) and if the server still
    /// reports being in recovery a minute later.
    pub fn promote(&self) {
        self.pg_ctl(&["promote", "-w"]);
        block_on(async {
            let client = connect(&self.admin).await;
            let deadline = Deadline::after(STANDBY_TIMEOUT);
            loop {
                let in_recovery: bool = client
                    .query_one("SELECT pg_catalog.pg_is_in_recovery()", &[])
                    .await
                    .unwrap_or_else(|e| panic!("pg_is_in_recovery(): {}", bootstrap::describe(&e)))
                    .get(0);
                if !in_recovery {
                    return;
                }
                assert!(
                    !deadline.passed(),
                    "the server at {}:{} was still in recovery {} seconds after \
                     `pg_ctl promote -w`\n{}",
                    self.host,
                    self.port,
                    STANDBY_TIMEOUT.as_secs(),
                    self.log_tail()
                );
                deadline.pause().await;
            }
        });
    }

    /// The tail of the server log, headed by its path, for panic messages; empty for a
    /// `DATABASE_URL` server.
    fn log_tail(&self) -> String {
        self.cluster
            .as_ref()
            .map(|c| {
                format!(
                    "--- tail of {} ---\n{}",
                    c.log_path().display(),
                    c.log_tail()
                )
            })
            .unwrap_or_default()
    }

    /// Creates a fresh, uniquely named database owned by `limit_owner` and applies
    /// `schema` (an SQL script) to it connected as `limit_owner`, so that role owns what
    /// the script creates. `limit_tenant` may then use every schema the script created
    /// (and `public`), read and write their tables and execute their routines.
    ///
    /// Panics, with the server's error, if any step fails.
    pub async fn database(&self, schema: &str) -> TestDb {
        self.create_database(Some(schema)).await
    }

    /// Like [`Server::database`], without applying anything: an empty database owned by
    /// `limit_owner`. Tables `limit_owner` creates in schema `public` later are readable
    /// and writable by `limit_tenant` (through default privileges).
    pub async fn empty_database(&self) -> TestDb {
        self.create_database(None).await
    }

    async fn create_database(&self, schema: Option<&str>) -> TestDb {
        let db = TestDb::new(self, unique_database_name());
        bootstrap::create_database(&self.admin, &db.owner, &db.name, schema).await;
        db
    }
}

/// How long the standby operations wait for the standby to reach a state.
const STANDBY_TIMEOUT: Duration = Duration::from_secs(60);

/// The end of a bounded wait for a server to reach a state, polled every 20 ms.
struct Deadline(std::time::Instant);

impl Deadline {
    fn after(timeout: Duration) -> Deadline {
        Deadline(std::time::Instant::now() + timeout)
    }

    fn passed(&self) -> bool {
        std::time::Instant::now() >= self.0
    }

    /// Waits a moment before the next poll.
    async fn pause(&self) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `t_<pid>_<time>_<counter>`: unique within a process and, thanks to the time component,
/// across processes sharing a server (even ones that had the same pid).
fn unique_database_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static STARTED: OnceLock<u64> = OnceLock::new();
    let started = *STARTED.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    format!(
        "t_{}_{:x}_{}",
        std::process::id(),
        started & 0xffff_ffff_ffff,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A database created for one test by [`Server::database`] or [`Server::empty_database`].
///
/// Independent of the [`Server`] value it came from. The database is not dropped
/// afterwards.
#[derive(Clone, Debug)]
pub struct TestDb {
    name: String,
    host: String,
    port: u16,
    admin: Config,
    owner: Config,
    tenant: Config,
    stranger: Config,
}

impl TestDb {
    fn new(server: &Server, name: String) -> TestDb {
        let as_role = |user: &str| {
            let mut config = server.admin.clone();
            config.user(user).dbname(&name);
            config
        };
        TestDb {
            admin: as_role(server.admin.get_user().unwrap_or("postgres")),
            owner: as_role(OWNER),
            tenant: as_role(TENANT),
            stranger: as_role(STRANGER),
            host: server.host.clone(),
            port: server.port,
            name,
        }
    }

    /// The same database through `server`: a standby of the server it was created on
    /// (see [`Server::standby`]), which replicates every database, or that standby once
    /// promoted. Only the host and port differ.
    pub fn on(&self, server: &Server) -> TestDb {
        TestDb::new(server, self.name.clone())
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connection settings as `limit_owner` (`LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB
    /// NOCREATEROLE`), the owner of the database and of what its schema created.
    pub fn config(&self) -> Config {
        self.owner.clone()
    }

    /// Connection settings as `limit_tenant` (`LOGIN NOSUPERUSER NOBYPASSRLS`), which may
    /// connect, use schema `public`, and `SELECT`, `INSERT`, `UPDATE` and `DELETE` its
    /// tables.
    pub fn tenant_config(&self) -> Config {
        self.tenant.clone()
    }

    /// Connection settings as `limit_stranger` (`LOGIN NOSUPERUSER NOBYPASSRLS`), a
    /// login granted nothing: it has only what PUBLIC has (CONNECT, TEMP, and whatever
    /// the database's schemas give PUBLIC).
    pub fn stranger_config(&self) -> Config {
        self.stranger.clone()
    }

    /// Superuser connection settings for this database.
    pub fn admin_config(&self) -> Config {
        self.admin.clone()
    }

    /// `postgres://limit_owner@host:port/name` (with the password, if there is one).
    pub fn url(&self) -> String {
        let password = self
            .owner
            .get_password()
            .map(|p| format!(":{}", percent_encode(p)))
            .unwrap_or_default();
        let host = if self.host.contains(':') && !self.host.starts_with('/') {
            format!("[{}]", self.host)
        } else {
            percent_encode(self.host.as_bytes())
        };
        format!(
            "postgres://{OWNER}{password}@{host}:{}/{}",
            self.port,
            percent_encode(self.name.as_bytes())
        )
    }

    /// Connects as `limit_owner`; see [`connect`].
    pub async fn connect(&self) -> Client {
        connect(&self.owner).await
    }

    /// Connects as `limit_tenant`; see [`connect`].
    pub async fn connect_tenant(&self) -> Client {
        connect(&self.tenant).await
    }

    /// Connects as the superuser; see [`connect`].
    pub async fn connect_admin(&self) -> Client {
        connect(&self.admin).await
    }
}

/// Connects with `config` (without TLS) and drives the connection on a task spawned with
/// [`tokio::spawn`], so this must be called within a Tokio runtime.
///
/// Panics, naming the user, server and database, if the connection fails.
pub async fn connect(config: &Config) -> Client {
    let (client, connection) = config.connect(NoTls).await.unwrap_or_else(|e| {
        panic!(
            "connecting to PostgreSQL as {}: {}",
            bootstrap::target(config),
            bootstrap::describe(&e)
        )
    });
    tokio::spawn(async move {
        // Errors surface to the client's callers; a server stopped by a test ends here too.
        let _ = connection.await;
    });
    client
}

/// Runs `future` to completion on a new current-thread runtime on a scoped thread, so
/// callers may block whether or not they are inside a runtime themselves.
fn block_on<F>(future: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("building a Tokio runtime")
                    .block_on(future)
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn percent_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
