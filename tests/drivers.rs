//! The behaviour tests, each written once and run on each driver the limiter
//! speaks: tokio-postgres connections and sqlx connections (`SqlxConn`,
//! `sqlx::PgPool`).
//!
//! Each body is a function generic over [`Driver`]; the macro at the end
//! runs it as `on_tokio_postgres::NAME` and `on_sqlx::NAME`. What a driver
//! cannot do is one constant, [`Driver::CANCELS`]: sqlx keeps the cancel key
//! private, so a slow call is not stopped on the server, and the body says
//! what happens instead.
//!
//! The tests inspect connections with the simple query protocol (and the
//! superuser's `pg_stat_activity`), which works on either driver and through
//! PgBouncer in transaction mode.

#[path = "drivers/hostile_keys.rs"]
mod hostile_keys;

use std::any::Any;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use platformkit_limit::{
    ErrorKind, Key, Limit, LimitConn, Limiter, ManualClock, Postgres, Reservation, SCHEMA,
    SqlxConn, Strategy, Verdict, purge,
};
use platformkit_limit_testdb::{PgBouncer, Server, TestDb};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgConnection, PgPool, Row as _};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio::time::{Instant, sleep};
use tokio_postgres::config::Host;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, SimpleQueryMessage};

/// A window long enough that no test straddles two windows of the database's
/// clock.
const LONG_WINDOW: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// The budget of the tests that make the store unreachable or slow.
const BUDGET: Duration = Duration::from_millis(500);

/// How much longer than its budget a call may take: scheduling on a busy
/// machine. A call that ignored its budget would take as long as the fault
/// lasts (forever, for a held lock or an exhausted pool).
const SLACK: Duration = Duration::from_millis(1500);

// ---------------------------------------------------------------------------
// The drivers
// ---------------------------------------------------------------------------

/// What a test needs of a driver: its connections, a pool of them, and plain
/// SQL on a held one.
trait Driver: 'static {
    /// Whether a call still unanswered near its deadline is cancelled on
    /// the server.
    const CANCELS: bool;

    /// Whether its statements are named prepared statements, which only a
    /// PgBouncer that carries them (1.21 or newer) can pass on.
    const PREPARES: bool;

    /// One connection of the driver.
    type Conn: Send + 'static;

    /// The driver's pool (deadpool for tokio-postgres, `PgPool` for sqlx).
    type Pool: LimitConn + Clone + 'static;

    /// A source that makes its own connections: a `Config` (a connection per
    /// call) for tokio-postgres, a `PgPool` for sqlx.
    type Source: LimitConn + 'static;

    async fn connect(config: &Config) -> Self::Conn;

    async fn pool(config: &Config, size: u32) -> Self::Pool;

    /// Takes one connection out of `pool` and keeps it until dropped.
    async fn take(pool: &Self::Pool) -> Box<dyn Any + Send>;

    fn source(config: &Config) -> Self::Source;

    /// Runs `sql` (one or more statements) with the simple query protocol
    /// and returns the first column of its first row, as text.
    async fn simple(conn: &mut Self::Conn, sql: &str) -> Result<Option<String>, String>;
}

/// tokio-postgres: `Client`s, deadpool, `Config`.
struct TokioPostgres;

impl Driver for TokioPostgres {
    const CANCELS: bool = true;
    const PREPARES: bool = false;
    type Conn = Client;
    type Pool = deadpool_postgres::Pool;
    type Source = Config;

    async fn connect(config: &Config) -> Client {
        platformkit_limit_testdb::connect(config).await
    }

    async fn pool(config: &Config, size: u32) -> deadpool_postgres::Pool {
        let manager = deadpool_postgres::Manager::new(config.clone(), tokio_postgres::NoTls);
        deadpool_postgres::Pool::builder(manager)
            .max_size(size as usize)
            .build()
            .expect("a deadpool pool")
    }

    async fn take(pool: &deadpool_postgres::Pool) -> Box<dyn Any + Send> {
        Box::new(pool.get().await.expect("a pooled connection"))
    }

    fn source(config: &Config) -> Config {
        config.clone()
    }

    async fn simple(conn: &mut Client, sql: &str) -> Result<Option<String>, String> {
        let messages = conn.simple_query(sql).await.map_err(|e| format!("{e:?}"))?;
        Ok(messages
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_owned)),
                _ => None,
            })
            .flatten())
    }
}

/// sqlx: `PgConnection`s in a `SqlxConn`, `PgPool`.
struct Sqlx;

/// sqlx's connection options for the same server, user and database.
fn sqlx_options(config: &Config) -> PgConnectOptions {
    let mut options = PgConnectOptions::new_without_pgpass()
        .port(config.get_ports().first().copied().unwrap_or(5432))
        .username(config.get_user().expect("a user"))
        .database(config.get_dbname().expect("a database"));
    options = match config.get_hosts().first().expect("a host") {
        Host::Tcp(host) => options.host(host),
        Host::Unix(path) => options.socket(path),
    };
    if let Some(password) = config.get_password() {
        options = options.password(std::str::from_utf8(password).expect("a UTF-8 password"));
    }
    options.disable_statement_logging()
}

impl Driver for Sqlx {
    const CANCELS: bool = false;
    const PREPARES: bool = true;
    type Conn = PgConnection;
    type Pool = PgPool;
    type Source = PgPool;

    async fn connect(config: &Config) -> PgConnection {
        sqlx_options(config)
            .connect()
            .await
            .expect("an sqlx connection")
    }

