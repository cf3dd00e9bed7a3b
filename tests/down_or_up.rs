//! "Down" is what the server says to a probe, the same on every driver: the
//! guide's "down or overloaded" table, row by row, on each connection
//! source a service plugs in (tokio-postgres connecting for each call,
//! deadpool, bb8, sqlx's `PgPool`, and a held sqlx connection given a
//! probe).
//!
//! Each fault is caused as the attacker would cause it, with the role they
//! would have: a login granted nothing (`limit_stranger`) holds every
//! connection slot or a serializable read-write transaction; the limiter's
//! own role (or the database owner) sets transaction defaults; the
//! superuser stops a backend or the server. While the server answers, no
//! call is ever allowed uncounted; once it is down, the limit's
//! `WhenUnreachable` answers, at once after the first probe.

use std::time::Duration;

use platformkit_limit::{
    ErrorKind, Key, Limit, LimitConn, Limiter, Postgres, SCHEMA, Verdict, WhenUnreachable,
};
use platformkit_limit_testdb::{Options, Server, TestDb};
use sqlx::Connection as _;
use tokio::sync::Mutex;
use tokio::task::block_in_place;
use tokio::time::Instant;
use tokio_postgres::Config;

use crate::common::{self, BUDGET, PROBE, SLACK, timed};

/// A connection source a service plugs in, made for a database.
trait Source: 'static {
    type Conns: LimitConn;

    /// A cold source: it has lent no connection yet.
    async fn conns(config: &Config, size: u32) -> Self::Conns;

    /// The store over it, as the service would build it.
    fn store(conns: Self::Conns, _config: &Config) -> Postgres<Self::Conns> {
        Postgres::new(conns)
    }

    /// The service's own code sets [`SERIALIZABLE_DEFAULTS`] on a pooled
    /// connection (a pool of one: the limiter's).
    async fn set_defaults(_conns: &Self::Conns) {
        unimplemented!("not a pool")
    }
}

/// tokio-postgres, a connection for each call.
struct PerCall;

impl Source for PerCall {
    type Conns = Config;

    async fn conns(config: &Config, _size: u32) -> Config {
        config.clone()
    }
}

struct Deadpool;

impl Source for Deadpool {
    type Conns = deadpool_postgres::Pool;

    async fn conns(config: &Config, size: u32) -> deadpool_postgres::Pool {
        let manager = deadpool_postgres::Manager::new(config.clone(), tokio_postgres::NoTls);
        deadpool_postgres::Pool::builder(manager)
            .max_size(size as usize)
            .build()
            .expect("a deadpool pool")
    }

    async fn set_defaults(pool: &deadpool_postgres::Pool) {
        let conn = pool.get().await.expect("the pooled connection");
        conn.batch_execute(SERIALIZABLE_DEFAULTS)
            .await
            .expect("the defaults");
    }
}

struct Bb8;

impl Source for Bb8 {
    type Conns = bb8::Pool<bb8_postgres::PostgresConnectionManager<tokio_postgres::NoTls>>;

    async fn conns(config: &Config, size: u32) -> Self::Conns {
        let manager =
            bb8_postgres::PostgresConnectionManager::new(config.clone(), tokio_postgres::NoTls);
        // bb8's defaults: it retries a refused connection in silence.
        bb8::Pool::builder()
            .max_size(size)
            .min_idle(Some(0))
            .build_unchecked(manager)
    }

    async fn set_defaults(pool: &Self::Conns) {
        let conn = pool.get().await.expect("the pooled connection");
        conn.batch_execute(SERIALIZABLE_DEFAULTS)
            .await
            .expect("the defaults");
    }
}

struct SqlxPool;

impl Source for SqlxPool {
    type Conns = sqlx::PgPool;