    async fn pool(config: &Config, size: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(size)
            .connect_lazy_with(sqlx_options(config))
    }

    async fn take(pool: &PgPool) -> Box<dyn Any + Send> {
        Box::new(pool.acquire().await.expect("a pooled connection"))
    }

    fn source(config: &Config) -> PgPool {
        PgPoolOptions::new()
            .max_connections(4)
            .connect_lazy_with(sqlx_options(config))
    }

    async fn simple(conn: &mut PgConnection, sql: &str) -> Result<Option<String>, String> {
        // (sqlx 0.8's `RawSql::fetch_optional` fails on no rows.)
        let rows = sqlx::raw_sql(sql)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| format!("{e:?}"))?;
        // The simple protocol answers in text, whatever the column's type.
        Ok(rows.first().and_then(|row| {
            row.try_get_unchecked::<Option<String>, _>(0)
                .expect("a text value")
        }))
    }
}

/// One connection the test holds, lent to one call at a time, as a
/// framework holds the connection of a request.
type Held<D> = Arc<Mutex<<D as Driver>::Conn>>;

async fn hold<D: Driver>(config: &Config) -> Held<D> {
    Arc::new(Mutex::new(D::connect(config).await))
}

/// A connection source that lends one held connection.
struct Lend<T>(Arc<Mutex<T>>);

impl LimitConn for Lend<Client> {
    type Conn = OwnedMutexGuard<Client>;
    type Error = Infallible;

    async fn conn(&self) -> Result<Self::Conn, Infallible> {
        Ok(Arc::clone(&self.0).lock_owned().await)
    }
}

impl LimitConn for Lend<PgConnection> {
    type Conn = SqlxConn<OwnedMutexGuard<PgConnection>>;
    type Error = Infallible;

    async fn conn(&self) -> Result<Self::Conn, Infallible> {
        Ok(SqlxConn(Arc::clone(&self.0).lock_owned().await))
    }
}

fn lend<D: Driver>(held: &Held<D>) -> Lend<D::Conn>
where
    Lend<D::Conn>: LimitConn,
{
    Lend(Arc::clone(held))
}

/// `sql`'s one text value on the held connection.
async fn text<D: Driver>(held: &Held<D>, sql: &str) -> Option<String> {
    D::simple(&mut *held.lock().await, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The one integer `sql` (a query of one value) answers on the held
/// connection.
async fn int<D: Driver>(held: &Held<D>, sql: &str) -> i64 {
    text::<D>(held, &format!("SELECT ({sql})::text"))
        .await
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{sql}: no integer"))
}

async fn backend_pid<D: Driver>(held: &Held<D>) -> i32 {
    let pid = int::<D>(held, "SELECT pg_catalog.pg_backend_pid()::int8").await;
    i32::try_from(pid).expect("a pid")
}

/// The held connection answers, outside any transaction (each statement
/// then starts its own), and the system switch is off on it.
async fn assert_idle_and_switch_off<D: Driver>(held: &Held<D>, what: &str) {
    let idle = text::<D>(
        held,
        "SELECT (pg_catalog.transaction_timestamp() = pg_catalog.statement_timestamp())::text",
    )
    .await;
    assert_eq!(
        idle.as_deref(),
        Some("true"),
        "{what}: left inside a transaction"
    );
    let switch = text::<D>(
        held,
        "SELECT pg_catalog.current_setting('platformkit.system', true)",
    )
    .await;
    assert!(
        matches!(switch.as_deref(), None | Some("")),
        "{what}: the system switch outlived the limiter's transaction: {switch:?}"
    );
}

// ---------------------------------------------------------------------------
// Databases, limits, reads as the superuser
// ---------------------------------------------------------------------------

async fn fresh_db() -> TestDb {
    Server::shared().database(SCHEMA).await
}

fn limit(name: &str, max: u32) -> Limit {
    Limit::new(name, max, LONG_WINDOW).expect("a valid limit")
}

fn stored(limit: &Limit, key: &Key) -> String {
    format!("{}|{}", limit.name(), key.as_str())
}

/// Every key's total count, read as the superuser (who bypasses row-level
/// security).
async fn counts(db: &TestDb) -> BTreeMap<String, i64> {
    db.connect_admin()
        .await
        .query(
            "SELECT key, sum(count)::int8 FROM platformkit.platformkit_limits GROUP BY key",
            &[],
        )
        .await
        .expect("reading the counts")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// What PostgreSQL says the backend `pid` is doing: `idle`, `active`, `idle
/// in transaction`…, or `None` once it is gone.
async fn backend_state(admin: &Client, pid: i32) -> Option<String> {
    admin
        .query_opt(
            "SELECT state FROM pg_catalog.pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .expect("reading pg_stat_activity")
        .and_then(|row| row.get(0))
}

/// Waits up to `within` for `pid` to be in `state` (`None`: gone).
async fn wait_for_state(admin: &Client, pid: i32, state: Option<&str>, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = backend_state(admin, pid).await;
        if now.as_deref() == state {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "backend {pid} is {now:?}, not {state:?}, after {within:?}"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// Backends of `limit_owner` in the test's database waiting on a lock.
async fn owner_lock_waits(admin: &Client) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity \
             WHERE datname = pg_catalog.current_database() \
               AND usename = 'limit_owner' AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .expect("counting lock waits")
        .get(0)
}

/// Locks the key's row from a session of its own, as the system, until the
/// returned client rolls back or is dropped.
async fn lock_row(db: &TestDb, stored_key: &str) -> Client {
    let locker = db.connect().await;
    locker
        .batch_execute("BEGIN; SET LOCAL platformkit.system = 'on'")
        .await
        .expect("opening the locking transaction");
    let locked = locker
        .query(
            "SELECT count FROM platformkit.platformkit_limits WHERE key = $1 FOR UPDATE",
            &[&stored_key],
        )
        .await
        .expect("locking the row");
    assert_eq!(locked.len(), 1, "there was no row to lock");
    locker
}

/// Runs `call`, failing the test if it is still running after `bound`.
async fn timed<T>(bound: Duration, what: &str, call: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    match tokio::time::timeout(bound, call).await {
        Ok(output) => (output, started.elapsed()),
        Err(_) => panic!("{what}: still running after {bound:?}"),
    }
}

/// The verdict is "allowed, unreachable", for one of the reasons `kinds`.
#[track_caller]
fn assert_unreachable(verdict: &Verdict, kinds: &[ErrorKind], what: &str) {
    assert!(
        verdict.is_allowed() && verdict.is_unreachable(),
        "{what}: expected allowed because unreachable, got {verdict:?}"
    );
    let cause = verdict.unreachable().expect("a cause");
    assert!(kinds.contains(&cause.kind()), "{what}: {cause:?}");
    assert_eq!(verdict.count(), None, "{what}");
}

/// The verdict was counted by the store.
#[track_caller]
fn assert_counted(verdict: &Verdict, count: u64, what: &str) {
    assert!(
        !verdict.is_unreachable(),
        "{what}: unreachable: {:?}",
        verdict.unreachable()
    );
    assert_eq!(verdict.count(), Some(count), "{what}");
}

// ---------------------------------------------------------------------------
// Every operation, on a held connection and through the driver's pool
// ---------------------------------------------------------------------------

/// Every operation (each of the seven statements, with a pinned time and
/// without) gives the same counts and verdicts on either driver, and the
/// connection goes back idle after each.
async fn every_operation_counts_alike_on_either_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    let held = hold::<D>(&db.config()).await;
    // A pinned time a second before a window's edge: the timestamps travel
    // both ways, and the window rolls over when the clock moves on.
    let window = Duration::from_secs(60);
    let start = UNIX_EPOCH + window * 30_000_000 - Duration::from_secs(1);
    let clock = ManualClock::new(start);
    let limiter = Limiter::builder(Postgres::new(lend::<D>(&held)).with_clock(clock.clone()))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    let login = Limit::new("login", 2, window).unwrap();
    let sliding = Limit::builder("sliding", 2, window)
        .strategy(Strategy::Sliding)
        .build()
        .unwrap();
    let locked = Limit::builder("locked", 1, window)
        .lockout(Duration::from_secs(300))
        .build()
        .unwrap();
    let alice = Key::email("alice@example.com");
    let bob = Key::opaque("bob");

    assert_counted(&limiter.check(&login, &alice).await.unwrap(), 0, "check");
    assert_counted(&limiter.failed(&login, &alice).await.unwrap(), 1, "failed");
    let refused = limiter.failed(&login, &alice).await.unwrap();
    assert!(refused.is_refused());
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(refused.reopens_at(), Some(start + Duration::from_secs(1)));

    // hit and a sliding window across the edge.
    for n in 1..=2 {
        assert_counted(&limiter.hit(&sliding, &bob).await.unwrap(), n, "hit");
    }
    // A second past the edge the previous window still weighs 59/60: the
    // estimate is 3, one more ask fits, the next does not.
    clock.advance(Duration::from_secs(2));
    let after_edge = limiter.hit(&sliding, &bob).await.unwrap();
    assert_counted(&after_edge, 3, "hit after the edge");
    assert!(after_edge.is_allowed());
    let next = limiter.hit(&sliding, &bob).await.unwrap();
    assert_counted(&next, 4, "the next hit");
    assert!(next.is_refused());
    assert_counted(
        &limiter.check(&login, &alice).await.unwrap(),
        0,
        "a new window",
    );

    // A lockout read from an earlier window's row.
    assert!(limiter.failed(&locked, &alice).await.unwrap().is_refused());
    clock.advance(window);
    let still = limiter.check(&locked, &alice).await.unwrap();
    assert!(still.is_refused(), "the lockout outlasts its window");
    assert!(still.reopens_at().is_some());

    // reserve, then take the attempt back.
    match limiter.reserve(&login, &bob).await.unwrap() {
        Reservation::Granted(permit) => {
            assert_eq!(permit.verdict().count(), Some(1));
            permit.succeeded().await.unwrap();
        }
        Reservation::Refused(verdict) => panic!("refused: {verdict:?}"),
    }
    assert_counted(&limiter.check(&login, &bob).await.unwrap(), 0, "taken back");

    // Several limits in one statement: arrays of keys, windows, maxes. The
    // sliding pair's estimate weighs the 2 of the window before at 59/60.
    let pairs = [(&login, &alice), (&sliding, &bob), (&locked, &bob)];
    let verdicts = limiter.hit_all(&pairs).await.unwrap();
    let seen: Vec<_> = verdicts.iter().map(Verdict::count).collect();
    assert_eq!(seen, [Some(1), Some(3), Some(1)]);
    let verdicts = limiter.check_all(&pairs).await.unwrap();
    let seen: Vec<_> = verdicts.iter().map(Verdict::count).collect();
    assert_eq!(seen, [Some(1), Some(3), Some(1)]);
    assert!(verdicts.is_refused(), "locked reached its max of 1");

    // reset, then purge.
    limiter.reset(&login, &alice).await.unwrap();
    assert_counted(&limiter.check(&login, &alice).await.unwrap(), 0, "reset");
    assert_eq!(purge(&lend::<D>(&held)).await.unwrap(), 0);

    assert_idle_and_switch_off::<D>(&held, "after every operation").await;
}

/// Two limiters over one pool of one connection share one limit, and the
/// connection is idle between calls.
async fn a_pool_is_a_source_and_gets_its_connection_back_idle<D: Driver>() {
    let db = fresh_db().await;
    let admin = db.connect_admin().await;
    let pool = D::pool(&db.config(), 1).await;
    let one = Limiter::new(Postgres::new(pool.clone()));
    let two = Limiter::new(Postgres::new(pool.clone()));
    let login = limit("login", 2);
    let alice = Key::opaque("alice");

    assert_counted(&one.failed(&login, &alice).await.unwrap(), 1, "first");
    let backends = admin
        .query(
            "SELECT pid, state FROM pg_catalog.pg_stat_activity \
             WHERE datname = $1 AND usename = 'limit_owner'",
            &[&db.name()],
        )
        .await
        .expect("the pool's backends");
    let pids: Vec<(i32, Option<String>)> = backends.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(pids.len(), 1, "the pool's one backend: {pids:?}");
    let pid = pids[0].0;
    wait_for_state(&admin, pid, Some("idle"), Duration::from_secs(5)).await;
    let second = two.failed(&login, &alice).await.unwrap();
    assert_counted(&second, 2, "second, through the other limiter");
    assert!(second.is_refused());
    wait_for_state(&admin, pid, Some("idle"), Duration::from_secs(5)).await;
    assert_counted(&one.check(&login, &alice).await.unwrap(), 2, "check");
}

// ---------------------------------------------------------------------------
// Unreachable: allowed, loudly, within the budget
// ---------------------------------------------------------------------------

/// Nothing listens where the source points: every call is allowed,
/// unreachable, within the budget; a reset is an unreachable error.
async fn nothing_listening_is_unreachable_within_the_budget<D: Driver>() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let mut config = Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user("limit_owner")
        .dbname("nowhere");
    let limiter = Limiter::builder(Postgres::new(D::source(&config)))
        .budget(BUDGET)
        .build()
        .unwrap();
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    // tokio-postgres is refused at once (Connect); sqlx's pool retries a
    // refused connection until the budget ends it (Timeout).
    let unreachable = [ErrorKind::Connect, ErrorKind::Timeout];
    for op in ["check", "failed", "hit"] {
        let call = async {
            match op {
                "check" => limiter.check(&login, &alice).await,
                "failed" => limiter.failed(&login, &alice).await,
                _ => limiter.hit(&login, &alice).await,
            }
        };
        let (verdict, _) = timed(BUDGET + SLACK, op, call).await;
        assert_unreachable(&verdict.unwrap(), &unreachable, op);
    }
    let (reset, _) = timed(BUDGET + SLACK, "reset", limiter.reset(&login, &alice)).await;
    let err = reset.unwrap_err();
    assert!(err.is_unreachable(), "{err:?}");
}

/// A connection terminated between two calls: the next call is allowed,
/// unreachable (`Connect`), within the budget.
async fn a_terminated_connection_is_unreachable<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    let admin = db.connect_admin().await;
    let held = hold::<D>(&db.config()).await;
    let limiter = Limiter::builder(Postgres::new(lend::<D>(&held)))
        .budget(BUDGET)
        .build()
        .unwrap();
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    assert_counted(&limiter.failed(&login, &alice).await.unwrap(), 1, "before");

    let pid = backend_pid::<D>(&held).await;
    let terminated: bool = admin
        .query_one("SELECT pg_catalog.pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(terminated);
    wait_for_state(&admin, pid, None, Duration::from_secs(5)).await;

    let what = "a call on a terminated connection";
    let (verdict, _) = timed(BUDGET + SLACK, what, limiter.failed(&login, &alice)).await;
    assert_unreachable(&verdict.unwrap(), &[ErrorKind::Connect], what);
    assert_eq!(
        counts(&db).await,
        BTreeMap::from([(stored(&login, &alice), 1)])
    );
}

/// A connection killed while its call waits on a row lock: the call ends at
/// once, allowed, unreachable (`Connect`), long before its budget.
async fn a_connection_killed_mid_call_ends_at_once<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    // Long, so that only the kill can end the call early.
    const KILL_BUDGET: Duration = Duration::from_secs(5);
    let db = fresh_db().await;
    let admin = db.connect_admin().await;
    let held = hold::<D>(&db.config()).await;
    let pid = backend_pid::<D>(&held).await;
    let limiter = Limiter::builder(Postgres::new(lend::<D>(&held)))
        .budget(KILL_BUDGET)
        .build()
        .unwrap();
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    assert_counted(&limiter.failed(&login, &alice).await.unwrap(), 1, "before");

    let locker = lock_row(&db, &stored(&login, &alice)).await;
    let kill = async {
        let deadline = Instant::now() + KILL_BUDGET;
        loop {
            let waiting: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_catalog.pg_stat_activity \
                     WHERE pid = $1 AND wait_event_type = 'Lock'",
                    &[&pid],
                )
                .await
                .unwrap()
                .get(0);
            if waiting == 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the call never blocked on the lock"
            );
            sleep(Duration::from_millis(10)).await;
        }
        let terminated: bool = admin
            .query_one("SELECT pg_catalog.pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap()
            .get(0);
        assert!(terminated);
        Instant::now()
    };
    let call = async {
        let verdict = limiter.failed(&login, &alice).await;
        (verdict, Instant::now())
    };
    let what = "a call whose backend was killed";
    let (((verdict, ended), killed_at), took) = timed(KILL_BUDGET + SLACK, what, async {
        tokio::join!(call, kill)
    })
    .await;
    assert_unreachable(&verdict.unwrap(), &[ErrorKind::Connect], what);
    assert!(took < KILL_BUDGET, "the call took {took:?}");
    assert!(
        ended - killed_at < SLACK,
        "the call ended {:?} after its backend was killed",
        ended - killed_at
    );
    locker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        counts(&db).await,
        BTreeMap::from([(stored(&login, &alice), 1)]),
        "the killed call counted nothing"
    );
}