    async fn conns(config: &Config, size: u32) -> sqlx::PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(size)
            .min_connections(0)
            .connect_lazy_with(sqlx_options(config))
    }

    async fn set_defaults(pool: &sqlx::PgPool) {
        let mut conn = pool.acquire().await.expect("the pooled connection");
        sqlx::Executor::execute(&mut *conn, sqlx::raw_sql(SERIALIZABLE_DEFAULTS))
            .await
            .expect("the defaults");
    }
}

/// One sqlx connection the service holds, lent to one call at a time; it
/// cannot open a connection of its own, so its store is given the probe of
/// a pool with the same options.
struct SqlxHeld;

type HeldSqlx = std::sync::Arc<Mutex<Option<sqlx::PgConnection>>>;

impl Source for SqlxHeld {
    type Conns = HeldLender;

    async fn conns(config: &Config, _size: u32) -> HeldLender {
        HeldLender {
            held: HeldSqlx::default(),
            options: sqlx_options(config),
        }
    }

    fn store(conns: HeldLender, config: &Config) -> Postgres<HeldLender> {
        let probe = sqlx::PgPool::connect_lazy_with(sqlx_options(config));
        Postgres::new(conns).with_probe(probe)
    }
}

/// Lends the held connection, connecting it on first use and again when
/// it no longer answers, as a service that holds one must.
struct HeldLender {
    held: HeldSqlx,
    options: sqlx::postgres::PgConnectOptions,
}

impl LimitConn for HeldLender {
    type Conn = platformkit_limit::driver::SqlxConn<
        tokio::sync::OwnedMappedMutexGuard<Option<sqlx::PgConnection>, sqlx::PgConnection>,
    >;
    type Error = sqlx::Error;

    async fn conn(&self) -> Result<Self::Conn, sqlx::Error> {
        let mut held = self.held.clone().lock_owned().await;
        if let Some(conn) = held.as_mut()
            && conn.ping().await.is_err()
        {
            *held = None;
        }
        if held.is_none() {
            *held = Some(sqlx::PgConnection::connect_with(&self.options).await?);
        }
        Ok(platformkit_limit::driver::SqlxConn(
            tokio::sync::OwnedMutexGuard::map(held, |held| {
                held.as_mut().expect("connected just above")
            }),
        ))
    }
}

/// sqlx's connection options for the same server, user and database: the
/// drivers' matrix's.
use crate::drivers::driver::sqlx08::sqlx_options;

/// sqlx 0.9's `PgPool` (feature `sqlx-09`).
#[cfg(feature = "sqlx-09")]
struct SqlxPool09;

#[cfg(feature = "sqlx-09")]
impl Source for SqlxPool09 {
    type Conns = sqlx_09::PgPool;

    async fn conns(config: &Config, size: u32) -> sqlx_09::PgPool {
        use crate::drivers::driver::sqlx09::sqlx_options;
        sqlx_09::postgres::PgPoolOptions::new()
            .max_connections(size)
            .min_connections(0)
            .connect_lazy_with(sqlx_options(config))
    }

    async fn set_defaults(pool: &sqlx_09::PgPool) {
        let mut conn = pool.acquire().await.expect("the pooled connection");
        sqlx_09::Executor::execute(&mut *conn, sqlx_09::raw_sql(SERIALIZABLE_DEFAULTS))
            .await
            .expect("the defaults");
    }
}

/// A limiter over a cold `S` for `db` (as `config`), with [`BUDGET`].
async fn cold<S: Source>(config: &Config, size: u32) -> Limiter<Postgres<S::Conns>> {
    let store = S::store(S::conns(config, size).await, config);
    Limiter::builder(store)
        .budget(BUDGET)
        .build()
        .expect("a budget")
}

/// `login` (max 1) with alice's key at max, counted by another replica.
async fn at_max(db: &TestDb) -> (Limit, Key) {
    let login = common::limit("login", 1);
    let alice = Key::email("alice@example.com");
    let replica = Limiter::new(Postgres::new(db.config()));
    let verdict = replica.failed(&login, &alice).await.expect("a verdict");
    assert_eq!(verdict.count(), Some(1), "alice at max");
    (login, alice)
}