/// A pool of one whose connection is held elsewhere: the call is allowed,
/// unreachable (`Timeout`), once the budget is spent, never a hang; once
/// the connection is back, calls count again.
async fn an_exhausted_pool_is_unreachable_within_the_budget<D: Driver>() {
    let db = fresh_db().await;
    let pool = D::pool(&db.config(), 1).await;
    let limiter = Limiter::builder(Postgres::new(pool.clone()))
        .budget(BUDGET)
        .build()
        .unwrap();
    let login = limit("login", 3);
    let alice = Key::opaque("starved");

    let taken = D::take(&pool).await;
    let what = "an exhausted pool";
    let (verdict, took) = timed(BUDGET + SLACK, what, limiter.failed(&login, &alice)).await;
    assert_unreachable(&verdict.unwrap(), &[ErrorKind::Timeout], what);
    assert!(took >= BUDGET, "gave up early, after {took:?}");
    drop(taken);

    let (verdict, _) = timed(BUDGET + SLACK, "after", limiter.failed(&login, &alice)).await;
    assert_counted(&verdict.unwrap(), 1, "once the connection is back");
}

// ---------------------------------------------------------------------------
// The budget on the server
// ---------------------------------------------------------------------------

/// A row lock another session holds past the server's part of the budget:
/// the server ends the wait (`lock_timeout`) before the client gives up, as
/// a `LockTimeout` error, never an allow; nothing waits on after, the
/// connection is idle with the switch off, and the next call counts.
async fn a_held_row_lock_is_a_lock_timeout_on_either_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    let admin = db.connect_admin().await;
    let held = hold::<D>(&db.config()).await;
    let limiter = Limiter::builder(Postgres::new(lend::<D>(&held)))
        .budget(BUDGET)
        .build()
        .unwrap();
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    assert_counted(&limiter.failed(&login, &alice).await.unwrap(), 1, "before");

    let locker = lock_row(&db, &stored(&login, &alice)).await;
    let (result, _) = timed(BUDGET + SLACK, "held lock", limiter.failed(&login, &alice)).await;
    let err = result.expect_err("a held lock gave a verdict");
    assert_eq!(err.kind(), ErrorKind::LockTimeout, "{err:?}");
    assert_eq!(err.code(), Some(&SqlState::LOCK_NOT_AVAILABLE));
    assert!(!err.is_unreachable());

    // The server gave up the wait by itself, lock still held.
    let deadline = Instant::now() + Duration::from_secs(2);
    while owner_lock_waits(&admin).await > 0 {
        assert!(Instant::now() < deadline, "the limiter's call still waits");
        sleep(Duration::from_millis(20)).await;
    }
    assert_idle_and_switch_off::<D>(&held, "after the lock timeout").await;

    locker.batch_execute("ROLLBACK").await.unwrap();
    assert_counted(&limiter.failed(&login, &alice).await.unwrap(), 2, "after");
}

/// A server slow for reasons no `lock_timeout` covers (every write sleeps
/// 0.8 s): the call is allowed, unreachable (`Timeout`), within its budget
/// of 0.3 s on either driver.
///
/// tokio-postgres cancels the `CALL` on the server before the deadline:
/// nothing is written and the connection is idle at once. sqlx cannot: the
/// `CALL` goes on alone and commits, so the failure the verdict did not
/// count is in the table after all, and the connection's next statement
/// waits for it. Either way the connection goes back idle, the switch off.
async fn a_slow_call_ends_within_the_budget_and_says_whether_the_server_stopped<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute(
            "CREATE FUNCTION slow_write() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 PERFORM pg_sleep(0.8);
                 RETURN NEW;
             END
             $$;
             CREATE TRIGGER slow_write BEFORE INSERT OR UPDATE ON platformkit.platformkit_limits
                 FOR EACH ROW EXECUTE FUNCTION slow_write();",
        )
        .await
        .unwrap();
    let held = hold::<D>(&db.config()).await;
    let budget = Duration::from_millis(300);
    let limiter = Limiter::builder(Postgres::new(lend::<D>(&held)))
        .budget(budget)
        .build()
        .unwrap();
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");

    let (verdict, took) = timed(budget + SLACK, "slow", limiter.failed(&login, &alice)).await;
    let verdict = verdict.unwrap();
    assert_unreachable(&verdict, &[ErrorKind::Timeout], "a slow call");
    assert!(took < budget + SLACK, "took {took:?}");
    let cause = verdict.unreachable().unwrap();
    if D::CANCELS {
        assert_eq!(
            cause.code(),
            Some(&SqlState::QUERY_CANCELED),
            "the server stopped the call at the limiter's cancel request"
        );
    } else {
        assert_eq!(
            cause.code(),
            None,
            "the client gave up; the server did not stop"
        );
    }

    // The connection's next statement comes after the limiter's (cancelled,
    // or finished alone).
    assert_idle_and_switch_off::<D>(&held, "after the slow call").await;
    let written = if D::CANCELS { 0 } else { 1 };
    let expected: BTreeMap<String, i64> = (written > 0)
        .then(|| (stored(&login, &alice), written))
        .into_iter()
        .collect();
    assert_eq!(counts(&db).await, expected, "what the slow call left");

    db.connect()
        .await
        .batch_execute("DROP TRIGGER slow_write ON platformkit.platformkit_limits")
        .await
        .unwrap();
    let next = limiter.failed(&login, &alice).await.unwrap();
    assert_counted(&next, written as u64 + 1, "the next call");
}