/// hit, failed and check of `key`, at max under `limit`, each refused
/// (counted, shed, or a hard error the call reports), never allowed and
/// never read as an outage, within the budget (and a probe).
async fn never_allowed<C: LimitConn>(
    limiter: &Limiter<Postgres<C>>,
    limit: &Limit,
    key: &Key,
    what: &str,
) {
    for op in ["hit", "failed", "check"] {
        let call = async {
            match op {
                "hit" => limiter.hit(limit, key).await,
                "failed" => limiter.failed(limit, key).await,
                _ => limiter.check(limit, key).await,
            }
        };
        let (answer, _) = timed(BUDGET + PROBE + SLACK, what, call).await;
        match answer {
            Ok(verdict) => assert!(
                verdict.is_refused() && !verdict.is_unreachable(),
                "{what}: {op} of a key at max: {verdict:?}"
            ),
            // A hard error (a session setting refused, a cancel read as
            // another's) allows nothing either.
            Err(e) => assert!(!e.is_unreachable(), "{what}: {op}: {e:?}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Up: the server answers the probe, so nothing is allowed
// ---------------------------------------------------------------------------

/// Where the three transaction defaults that make every transaction wait
/// for a safe snapshot are set.
#[derive(Clone, Copy, Debug)]
enum Defaults {
    /// `ALTER ROLE`, as the limiter's role may do to itself.
    Role,
    /// `ALTER DATABASE`, as the database owner may.
    Database,
}

/// SERIALIZABLE, READ ONLY and DEFERRABLE by default for the limiter's role
/// or database, while a login granted nothing holds a serializable
/// read-write transaction in another database: every transaction of the
/// limiter's waits for a safe snapshot, before any line of its routine
/// runs. Load the attacker caused: shed, never allowed.
async fn serializable_defaults_with_a_strangers_transaction<S: Source>(defaults: Defaults) {
    let db = Server::shared().database(SCHEMA).await;
    let (login, alice) = at_max(&db).await;
    let target = match defaults {
        Defaults::Role => format!("ROLE limit_owner IN DATABASE \"{}\"", db.name()),
        Defaults::Database => format!("DATABASE \"{}\"", db.name()),
    };
    db.connect()
        .await
        .batch_execute(&format!(
            "ALTER {target} SET default_transaction_isolation = 'serializable';
             ALTER {target} SET default_transaction_read_only = on;
             ALTER {target} SET default_transaction_deferrable = on;"
        ))
        .await
        .expect("the defaults, as the owner sets them");
    let mut elsewhere = db.stranger_config();
    elsewhere.dbname("postgres");
    let stranger = platformkit_limit_testdb::connect(&elsewhere).await;
    stranger
        .batch_execute("BEGIN ISOLATION LEVEL SERIALIZABLE READ WRITE; SELECT 1")
        .await
        .expect("a stranger's serializable transaction");

    let limiter = cold::<S>(&db.config(), 2).await;
    never_allowed(&limiter, &login, &alice, &format!("{defaults:?} defaults")).await;
    drop(stranger);
}

/// The same three defaults set by the service's own code on its pooled
/// connection (a pool of one, so the limiter gets that connection).
async fn serializable_defaults_set_on_a_pooled_connection<S: Source>() {
    let db = Server::shared().database(SCHEMA).await;
    let (login, alice) = at_max(&db).await;
    let limiter = cold::<S>(&db.config(), 1).await;
    // The service's own query: one check through the pool opens its one
    // connection; the service then sets the defaults on a connection of
    // its own pool, the same one.
    let _ = limiter.check(&login, &Key::opaque("warm")).await;
    S::set_defaults(limiter.store().conns()).await;
    let mut elsewhere = db.stranger_config();
    elsewhere.dbname("postgres");
    let stranger = platformkit_limit_testdb::connect(&elsewhere).await;
    stranger
        .batch_execute("BEGIN ISOLATION LEVEL SERIALIZABLE READ WRITE; SELECT 1")
        .await
        .expect("a stranger's serializable transaction");
    never_allowed(
        &limiter,
        &login,
        &alice,
        "defaults SET on a pooled connection",
    )
    .await;
    drop(stranger);
}

const SERIALIZABLE_DEFAULTS: &str = "SET default_transaction_isolation = 'serializable';
     SET default_transaction_read_only = on;
     SET default_transaction_deferrable = on;";

/// A fresh database whose every connection slot is taken by a login granted
/// nothing (its connection limit is two: the superuser's and the
/// stranger's, both held until the second value drops): every further
/// connection is refused with `53300`.
async fn every_slot_taken_by_a_stranger()
-> (TestDb, (tokio_postgres::Client, tokio_postgres::Client)) {
    let db = Server::shared().database(SCHEMA).await;
    let admin = db.connect_admin().await;
    let stranger = platformkit_limit_testdb::connect(&db.stranger_config()).await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" CONNECTION LIMIT 2",
            db.name()
        ))
        .await
        .expect("a connection limit");
    (db, (admin, stranger))
}

/// Every connection slot held by a login granted nothing, on a replica that
/// starts during the flood (a cold source that was never answered): the
/// server refuses each connection with `53300` (bb8 and sqlx retry it in
/// silence), and answers the probe so: shed, never allowed.
async fn every_slot_taken_on_a_cold_replica<S: Source>() {
    let (db, taken) = every_slot_taken_by_a_stranger().await;
    let limiter = cold::<S>(&db.config(), 2).await;
    let login = common::limit("login", 1);
    for n in 0..3 {
        let key = Key::email(&format!("user{n}@example.com"));
        let (verdict, _) = timed(
            BUDGET + PROBE + SLACK,
            "every slot taken",
            limiter.hit(&login, &key),
        )
        .await;
        common::assert_shed(&verdict.expect("a verdict"), "every slot taken");
    }
    drop(taken);
}

/// The shared lock table filled by a login granted nothing (session
/// advisory locks, PUBLIC's to take, until the server says `53200`), on a
/// server of its own and a cold replica: a new connection or a statement
/// of the limiter's is refused with `53200`, and the probe hears the
/// server answer, so every call is shed (or counted), never allowed.
async fn the_lock_table_full_on_a_cold_replica<S: Source>() {
    let server = block_in_place(|| Server::start(Options::default()));
    let db = server.database(SCHEMA).await;
    let (login, alice) = at_max(&db).await;
    let stranger = platformkit_limit_testdb::connect(&db.stranger_config()).await;
    let full = stranger
        .batch_execute(
            "SELECT pg_catalog.pg_advisory_lock(g) FROM pg_catalog.generate_series(1, 10000000) AS g",
        )
        .await
        .expect_err("the lock table fills before ten million locks");
    assert_eq!(full.code().map(|c| c.code()), Some("53200"), "{full:?}");
    let limiter = cold::<S>(&db.config(), 2).await;
    never_allowed(&limiter, &login, &alice, "the lock table full").await;
    drop((stranger, limiter, db));
    block_in_place(|| drop(server));
}

/// A backend stopped (SIGSTOP) while it holds the limiter's pooled
/// connection: its calls get no answer; the server answers the probe, so
/// they are shed, never allowed.
async fn a_stopped_backend<S: Source>() {
    let db = Server::shared().database(SCHEMA).await;
    let (login, alice) = at_max(&db).await;
    let limiter = cold::<S>(&db.config(), 1).await;
    let _ = limiter.check(&login, &Key::opaque("warm")).await;
    let admin = db.connect_admin().await;
    let pids: Vec<i32> = admin
        .query(
            "SELECT pid FROM pg_catalog.pg_stat_activity
             WHERE datname = $1 AND usename = 'limit_owner' AND pid <> pg_backend_pid()",
            &[&db.name()],
        )
        .await
        .expect("the limiter's backends")
        .iter()
        .map(|row| row.get(0))
        .collect();
    for pid in &pids {
        signal("STOP", *pid);
    }
    never_allowed(&limiter, &login, &alice, "a stopped backend").await;
    for pid in &pids {
        signal("CONT", *pid);
    }
}

/// Sends signal `name` to the backend `pid`; one that has exited since it
/// was listed (a connection made for one call and closed) is left alone.
fn signal(name: &str, pid: i32) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("kill");
    let gone = !std::path::Path::new(&format!("/proc/{pid}")).exists();
    assert!(status.success() || gone, "kill -{name} {pid}");
}

/// The limiter's pooled backend terminated (`57P01`, as a role that may
/// signal it can): the server is up, so the call is counted on a new
/// connection or shed, never allowed uncounted.
async fn a_terminated_backend<S: Source>() {
    let db = Server::shared().database(SCHEMA).await;
    let (login, alice) = at_max(&db).await;
    let limiter = cold::<S>(&db.config(), 1).await;
    let _ = limiter.check(&login, &Key::opaque("warm")).await;
    db.connect_admin()
        .await
        .batch_execute(&format!(
            "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
             WHERE datname = '{}' AND usename = 'limit_owner' AND pid <> pg_backend_pid()",
            db.name()
        ))
        .await
        .expect("terminated");
    never_allowed(&limiter, &login, &alice, "a terminated backend").await;
}

/// A link with a 50 ms round trip: every call is counted, none read as an
/// outage.
async fn a_distant_server<S: Source>() {
    let db = Server::shared().database(SCHEMA).await;
    let (login, alice) = at_max(&db).await;
    let server = db.config();
    let port = server.get_ports().first().copied().expect("a port");
    let proxy = common::latency::Delayed::to(port, Duration::from_millis(25)).await;
    let mut config = Config::new();
    config
        .host("127.0.0.1")
        .port(proxy.port)
        .user(server.get_user().expect("a user"))
        .dbname(server.get_dbname().expect("a database"));
    if let Some(password) = server.get_password() {
        config.password(password);
    }
    let store = S::store(S::conns(&config, 2).await, &config);
    let limiter = Limiter::builder(store)
        .budget(Duration::from_secs(2))
        .build()
        .expect("a budget");
    never_allowed(&limiter, &login, &alice, "a 50 ms round trip").await;
    let bob = Key::email("bob@example.com");
    let verdict = limiter.failed(&login, &bob).await.expect("a verdict");
    common::assert_counted(&verdict, "a call over a 50 ms round trip");
}

// ---------------------------------------------------------------------------
// Down: no answer at the transport; then the breaker
// ---------------------------------------------------------------------------

/// The server stopped: the first call is answered by its limit's
/// `WhenUnreachable` once the probe finds no answer; while that answer
/// stands, every call is answered at once (none waits its budget); once the
/// server is back, calls count again within one probe interval, and the
/// count from before is there.
async fn a_stopped_then_restarted_server<S: Source>() {
    let server = block_in_place(|| Server::start(Options::default()));
    let db = server.database(SCHEMA).await;
    let login = common::limit("login", 5);
    let strict = Limit::builder("strict", 5, common::LONG_WINDOW)
        .when_unreachable(WhenUnreachable::Refuse)
        .build()
        .expect("a limit");
    let alice = Key::email("alice@example.com");
    let limiter = cold::<S>(&db.config(), 2).await;
    let verdict = limiter.failed(&login, &alice).await.expect("a verdict");
    common::assert_counted(&verdict, "before the stop");

    block_in_place(|| server.pg_ctl(&["stop", "-m", "fast", "-w"]));
    let (verdict, _) = timed(
        BUDGET + PROBE + SLACK,
        "the first call after the stop",
        limiter.failed(&login, &alice),
    )
    .await;
    assert_down(&verdict.expect("a verdict"), true, "the first call");
    // Answered at once: a call that waited its budget would take BUDGET.
    for n in 0..20 {
        let started = Instant::now();
        let verdict = limiter.failed(&strict, &alice).await.expect("a verdict");
        assert_down(&verdict, false, "a call while down");
        assert!(
            started.elapsed() < BUDGET,
            "call {n} waited {:?} while the server was known down",
            started.elapsed()
        );
    }

    block_in_place(|| server.pg_ctl(&["start", "-w"]));
    tokio::time::sleep(PROBE).await;
    let (verdict, _) = timed(
        BUDGET + PROBE + SLACK,
        "after the restart",
        limiter.failed(&login, &alice),
    )
    .await;
    let verdict = verdict.expect("a verdict");
    common::assert_counted(&verdict, "within one probe interval of the restart");
    assert_eq!(verdict.count(), Some(2), "the count outlived the stop");
    drop(limiter);
    block_in_place(|| drop(server));
}

#[track_caller]
fn assert_down(verdict: &Verdict, allowed: bool, what: &str) {
    assert!(
        verdict.is_unreachable() && verdict.is_allowed() == allowed,
        "{what}: expected unreachable and allowed = {allowed}, got {verdict:?}"
    );
}

macro_rules! on_every_source {
    ($($source:ident: $name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn serializable_defaults_of_the_role_and_a_strangers_transaction_are_never_allowed() {
                serializable_defaults_with_a_strangers_transaction::<$source>(Defaults::Role).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn serializable_defaults_of_the_database_and_a_strangers_transaction_are_never_allowed() {
                serializable_defaults_with_a_strangers_transaction::<$source>(Defaults::Database).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn every_slot_taken_by_a_stranger_is_shed_on_a_cold_replica() {
                every_slot_taken_on_a_cold_replica::<$source>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_lock_table_full_is_never_allowed_on_a_cold_replica() {
                the_lock_table_full_on_a_cold_replica::<$source>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_stopped_backend_is_never_allowed() {
                a_stopped_backend::<$source>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_terminated_backend_is_never_allowed() {
                a_terminated_backend::<$source>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_50_ms_round_trip_is_counted() {
                a_distant_server::<$source>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_stopped_server_is_answered_at_once_after_the_first_probe_and_counts_again_once_back() {
                a_stopped_then_restarted_server::<$source>().await;
            }
        }
    )*};
}

on_every_source! {
    PerCall: on_tokio_postgres,
    Deadpool: on_deadpool,
    Bb8: on_bb8,
    SqlxPool: on_sqlx_pool,
    SqlxHeld: on_sqlx_held,
}

macro_rules! on_every_pool {
    ($($source:ident: $name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn serializable_defaults_set_on_a_pooled_connection_are_never_allowed() {
                serializable_defaults_set_on_a_pooled_connection::<$source>().await;
            }
        }
    )*};
}

mod pooled {
    use super::*;

    on_every_pool! {
        Deadpool: on_deadpool,
        Bb8: on_bb8,
        SqlxPool: on_sqlx_pool,
    }

    #[cfg(feature = "sqlx-09")]
    on_every_pool! {
        SqlxPool09: on_sqlx_09_pool,
    }
}

#[cfg(feature = "sqlx-09")]
on_every_source! {
    SqlxPool09: on_sqlx_09_pool,
}

// ---------------------------------------------------------------------------
// Over TLS: the cancel request cannot go (tokio-postgres sends it without
// TLS, which `sslmode=require` refuses), so only the probe tells
// ---------------------------------------------------------------------------

/// A server of its own with TLS on (a certificate for 127.0.0.1, from a
/// certificate authority of the test's), and a source that connects for each call over TLS,
/// requiring it, with rustls.
async fn over_tls(
    server: &Server,
) -> (
    TestDb,
    platformkit_limit::driver::Connect<tokio_postgres_rustls::MakeRustlsConnect>,
) {
    let db = server.database(SCHEMA).await;
    let admin = db.connect_admin().await;
    // Run by the server, in its data directory, as its own user: the key
    // is the server's, readable by it alone.
    for step in [
        "COPY (SELECT 1) TO PROGRAM 'exec 2>/dev/null; \
         openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca \
             -keyout ca.key -out ca.crt \
         && openssl req -newkey rsa:2048 -nodes -subj /CN=localhost \
             -keyout server.key -out server.csr \
         && echo subjectAltName=IP:127.0.0.1 > server.ext \
         && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
             -days 1 -extfile server.ext -out server.crt \
         && chmod 600 server.key'",
        "ALTER SYSTEM SET ssl = on",
        "SELECT pg_catalog.pg_reload_conf()",
    ] {
        admin
            .batch_execute(step)
            .await
            .unwrap_or_else(|e| panic!("{step}: {e:?}"));
    }
    let started = Instant::now();
    loop {
        let ssl: String = admin
            .query_one("SHOW ssl", &[])
            .await
            .expect("SHOW ssl")
            .get(0);
        if ssl == "on" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "TLS still off");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pem: String = admin
        .query_one("SELECT pg_catalog.pg_read_file('ca.crt')", &[])
        .await
        .expect("the certificate")
        .get(0);
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).expect("a PEM"))
        .expect("a root");
    let tls = trusting(roots);
    let mut config = db.config();
    config.ssl_mode(tokio_postgres::config::SslMode::Require);
    let conns = platformkit_limit::driver::Connect::new(
        config,
        tokio_postgres_rustls::MakeRustlsConnect::new(tls),
    );
    (db, conns)
}

/// A rustls client that trusts `roots`, with ring as its provider.
#[expect(
    deprecated,
    reason = "ring's provider lacks post-quantum key exchange, which a test on loopback does not need"
)]
fn trusting(roots: rustls::RootCertStore) -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth()
}

mod on_tokio_postgres_over_tls {
    use super::*;

    /// A certificate the connector refuses is the server answering: a
    /// misconfiguration, loud, never read as an outage.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_certificate_the_connector_refuses_is_a_misconfiguration_never_an_allow() {
        let server = block_in_place(|| Server::start(Options::default()));
        let (db, _) = over_tls(&server).await;
        let trusts_nothing = trusting(rustls::RootCertStore::empty());
        let mut config = db.config();
        config.ssl_mode(tokio_postgres::config::SslMode::Require);
        let conns = platformkit_limit::driver::Connect::new(
            config,
            tokio_postgres_rustls::MakeRustlsConnect::new(trusts_nothing),
        );
        let limiter = Limiter::builder(Postgres::new(conns))
            .budget(BUDGET)
            .build()
            .expect("a budget");
        let login = common::limit("login", 1);
        let err = limiter
            .failed(&login, &Key::email("alice@example.com"))
            .await
            .expect_err("a misconfiguration");
        assert_eq!(err.kind(), ErrorKind::Misconfigured, "{err:?}");
        drop((limiter, db));
        block_in_place(|| drop(server));
    }

    /// Calls count over TLS; under the serializable defaults, with a
    /// stranger's serializable transaction, each call waits past its
    /// budget and its cancel request cannot go: the server answers the
    /// probe (over TLS), so the call is shed, never allowed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serializable_defaults_of_the_role_and_a_strangers_transaction_are_never_allowed() {
        let server = block_in_place(|| Server::start(Options::default()));
        let (db, conns) = over_tls(&server).await;
        let limiter = Limiter::builder(Postgres::new(conns))
            .budget(BUDGET)
            .build()
            .expect("a budget");
        let login = common::limit("login", 1);
        let alice = Key::email("alice@example.com");
        let verdict = limiter.failed(&login, &alice).await.expect("a verdict");
        common::assert_counted(&verdict, "a call over TLS");

        db.connect_admin()
            .await
            .batch_execute(&format!(
                "ALTER ROLE limit_owner IN DATABASE \"{db}\" SET default_transaction_isolation = 'serializable';
                 ALTER ROLE limit_owner IN DATABASE \"{db}\" SET default_transaction_read_only = on;
                 ALTER ROLE limit_owner IN DATABASE \"{db}\" SET default_transaction_deferrable = on;",
                db = db.name()
            ))
            .await
            .expect("the defaults");
        let mut elsewhere = db.stranger_config();
        elsewhere.dbname("postgres");
        let stranger = platformkit_limit_testdb::connect(&elsewhere).await;
        stranger
            .batch_execute("BEGIN ISOLATION LEVEL SERIALIZABLE READ WRITE; SELECT 1")
            .await
            .expect("a stranger's serializable transaction");
        never_allowed(&limiter, &login, &alice, "over TLS").await;
        drop((stranger, limiter, db));
        block_in_place(|| drop(server));
    }
}