// ---------------------------------------------------------------------------
// The caller's transaction
// ---------------------------------------------------------------------------

/// A connection lent inside a transaction of the caller's (with work in it,
/// serializable, read only, or already failed): an `InTransaction` error,
/// never a verdict; the caller's work is not committed, the connection goes
/// back idle with the switch off, nothing is counted, and the next call on
/// it counts.
async fn a_connection_inside_the_callers_transaction_is_refused_on_either_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    for begin in [
        "BEGIN; INSERT INTO caller_work VALUES (1)",
        "BEGIN ISOLATION LEVEL SERIALIZABLE; INSERT INTO caller_work VALUES (1)",
        "BEGIN READ ONLY; SELECT count(*) FROM caller_work",
        "BEGIN; INSERT INTO caller_work VALUES (1); SELECT 1 / 0",
    ] {
        let db = fresh_db().await;
        let held = hold::<D>(&db.config()).await;
        text::<D>(&held, "CREATE TABLE caller_work (x int)").await;
        let limiter = Limiter::new(Postgres::new(lend::<D>(&held)));
        let login = limit("login", 5);
        let alice = Key::email("alice@example.com");

        // The last script fails on purpose: an aborted transaction.
        let _ = D::simple(&mut *held.lock().await, begin).await;

        let err = limiter
            .failed(&login, &alice)
            .await
            .expect_err("a connection inside a transaction gave a verdict");
        assert_eq!(err.kind(), ErrorKind::InTransaction, "{begin}: {err:?}");
        assert!(!err.is_unreachable());
        assert!(
            [
                Some(&SqlState::INVALID_TRANSACTION_TERMINATION),
                Some(&SqlState::IN_FAILED_SQL_TRANSACTION)
            ]
            .contains(&err.code()),
            "{begin}: {:?}",
            err.code()
        );

        assert_idle_and_switch_off::<D>(&held, begin).await;
        assert_eq!(
            int::<D>(&held, "SELECT count(*)::int8 FROM caller_work").await,
            0,
            "{begin}: the caller's work was committed"
        );
        assert_eq!(counts(&db).await, BTreeMap::new(), "{begin}: counted");
        assert_counted(&limiter.failed(&login, &alice).await.unwrap(), 1, begin);
    }
}

// ---------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------

/// Every hostile key goes through `failed` and `check` without an error or
/// an unreachable verdict; each subject counts exactly its own spellings;
/// the table holds one row per subject.
async fn hostile_keys_never_break_the_statement_on_either_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    let held = hold::<D>(&db.config()).await;
    // Generous: this test is about errors, not speed.
    let limiter = Limiter::builder(Postgres::new(lend::<D>(&held)))
        .budget(Duration::from_secs(30))
        .build()
        .unwrap();
    let hostile = Limit::new("hostile", 1_000, Duration::from_secs(3600)).unwrap();
    let subjects = hostile_keys::hostile_subjects();
    let keys: usize = subjects.iter().map(|s| s.spellings.len()).sum();
    assert!(keys >= 40, "at least 40 hostile keys, have {keys}");

    for subject in &subjects {
        for key in &subject.spellings {
            let verdict = limiter
                .failed(&hostile, key)
                .await
                .unwrap_or_else(|e| panic!("failed for {:?}: {e:?}", subject.what));
            assert!(!verdict.is_unreachable(), "failed for {:?}", subject.what);
        }
    }
    // Several at once too: the keys travel as a text[].
    for subject in &subjects {
        let pairs: Vec<(&Limit, &Key)> = subject.spellings.iter().map(|k| (&hostile, k)).collect();
        let verdicts = limiter
            .check_all(&pairs)
            .await
            .unwrap_or_else(|e| panic!("check_all for {:?}: {e:?}", subject.what));
        for verdict in verdicts.iter() {
            assert_eq!(
                verdict.count(),
                Some(subject.spellings.len() as u64),
                "count for {:?}",
                subject.what
            );
        }
    }
    let rows: i64 = db
        .connect_admin()
        .await
        .query_one("SELECT count(*) FROM platformkit.platformkit_limits", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows as usize, subjects.len());
}

// ---------------------------------------------------------------------------
// PgBouncer in transaction mode
// ---------------------------------------------------------------------------

/// A PgBouncer in front of the shared server, or `None` (after saying so)
/// when none is installed. In CI, which installs it, that is a failure.
fn start_bouncer(pool_size: u32) -> Option<PgBouncer> {
    let bouncer = PgBouncer::start(Server::shared(), pool_size);
    if bouncer.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but no pgbouncer binary was found; .ci/run installs it"
        );
        eprintln!("skipped: no pgbouncer binary (apt-get install pgbouncer, or set PGBOUNCER)");
    }
    bouncer
}