// ---------------------------------------------------------------------------
// The probe's table, the rows no fault above reaches
// ---------------------------------------------------------------------------

mod the_probes_table {
    use super::*;

    /// A source that never lends a connection: every call runs out of its
    /// budget unanswered, and only its probe tells.
    fn never()
    -> impl Fn()
        -> std::future::Pending<Result<Box<tokio_postgres::Client>, std::convert::Infallible>>
    + Send
    + Sync
    + 'static {
        std::future::pending
    }

    /// A startup the server refuses with a SQLSTATE other than its going
    /// away (here `28000`, a role that does not exist) is an answer: up,
    /// so the call is shed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_startup_refused_with_a_sqlstate_is_up_and_the_call_is_shed() {
        let db = Server::shared().database(SCHEMA).await;
        let mut nobody = db.config();
        nobody.user("no_such_role_at_all");
        let limiter = Limiter::builder(Postgres::new(never()).with_probe(nobody))
            .budget(BUDGET)
            .build()
            .expect("a budget");
        let login = common::limit("login", 1);
        let (verdict, _) = timed(
            BUDGET + PROBE + SLACK,
            "a role that does not exist",
            limiter.hit(&login, &Key::email("alice@example.com")),
        )
        .await;
        common::assert_shed(&verdict.expect("a verdict"), "28000 at startup");
    }

    /// A server that says it is shutting down (`57P03`, a smart shutdown
    /// waiting for its sessions) is down: the limit's `WhenUnreachable`
    /// answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_shutting_down_is_down() {
        let server = block_in_place(|| Server::start(Options::default()));
        let db = server.database(SCHEMA).await;
        // A session that keeps the smart shutdown waiting.
        let held = db.connect_admin().await;
        block_in_place(|| server.pg_ctl(&["stop", "-m", "smart", "-W"]));
        let started = Instant::now();
        loop {
            match db.config().connect(tokio_postgres::NoTls).await {
                Err(e) if e.code().map(|c| c.code()) == Some("57P03") => break,
                _ => {
                    assert!(
                        started.elapsed() < Duration::from_secs(10),
                        "not shutting down"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        let limiter = Limiter::builder(Postgres::new(never()).with_probe(db.config()))
            .budget(BUDGET)
            .build()
            .expect("a budget");
        let login = common::limit("login", 1);
        let (verdict, _) = timed(
            BUDGET + PROBE + SLACK,
            "a server shutting down",
            limiter.hit(&login, &Key::email("alice@example.com")),
        )
        .await;
        assert_down(&verdict.expect("a verdict"), true, "57P03 at startup");
        drop((held, limiter, db));
        block_in_place(|| drop(server));
    }
}