/// What another client of the one server connection sees between the
/// limiter's calls: the switch off, no rows, the same backend.
async fn observe(client: &Client, server_pid: i32) {
    let row = client
        .query_typed_one(
            "SELECT pg_catalog.current_setting('platformkit.system', true), \
                    platformkit.platformkit_is_system(), \
                    (SELECT count(*) FROM platformkit.platformkit_limits), \
                    pg_catalog.pg_backend_pid()",
            &[],
        )
        .await
        .expect("observing through the bouncer");
    let switch: Option<String> = row.get(0);
    assert!(matches!(switch.as_deref(), None | Some("")), "{switch:?}");
    assert!(
        !row.get::<_, bool>(1),
        "the switch is on outside the limiter"
    );
    assert_eq!(row.get::<_, i64>(2), 0, "rows visible outside the limiter");
    assert_eq!(
        row.get::<_, i32>(3),
        server_pid,
        "not the one server connection"
    );
}

/// Through PgBouncer in transaction mode with one server connection: every
/// operation works from a held connection and from the driver's own source,
/// taking turns with another client, who never sees the switch on or a row;
/// a connection inside a transaction is refused and the next client finds
/// nothing of it.
async fn every_operation_works_through_pgbouncer_on_either_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let Some(bouncer) = start_bouncer(1) else {
        return;
    };
    if D::PREPARES && !bouncer.carries_prepared_statements() {
        let (major, minor) = bouncer.version();
        eprintln!(
            "PgBouncer {major}.{minor} cannot carry named prepared statements: checked that \
             the limiter fails loudly through it; the full check needs PgBouncer 1.21 or newer"
        );
        fails_loudly_through_a_pgbouncer_without_prepared_statements::<D>(&bouncer).await;
        return;
    }
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute("CREATE TABLE scratch (n int NOT NULL)")
        .await
        .unwrap();
    let config = bouncer.config_for(&db.config());
    let held = hold::<D>(&config).await;
    let on_held = Arc::new(
        Limiter::builder(Postgres::new(lend::<D>(&held)))
            .no_refusal_cache()
            .build()
            .expect("valid settings"),
    );
    let source = Arc::new(
        Limiter::builder(Postgres::new(D::source(&config)))
            .no_refusal_cache()
            .build()
            .expect("valid settings"),
    );
    let observer = Arc::new(platformkit_limit_testdb::connect(&config).await);
    let server_pid: i32 = observer
        .query_typed_one("SELECT pg_catalog.pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    observe(&observer, server_pid).await;

    let login = limit("login", 1_000);
    let keys: Vec<Key> = (0..4).map(|i| Key::opaque(&format!("user-{i}"))).collect();

    // Concurrently: the limiter's calls and the observer race for the one
    // server connection.
    let done = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let watching = tokio::spawn({
        let (observer, done, rounds) = (observer.clone(), done.clone(), rounds.clone());
        async move {
            while !done.load(Ordering::Acquire) {
                observe(&observer, server_pid).await;
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    for i in 0..40 {
        let key = &keys[i % keys.len()];
        let verdict = if i % 3 == 2 {
            source.failed(&login, key).await
        } else {
            on_held.failed(&login, key).await
        }
        .unwrap_or_else(|e| panic!("call {i} through the bouncer: {e:?}"));
        assert_counted(
            &verdict,
            i as u64 / keys.len() as u64 + 1,
            "through the bouncer",
        );
    }
    done.store(true, Ordering::Release);
    watching.await.expect("the observer");
    assert!(rounds.load(Ordering::Relaxed) > 0, "the observer never ran");

    // Each operation, each followed by the observer.
    each_operation_then_observe(&on_held, &login, &keys, &observer, server_pid).await;
    each_operation_then_observe(&source, &login, &keys, &observer, server_pid).await;
    on_held.reset(&login, &keys[0]).await.unwrap();
    observe(&observer, server_pid).await;
    assert_eq!(purge(&lend::<D>(&held)).await.unwrap(), 0);
    observe(&observer, server_pid).await;
    assert_counted(&source.check(&login, &keys[0]).await.unwrap(), 0, "reset");
    assert_counted(
        &source.check(&login, &keys[1]).await.unwrap(),
        12,
        "counted",
    );

    // A held connection inside a transaction: refused, rolled back, and the
    // server connection free for the next client with nothing behind.
    D::simple(
        &mut *held.lock().await,
        "BEGIN; INSERT INTO scratch VALUES (1)",
    )
    .await
    .unwrap();
    let err = on_held
        .failed(&login, &keys[3])
        .await
        .expect_err("a connection inside a transaction gave a verdict");
    assert_eq!(err.kind(), ErrorKind::InTransaction, "{err:?}");
    let scratch: i64 = observer
        .query_typed_one("SELECT count(*) FROM scratch", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(scratch, 0, "the caller's insert was committed");
    observe(&observer, server_pid).await;
    assert_counted(&on_held.check(&login, &keys[3]).await.unwrap(), 12, "after");
}

/// Through a PgBouncer older than 1.21, which cannot carry named prepared
/// statements from one server connection to the next, a driver that
/// prepares them (sqlx, for every query it binds) cannot work: two clients
/// of one server connection both name their first statement `sqlx_s_1`.
/// Then every call either counts or is a hard error (`Query`, with the
/// server's SQLSTATE), never an allow; the other client of the server
/// connection never sees the switch on or a row; and what the table holds is
/// exactly what the calls counted.
async fn fails_loudly_through_a_pgbouncer_without_prepared_statements<D: Driver>(
    bouncer: &PgBouncer,
) where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    let config = bouncer.config_for(&db.config());
    let held = hold::<D>(&config).await;
    let on_held = Limiter::builder(Postgres::new(lend::<D>(&held)))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    let source = Limiter::builder(Postgres::new(D::source(&config)))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    let observer = platformkit_limit_testdb::connect(&config).await;
    let server_pid: i32 = observer
        .query_typed_one("SELECT pg_catalog.pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let login = limit("login", 1_000);
    let alice = Key::opaque("alice");

    let (mut counted, mut refused) = (0, 0);
    for i in 0..20 {
        let result = if i % 2 == 0 {
            on_held.failed(&login, &alice).await
        } else {
            source.failed(&login, &alice).await
        };
        match result {
            Ok(verdict) => {
                counted += 1;
                assert_counted(&verdict, counted, "a call that went through");
            }
            Err(e) => {
                refused += 1;
                assert_eq!(e.kind(), ErrorKind::Query, "call {i}: {e:?}");
                assert!(
                    [
                        SqlState::DUPLICATE_PSTATEMENT,
                        SqlState::INVALID_SQL_STATEMENT_NAME,
                        SqlState::PROTOCOL_VIOLATION,
                    ]
                    .iter()
                    .any(|code| e.code() == Some(code)),
                    "call {i}: {e:?}"
                );
            }
        }
        observe(&observer, server_pid).await;
    }
    assert!(
        refused > 0,
        "two sqlx clients of one server connection did not collide"
    );
    assert_eq!(
        counts(&db).await,
        BTreeMap::from([(stored(&login, &alice), counted as i64)])
    );
}

/// check, hit, hit_all and a reserve taken back, each followed by the
/// observer's look at the one server connection.
async fn each_operation_then_observe<C: LimitConn>(
    limiter: &Limiter<Postgres<C>>,
    login: &Limit,
    keys: &[Key],
    observer: &Client,
    server_pid: i32,
) {
    assert_counted(&limiter.check(login, &keys[0]).await.unwrap(), 10, "check");
    observe(observer, server_pid).await;
    assert!(limiter.hit(login, &keys[1]).await.unwrap().is_allowed());
    observe(observer, server_pid).await;
    let pairs = [(login, &keys[2]), (login, &keys[3])];
    assert!(limiter.hit_all(&pairs).await.unwrap().is_allowed());
    observe(observer, server_pid).await;
    match limiter.reserve(login, &keys[0]).await.unwrap() {
        Reservation::Granted(permit) => permit.succeeded().await.unwrap(),
        Reservation::Refused(verdict) => panic!("refused: {verdict:?}"),
    }
    observe(observer, server_pid).await;
}

// ---------------------------------------------------------------------------
// sqlx only: a connection the request already holds
// ---------------------------------------------------------------------------

/// A `PoolConnection` or a `&mut PgConnection` a request already holds is
/// lent to a limiter built for that request, and comes back idle, usable by
/// the request; the counts are the pool's limiter's too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sqlx_connection_the_request_holds_is_lent_by_reference() {
    let db = fresh_db().await;
    let pool = Sqlx::pool(&db.config(), 2).await;
    let shared = Limiter::new(Postgres::new(pool.clone()));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");

    // The request's pooled connection, behind a borrow.
    let mut pooled = pool.acquire().await.unwrap();
    {
        let held = Mutex::new(&mut pooled);
        let limiter = Limiter::new(Postgres::new(|| async {
            Ok::<_, Infallible>(SqlxConn(held.lock().await))
        }));
        assert_counted(&limiter.failed(&login, &alice).await.unwrap(), 1, "pooled");
    }
    // And the `&mut PgConnection` inside it.
    {
        let held = Mutex::new(&mut *pooled);
        let limiter = Limiter::new(Postgres::new(|| async {
            Ok::<_, Infallible>(SqlxConn(held.lock().await))
        }));
        assert_counted(
            &limiter.failed(&login, &alice).await.unwrap(),
            2,
            "by reference",
        );
    }
    let idle = sqlx::raw_sql(
        "SELECT (pg_catalog.transaction_timestamp() = pg_catalog.statement_timestamp())::text",
    )
    .fetch_all(&mut *pooled)
    .await
    .unwrap();
    assert_eq!(
        idle[0].try_get::<String, _>(0).unwrap(),
        "true",
        "the request's connection came back inside a transaction"
    );
    drop(pooled);
    assert_counted(
        &shared.check(&login, &alice).await.unwrap(),
        2,
        "through the pool",
    );
}

// ---------------------------------------------------------------------------
// Each body, on each driver
// ---------------------------------------------------------------------------

macro_rules! on_each_driver {
    ($($name:ident),* $(,)?) => {
        mod on_tokio_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name::<super::TokioPostgres>().await;
                }
            )*
        }

        mod on_sqlx {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name::<super::Sqlx>().await;
                }
            )*
        }
    };
}

on_each_driver!(
    every_operation_counts_alike_on_either_driver,
    a_pool_is_a_source_and_gets_its_connection_back_idle,
    nothing_listening_is_unreachable_within_the_budget,
    a_terminated_connection_is_unreachable,
    a_connection_killed_mid_call_ends_at_once,
    an_exhausted_pool_is_unreachable_within_the_budget,
    a_held_row_lock_is_a_lock_timeout_on_either_driver,
    a_slow_call_ends_within_the_budget_and_says_whether_the_server_stopped,
    a_connection_inside_the_callers_transaction_is_refused_on_either_driver,
    hostile_keys_never_break_the_statement_on_either_driver,
    every_operation_works_through_pgbouncer_on_either_driver,
);
