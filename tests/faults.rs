//! Faults and load against a real PostgreSQL: many replicas writing one row,
//! a server that stops and comes back, connections killed in the middle of a
//! call, connection sources that fail or never yield, a purge running under
//! writes, and transactions that try to keep the system switch on.
//!
//! Every fault is caused by the test itself: it stops the server, terminates
//! a backend, holds a row lock from another session or hands the limiter a
//! source that fails. The time bounds are correctness bounds (a call that
//! ignored its budget would wait for as long as the fault lasts), not speed
//! targets, so they leave room for a busy machine.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use platformkit_limit::metric::{CALLS_TOTAL, LABEL_LIMIT, LABEL_OPERATION, LABEL_OUTCOME};
use platformkit_limit::{
    ErrorKind, Key, Limit, LimitConn, Limiter, ManualClock, Postgres, SCHEMA, Verdict, purge,
};
use platformkit_limit_testdb::{Options, Server, TestDb};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};
use tokio::time::{Instant, sleep};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, NoTls, SimpleQueryMessage};

/// A window long enough that no test straddles two windows of the database's
/// clock (they open every 30 days since the Unix epoch).
const LONG_WINDOW: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// The budget of the load tests. Longer than the default of 2 seconds on
/// purpose: 32 connections queueing on one row lock, on a machine with two
/// busy cores, can take a while per call, and a call that ran out of budget
/// would fail open without counting. These tests are about lost updates, so
/// such a call would fail them for the wrong reason; the budget itself is
/// tested by the fault tests below.
const PATIENT: Duration = Duration::from_secs(10);

/// The budget of the tests that make the store unreachable.
const BUDGET: Duration = Duration::from_millis(500);

/// How much longer than its budget an unreachable call may take: scheduling
/// on a busy machine. A call that ignored its budget would take as long as
/// the fault lasts (forever, for a held lock or a source that never yields).
const SLACK: Duration = Duration::from_millis(1500);

/// Replicas of the service in the load tests, each with its own connections.
const REPLICAS: usize = 2;
/// Tasks per replica in the load tests.
const TASKS: usize = 16;
/// Calls per task in the lost-update tests.
const CALLS: usize = 200;
/// Calls in each lost-update test.
const TOTAL_CALLS: usize = REPLICAS * TASKS * CALLS;

// ---------------------------------------------------------------------------
// Connection sources, reads and assertions
// ---------------------------------------------------------------------------

/// A fresh database with the schema, on the shared server.
async fn fresh_db() -> TestDb {
    Server::shared().database(SCHEMA).await
}

/// A limit over [`LONG_WINDOW`].
fn limit(name: &str, max: u32) -> Limit {
    Limit::new(name, max, LONG_WINDOW).expect("a valid limit")
}

/// The key as the table stores it: the limit's name, `|`, the encoded key.
fn stored(limit: &Limit, key: &Key) -> String {
    format!("{}|{}", limit.name(), key.as_str())
}

/// A small pool: connections held for the whole test, each lent to one call
/// at a time, an idle one first.
struct Pool {
    conns: Vec<Arc<Mutex<Client>>>,
    next: AtomicUsize,
}

impl Pool {
    async fn open(config: &Config, size: usize) -> Pool {
        let mut conns = Vec::with_capacity(size);
        for _ in 0..size {
            conns.push(hold(config).await);
        }
        Pool {
            conns,
            next: AtomicUsize::new(0),
        }
    }
}

impl LimitConn for Pool {
    type Conn = OwnedMutexGuard<Client>;
    type Error = Infallible;

    async fn conn(&self) -> Result<Self::Conn, Infallible> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.conns.len();
        for i in 0..n {
            if let Ok(guard) = Arc::clone(&self.conns[(start + i) % n]).try_lock_owned() {
                return Ok(guard);
            }
        }
        // All busy: wait for one.
        Ok(Arc::clone(&self.conns[start % n]).lock_owned().await)
    }
}

/// One connection held for the whole test, as a framework holds the
/// connection of a request.
async fn hold(config: &Config) -> Arc<Mutex<Client>> {
    Arc::new(Mutex::new(platformkit_limit_testdb::connect(config).await))
}

/// A connection source that lends the held connection to one call at a time.
fn lend(
    held: Arc<Mutex<Client>>,
) -> impl LimitConn<Conn = OwnedMutexGuard<Client>, Error = Infallible> {
    move || {
        let held = Arc::clone(&held);
        async move { Ok::<_, Infallible>(held.lock_owned().await) }
    }
}

/// A source that keeps one connection and replaces it when it finds it
/// closed, as a pool does with a broken connection; and how many connections
/// it has made.
fn reconnecting(
    config: Config,
) -> (
    impl LimitConn<Conn = OwnedMappedMutexGuard<Option<Client>, Client>, Error = tokio_postgres::Error>,
    Arc<AtomicUsize>,
) {
    let slot: Arc<Mutex<Option<Client>>> = Arc::new(Mutex::new(None));
    let connects = Arc::new(AtomicUsize::new(0));
    let made = Arc::clone(&connects);
    let source = move || {
        let slot = Arc::clone(&slot);
        let config = config.clone();
        let made = Arc::clone(&made);
        async move {
            let mut guard = slot.lock_owned().await;
            if guard.as_ref().is_none_or(Client::is_closed) {
                *guard = None;
                let (client, connection) = config.connect(NoTls).await?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                *guard = Some(client);
                made.fetch_add(1, Ordering::Relaxed);
            }
            Ok(OwnedMutexGuard::map(guard, |client| {
                client.as_mut().expect("connected just above")
            }))
        }
    };
    (source, connects)
}

/// The one `bigint` a query returns.
async fn one_i64(client: &Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> i64 {
    client
        .query_one(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .get(0)
}

/// Every key's total count, read as the superuser (who is not subject to
/// row-level security).
async fn counts_by_key(admin: &Client) -> BTreeMap<String, i64> {
    admin
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

/// The sum of every count in the table, read as the superuser.
async fn total_count(admin: &Client) -> i64 {
    one_i64(
        admin,
        "SELECT COALESCE(sum(count), 0)::int8 FROM platformkit.platformkit_limits",
        &[],
    )
    .await
}

/// The system switch as this session sees it.
async fn system_switch(client: &Client) -> Option<String> {
    client
        .query_one(
            "SELECT pg_catalog.current_setting('platformkit.system', true)",
            &[],
        )
        .await
        .expect("reading the system switch")
        .get(0)
}

/// How many rows of the table this session sees.
async fn visible_rows(client: &Client) -> i64 {
    one_i64(
        client,
        "SELECT count(*) FROM platformkit.platformkit_limits",
        &[],
    )
    .await
}

/// Whether the connection is idle, not inside a transaction: outside one,
/// each statement starts its own, so its start is the transaction's start.
async fn assert_idle(client: &Client) {
    let messages = client
        .simple_query(
            "SELECT pg_catalog.transaction_timestamp() = pg_catalog.statement_timestamp()",
        )
        .await
        .expect("the connection answers");
    let idle = messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => row.get(0).map(|v| v == "t"),
        _ => None,
    });
    assert_eq!(
        idle,
        Some(true),
        "the connection was left inside a transaction"
    );
}

/// Locks the key's rows from a session of its own, as the system, and keeps
/// the lock until the returned client is dropped or rolls back. Panics unless
/// there was a row to lock.
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

/// Backends of `limit_owner` in the test's database waiting on a lock.
async fn owner_lock_waits(admin: &Client) -> i64 {
    one_i64(
        admin,
        "SELECT count(*) FROM pg_catalog.pg_stat_activity \
         WHERE datname = pg_catalog.current_database() \
           AND usename = 'limit_owner' AND wait_event_type = 'Lock'",
        &[],
    )
    .await
}

/// Waits up to two seconds for no backend of `limit_owner` to wait on a lock.
async fn assert_no_owner_lock_waits_soon(admin: &Client, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let waits = owner_lock_waits(admin).await;
        if waits == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {waits} backend(s) still waiting on the lock two seconds after \
             the client gave up"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `call` and returns its output and how long it took. Fails the test
/// when the call is still running after `bound`, instead of hanging with it.
async fn timed<T>(bound: Duration, what: &str, call: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    match tokio::time::timeout(bound, call).await {
        Ok(output) => (output, started.elapsed()),
        Err(_) => panic!("{what}: still running after {bound:?}"),
    }
}

/// Asserts that the verdict is allowed because the store was unreachable,
/// for the reason `kind`.
#[track_caller]
fn assert_unreachable(verdict: &Verdict, kind: ErrorKind, what: &str) {
    assert!(
        verdict.is_allowed() && verdict.is_unreachable(),
        "{what}: expected allowed because unreachable, got {verdict:?}"
    );
    let cause = verdict
        .unreachable()
        .expect("an unreachable verdict has a cause");
    assert_eq!(cause.kind(), kind, "{what}: {cause:?}");
    assert_eq!(verdict.count(), None, "{what}");
}

/// Asserts that the verdict was counted by the store, not allowed blindly.
#[track_caller]
fn assert_counted(verdict: &Verdict, what: &str) {
    assert!(
        !verdict.is_unreachable(),
        "{what}: the store was unreachable: {:?}",
        verdict.unreachable()
    );
}

/// `platformkit_limit_calls_total` for one limit, operation and outcome.
fn calls_recorded(snapshotter: &Snapshotter, limit: &str, operation: &str, outcome: &str) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            if key.name() != CALLS_TOTAL {
                return None;
            }
            let label = |name: &str| {
                key.labels()
                    .find(|l| l.key() == name)
                    .map(|l| l.value().to_owned())
            };
            let wanted = label(LABEL_LIMIT).as_deref() == Some(limit)
                && label(LABEL_OPERATION).as_deref() == Some(operation)
                && label(LABEL_OUTCOME).as_deref() == Some(outcome);
            match value {
                DebugValue::Counter(n) if wanted => Some(n),
                _ => None,
            }
        })
        .sum()
}

// ---------------------------------------------------------------------------
// Load: no count is ever lost
// ---------------------------------------------------------------------------

/// One replica of the service: a limiter over a pool of its own.
async fn replica(db: &TestDb, clock: Option<&ManualClock>) -> Arc<Limiter<Postgres<Pool>>> {
    let mut store = Postgres::new(Pool::open(&db.config(), TASKS).await);
    if let Some(clock) = clock {
        store = store.with_clock(clock.clone());
    }
    // The refusal cache is off: these tests are about what the database
    // counts, and a cached refusal is answered without asking it.
    Arc::new(
        Limiter::new(store)
            .with_budget(PATIENT)
            .unwrap()
            .without_refusal_cache(),
    )
}

/// Calls `failed` [`CALLS`] times from each of [`TASKS`] tasks on each of
/// [`REPLICAS`] replicas, the `i`-th call overall on the key `key_of(i)`.
/// Returns, for each call, the stored key and the count its verdict reported.
async fn failed_from_every_replica(
    db: &TestDb,
    login: &Limit,
    key_of: fn(usize) -> Key,
) -> Vec<(String, u64)> {
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        replicas.push(replica(db, None).await);
    }
    let mut tasks = Vec::new();
    for (r, limiter) in replicas.iter().enumerate() {
        for t in 0..TASKS {
            let limiter = Arc::clone(limiter);
            let login = login.clone();
            tasks.push(tokio::spawn(async move {
                let mut seen = Vec::with_capacity(CALLS);
                for c in 0..CALLS {
                    let i = (r * TASKS + t) * CALLS + c;
                    let key = key_of(i);
                    let verdict = limiter
                        .failed(&login, &key)
                        .await
                        .unwrap_or_else(|e| panic!("call {i}: {e:?}"));
                    assert_counted(&verdict, &format!("call {i}"));
                    seen.push((stored(&login, &key), verdict.count().expect("counted")));
                }
                seen
            }));
        }
    }
    let mut seen = Vec::with_capacity(TOTAL_CALLS);
    for task in tasks {
        seen.extend(task.await.expect("a writer task panicked"));
    }
    seen
}

/// The counts each key's calls reported, sorted.
fn reported_by_key(seen: &[(String, u64)]) -> BTreeMap<String, Vec<u64>> {
    let mut by_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (key, count) in seen {
        by_key.entry(key.clone()).or_default().push(*count);
    }
    for counts in by_key.values_mut() {
        counts.sort_unstable();
    }
    by_key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lost_updates_on_one_hot_key() {
    let db = fresh_db().await;
    let login = limit("login", 1_000_000);
    let hot = Key::opaque("hot");

    let seen = failed_from_every_replica(&db, &login, |_| Key::opaque("hot")).await;
    assert_eq!(seen.len(), TOTAL_CALLS);

    // Each call added one and saw the count after its own addition: with no
    // lost update, the calls saw every count from 1 to the total exactly once.
    let reported = reported_by_key(&seen);
    let expected: Vec<u64> = (1..=TOTAL_CALLS as u64).collect();
    assert_eq!(reported.len(), 1);
    assert!(
        reported[&stored(&login, &hot)] == expected,
        "the calls did not see every count from 1 to {TOTAL_CALLS} exactly once"
    );

    let admin = db.connect_admin().await;
    assert_eq!(total_count(&admin).await, TOTAL_CALLS as i64);
    let rows = admin
        .query(
            "SELECT count FROM platformkit.platformkit_limits WHERE key = $1",
            &[&stored(&login, &hot)],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "one row for the hot key's one window");
    assert_eq!(rows[0].get::<_, i64>(0), TOTAL_CALLS as i64);
}

/// Spreads calls over this many keys in `no_lost_updates_over_many_keys`.
const MANY_KEYS: u64 = 10_000;

/// Keys each step of the many-keys test picks from.
const KEYS_PER_STEP: u64 = MANY_KEYS / CALLS as u64;

/// The key of the `i`-th call. Call `c` of every task picks one of the
/// [`KEYS_PER_STEP`] keys of step `c`, pseudo-randomly (splitmix64) but
/// always the same: over the test the calls range over all [`MANY_KEYS`]
/// keys, and tasks at the same step meet on one key often enough that
/// concurrent upserts of one row happen here too (about 1,300 keys get more
/// than one call).
fn spread_key(i: usize) -> Key {
    let step = (i % CALLS) as u64;
    let mut z = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    Key::opaque(&format!("k{}", step * KEYS_PER_STEP + z % KEYS_PER_STEP))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lost_updates_over_many_keys() {
    let db = fresh_db().await;
    let login = limit("login", 1_000_000);

    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..TOTAL_CALLS {
        *expected.entry(stored(&login, &spread_key(i))).or_default() += 1;
    }
    assert!(
        expected.len() > 4_000 && expected.values().filter(|&&n| n > 1).count() > 1_000,
        "the calls spread over thousands of keys, and meet on many"
    );

    let seen = failed_from_every_replica(&db, &login, spread_key).await;
    assert_eq!(seen.len(), TOTAL_CALLS);

    // Per key, the calls saw every count from 1 to the key's total once.
    for (key, counts) in reported_by_key(&seen) {
        let want: Vec<u64> = (1..=expected[&key] as u64).collect();
        assert_eq!(counts, want, "counts reported for {key}");
    }

    let admin = db.connect_admin().await;
    assert_eq!(total_count(&admin).await, TOTAL_CALLS as i64);
    let stored_counts = counts_by_key(&admin).await;
    assert_eq!(stored_counts.len(), expected.len(), "keys stored");
    assert!(
        stored_counts == expected,
        "some key's stored count differs from the calls made on it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hit_never_allows_more_than_the_limit() {
    const MAX: u32 = 50;
    const HITS: usize = 10;
    const ASKS: usize = REPLICAS * TASKS * HITS;

    let db = fresh_db().await;
    // One pinned clock shared by both replicas: the window cannot roll over
    // in the middle of the test and let a second batch of 50 through.
    let clock = ManualClock::new(SystemTime::now());
    let forgot = Limit::new("password-forgot", MAX, Duration::from_secs(3600)).unwrap();
    let victim = Key::email("victim@example.com");

    let mut tasks = Vec::new();
    for _ in 0..REPLICAS {
        let limiter = replica(&db, Some(&clock)).await;
        for _ in 0..TASKS {
            let limiter = Arc::clone(&limiter);
            let forgot = forgot.clone();
            let victim = victim.clone();
            tasks.push(tokio::spawn(async move {
                let mut verdicts = Vec::with_capacity(HITS);
                for _ in 0..HITS {
                    let verdict = limiter.hit(&forgot, &victim).await.expect("hit");
                    assert_counted(&verdict, "hit");
                    verdicts.push((verdict.is_allowed(), verdict.count().expect("counted")));
                }
                verdicts
            }));
        }
    }
    let mut allowed = Vec::new();
    let mut refused = Vec::new();
    for task in tasks {
        for (is_allowed, count) in task.await.expect("a task panicked") {
            if is_allowed {
                allowed.push(count);
            } else {
                refused.push(count);
            }
        }
    }
    allowed.sort_unstable();
    refused.sort_unstable();

    assert_eq!(allowed.len(), MAX as usize, "asks let through");
    assert_eq!(allowed, (1..=u64::from(MAX)).collect::<Vec<_>>());
    assert_eq!(refused.len(), ASKS - MAX as usize, "asks refused");
    assert_eq!(
        refused,
        (u64::from(MAX) + 1..=ASKS as u64).collect::<Vec<_>>()
    );

    // Refused asks are counted too.
    let admin = db.connect_admin().await;
    assert_eq!(total_count(&admin).await, ASKS as i64);
}

// ---------------------------------------------------------------------------
// Faults: fail open within the budget, then recover
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_mid_run_fails_open_then_recovers() {
    // Longer than the other fault tests' budget: the calls before and after
    // the outage connect to a server that has just started, on a busy
    // machine, and must be counted.
    const RESTART_BUDGET: Duration = Duration::from_secs(1);
    const WRITES_BEFORE: u64 = 5;

    let server = tokio::task::block_in_place(|| Server::start(Options::default()));
    let db = server.database(SCHEMA).await;
    let per_call = Limiter::new(Postgres::new(db.config()))
        .with_budget(RESTART_BUDGET)
        .unwrap();
    let (source, connects) = reconnecting(db.config());
    let pooled = Limiter::new(Postgres::new(source))
        .with_budget(RESTART_BUDGET)
        .unwrap();
    let login = limit("login", 1_000);
    let alice = Key::email("alice@example.com");

    let mut expected = 0;
    for _ in 0..WRITES_BEFORE {
        for (name, verdict) in [
            ("per call", per_call.failed(&login, &alice).await.unwrap()),
            ("reconnecting", pooled.failed(&login, &alice).await.unwrap()),
        ] {
            expected += 1;
            assert_counted(&verdict, name);
            assert_eq!(verdict.count(), Some(expected), "{name}");
        }
    }
    assert_eq!(connects.load(Ordering::Relaxed), 1);

    tokio::task::block_in_place(|| server.pg_ctl(&["stop", "-m", "fast", "-w"]));

    // Every call during the outage is allowed, says why, and ends in time.
    for round in 0..2 {
        for (name, limiter_call) in [("per call", 0), ("reconnecting", 1)] {
            for op in ["check", "failed", "hit"] {
                let what = format!("{name} {op} during the outage, round {round}");
                let call = async {
                    match (limiter_call, op) {
                        (0, "check") => per_call.check(&login, &alice).await,
                        (0, "failed") => per_call.failed(&login, &alice).await,
                        (0, _) => per_call.hit(&login, &alice).await,
                        (_, "check") => pooled.check(&login, &alice).await,
                        (_, "failed") => pooled.failed(&login, &alice).await,
                        (_, _) => pooled.hit(&login, &alice).await,
                    }
                };
                let (verdict, _) = timed(RESTART_BUDGET + SLACK, &what, call).await;
                assert_unreachable(&verdict.unwrap(), ErrorKind::Connect, &what);
            }
        }
    }

    tokio::task::block_in_place(|| server.pg_ctl(&["start", "-w"]));

    // The first call after the start works, with nothing done by the caller.
    for (name, verdict) in [
        ("per call", per_call.failed(&login, &alice).await.unwrap()),
        ("reconnecting", pooled.failed(&login, &alice).await.unwrap()),
    ] {
        expected += 1;
        assert_counted(&verdict, &format!("{name}, first call after the start"));
        assert_eq!(
            verdict.count(),
            Some(expected),
            "{name}: the counts from before the outage are there, and nothing \
             was counted while it lasted"
        );
    }
    assert_eq!(connects.load(Ordering::Relaxed), 2, "one reconnection");

    // A restart between two calls, with no call during it, is no different.
    tokio::task::block_in_place(|| server.pg_ctl(&["restart", "-m", "fast", "-w"]));
    for (name, verdict) in [
        ("per call", per_call.failed(&login, &alice).await.unwrap()),
        ("reconnecting", pooled.failed(&login, &alice).await.unwrap()),
    ] {
        expected += 1;
        assert_counted(&verdict, &format!("{name}, first call after the restart"));
        assert_eq!(verdict.count(), Some(expected), "{name}");
    }
    assert_eq!(connects.load(Ordering::Relaxed), 3, "one more reconnection");

    let admin = db.connect_admin().await;
    assert_eq!(
        counts_by_key(&admin).await,
        BTreeMap::from([(stored(&login, &alice), expected as i64)])
    );

    drop((per_call, pooled, admin));
    tokio::task::block_in_place(|| drop(server));
}

#[tokio::test]
async fn a_connection_killed_mid_call_ends_within_the_budget() {
    // Long, so that only the kill can end the call early.
    const KILL_BUDGET: Duration = Duration::from_secs(5);

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    let pid: i32 = held
        .lock()
        .await
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))))
        .with_budget(KILL_BUDGET)
        .unwrap();
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );

    let locker = lock_row(&db, &stored(&login, &alice)).await;
    let admin = db.connect_admin().await;
    let kill = async {
        // Wait until the limiter's backend is blocked on the row lock.
        let deadline = Instant::now() + KILL_BUDGET;
        loop {
            let waiting = one_i64(
                &admin,
                "SELECT count(*) FROM pg_catalog.pg_stat_activity \
                 WHERE pid = $1 AND wait_event_type = 'Lock'",
                &[&pid],
            )
            .await;
            if waiting == 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the limiter's call never blocked on the lock"
            );
            sleep(Duration::from_millis(10)).await;
        }
        let terminated: bool = admin
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap()
            .get(0);
        assert!(terminated, "the limiter's backend was terminated");
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
    let verdict = verdict.unwrap();

    assert_unreachable(&verdict, ErrorKind::Connect, what);
    assert!(took < KILL_BUDGET, "the call took {took:?}");
    assert!(
        ended - killed_at < SLACK,
        "the call ended {:?} after its backend was killed",
        ended - killed_at
    );
    // The client notices the end of the connection just after the error that
    // ended the call.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !held.lock().await.is_closed() {
        assert!(
            Instant::now() < deadline,
            "the killed connection stayed open"
        );
        sleep(Duration::from_millis(10)).await;
    }

    locker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        counts_by_key(&admin).await,
        BTreeMap::from([(stored(&login, &alice), 1)]),
        "the killed call counted nothing"
    );
    assert_eq!(
        calls_recorded(&snapshotter, "login", "failed", "allowed"),
        1
    );
    assert_eq!(
        calls_recorded(&snapshotter, "login", "failed", "unreachable"),
        1
    );
    assert_eq!(calls_recorded(&snapshotter, "login", "failed", "error"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_source_that_errors_is_unreachable() {
    let failing = || async {
        Err::<Box<Client>, _>(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "the pool is closed",
        ))
    };
    let limiter = Limiter::new(Postgres::new(failing))
        .with_budget(BUDGET)
        .unwrap();
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    for op in ["check", "failed", "hit"] {
        let call = async {
            match op {
                "check" => limiter.check(&login, &alice).await,
                "failed" => limiter.failed(&login, &alice).await,
                _ => limiter.hit(&login, &alice).await,
            }
        };
        let (verdict, _) = timed(BUDGET + SLACK, op, call).await;
        let verdict = verdict.unwrap();
        assert_unreachable(&verdict, ErrorKind::Connect, op);

        // The source's own error is the cause.
        let cause = verdict.unreachable().unwrap();
        let mut source = std::error::Error::source(cause);
        let mut found = false;
        while let Some(e) = source {
            found |= e
                .downcast_ref::<io::Error>()
                .is_some_and(|e| e.to_string() == "the pool is closed");
            source = e.source();
        }
        assert!(
            found,
            "{op}: the source's error is not the cause: {cause:?}"
        );
    }

    // A reset has nothing to fail open to: the same failure is an error.
    let (reset, _) = timed(BUDGET + SLACK, "reset", limiter.reset(&login, &alice)).await;
    let err = reset.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connect);
    assert!(err.is_unreachable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_source_that_never_yields_ends_within_the_budget() {
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    // A source that never hands over a connection.
    let never = || std::future::pending::<Result<Box<Client>, Infallible>>();
    let limiter = Limiter::new(Postgres::new(never))
        .with_budget(BUDGET)
        .unwrap();
    for op in ["check", "failed", "hit"] {
        let call = async {
            match op {
                "check" => limiter.check(&login, &alice).await,
                "failed" => limiter.failed(&login, &alice).await,
                _ => limiter.hit(&login, &alice).await,
            }
        };
        let (verdict, took) = timed(BUDGET + SLACK, op, call).await;
        assert_unreachable(&verdict.unwrap(), ErrorKind::Timeout, op);
        assert!(took >= BUDGET, "{op} gave up early, after {took:?}");
    }
    let (reset, _) = timed(BUDGET + SLACK, "reset", limiter.reset(&login, &alice)).await;
    assert_eq!(reset.unwrap_err().kind(), ErrorKind::Timeout);

    // An exhausted pool: its one connection is taken by someone else.
    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))))
        .with_budget(BUDGET)
        .unwrap();
    let taken = held.lock().await;
    let what = "an exhausted pool";
    let (verdict, _) = timed(BUDGET + SLACK, what, limiter.failed(&login, &alice)).await;
    assert_unreachable(&verdict.unwrap(), ErrorKind::Timeout, what);
    drop(taken);

    // Once the connection is back, calls are counted again; the one that
    // timed out waiting was not.
    let verdict = limiter.failed(&login, &alice).await.unwrap();
    assert_counted(&verdict, "after the pool recovered");
    assert_eq!(verdict.count(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// The server's part of the budget ends before the client's: a lock held
/// past it ends the wait on the server, as a hard error (never an allow),
/// and nothing of the limiter's is left waiting.
async fn the_server_stops_waiting_on_a_held_lock_before_the_client_gives_up() {
    let db = fresh_db().await;
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    let admin = db.connect_admin().await;

    let held = hold(&db.config()).await;
    let on_held = Limiter::new(Postgres::new(lend(Arc::clone(&held))))
        .with_budget(BUDGET)
        .unwrap();
    let per_call = Limiter::new(Postgres::new(db.config()))
        .with_budget(BUDGET)
        .unwrap();
    assert_eq!(
        on_held.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );

    // The lock is held for the rest of the test: far longer than the budget.
    let locker = lock_row(&db, &stored(&login, &alice)).await;

    for (name, on_held_connection) in [("held connection", true), ("per call", false)] {
        let call = async {
            if on_held_connection {
                on_held.failed(&login, &alice).await
            } else {
                per_call.failed(&login, &alice).await
            }
        };
        let (result, _) = timed(BUDGET + SLACK, name, call).await;
        let err = result.expect_err("a held lock gave a verdict");
        assert_eq!(err.kind(), ErrorKind::LockTimeout, "{name}: {err:?}");
        assert!(!err.is_unreachable(), "{name}");

        // The server gave up too: nothing of the limiter's waits on the lock.
        assert_no_owner_lock_waits_soon(&admin, name).await;
    }

    // The held connection is usable, idle, and the switch is off on it.
    {
        let client = held.lock().await;
        assert!(!client.is_closed());
        assert_eq!(
            one_i64(&client, "SELECT 1::int8", &[]).await,
            1,
            "the connection answers"
        );
        assert_idle(&client).await;
        assert_ne!(
            system_switch(&client).await.as_deref(),
            Some("on"),
            "the system switch outlived the limiter's transaction"
        );
        assert_eq!(visible_rows(&client).await, 0);
    }

    locker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        counts_by_key(&admin).await,
        BTreeMap::from([(stored(&login, &alice), 1)]),
        "the calls that gave up counted nothing"
    );
    // And once the lock is gone, the same connection counts again.
    assert_eq!(
        on_held.failed(&login, &alice).await.unwrap().count(),
        Some(2)
    );
}

// ---------------------------------------------------------------------------
// Purge under load
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_under_load_loses_no_open_counts() {
    const CLOSED_ROWS: i64 = 200_000;
    const RECENT_ROWS: i64 = 1_000;
    const WRITERS: usize = 16;
    const OPEN_KEYS: usize = 64;
    const MIN_CALLS: usize = 20;

    let db = fresh_db().await;
    let admin = db.connect_admin().await;
    // Windows that closed between about 3 and 5 days ago, and windows that
    // closed an hour ago (which purge must keep).
    admin
        .batch_execute(&format!(
            "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             SELECT 'closed|' || g, w.start, w.start + interval '1 hour', 1
             FROM generate_series(1, {CLOSED_ROWS}) AS g,
                  LATERAL (SELECT now() - interval '3 days' - g * interval '1 second' AS start) AS w;
             INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             SELECT 'recent|' || g, now() - interval '2 hours', now() - interval '1 hour', 2
             FROM generate_series(1, {RECENT_ROWS}) AS g;
             ANALYZE platformkit.platformkit_limits;"
        ))
        .await
        .expect("inserting closed windows");

    let login = limit("login", 1_000_000);
    let limiter = Arc::new(
        Limiter::new(Postgres::new(Pool::open(&db.config(), WRITERS).await))
            .with_budget(PATIENT)
            .unwrap(),
    );
    let purged = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for t in 0..WRITERS {
        let limiter = Arc::clone(&limiter);
        let login = login.clone();
        let purged = Arc::clone(&purged);
        let calls = Arc::clone(&calls);
        writers.push(tokio::spawn(async move {
            // Writes until the purge is over, so that it runs under load.
            let mut made: BTreeMap<String, i64> = BTreeMap::new();
            let mut c = 0;
            while c < MIN_CALLS || !purged.load(Ordering::Acquire) {
                let key = Key::opaque(&format!("open{}", (t * 7 + c) % OPEN_KEYS));
                let verdict = limiter
                    .failed(&login, &key)
                    .await
                    .unwrap_or_else(|e| panic!("writer {t}, call {c}: {e:?}"));
                assert_counted(&verdict, &format!("writer {t}, call {c}"));
                *made.entry(stored(&login, &key)).or_default() += 1;
                calls.fetch_add(1, Ordering::Relaxed);
                c += 1;
            }
            made
        }));
    }

    // Let the writers get going, then purge in the middle of their writes.
    while calls.load(Ordering::Relaxed) < WRITERS {
        sleep(Duration::from_millis(5)).await;
    }
    let calls_before = calls.load(Ordering::Relaxed);
    let deleted = purge(&db.config()).await;
    let calls_during = calls.load(Ordering::Relaxed) - calls_before;
    purged.store(true, Ordering::Release);

    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for writer in writers {
        for (key, n) in writer.await.expect("a writer panicked") {
            *expected.entry(key).or_default() += n;
        }
    }
    assert_eq!(deleted.expect("purge"), CLOSED_ROWS as u64, "rows purged");
    assert!(calls_during > 0, "no write happened while the purge ran");

    let stored_counts = counts_by_key(&admin).await;
    let closed_left = stored_counts
        .keys()
        .filter(|k| k.starts_with("closed|"))
        .count();
    assert_eq!(closed_left, 0, "closed windows left behind");
    let recent: Vec<i64> = stored_counts
        .iter()
        .filter(|(k, _)| k.starts_with("recent|"))
        .map(|(_, &n)| n)
        .collect();
    assert_eq!(
        recent.len(),
        RECENT_ROWS as usize,
        "recently closed windows kept"
    );
    assert!(recent.iter().all(|&n| n == 2));
    let open: BTreeMap<String, i64> = stored_counts
        .into_iter()
        .filter(|(k, _)| k.starts_with("login|"))
        .collect();
    assert_eq!(open.len(), OPEN_KEYS);
    assert!(
        open == expected,
        "an open window's count differs from the calls made on it: \
         stored {open:?}, made {expected:?}"
    );
}

// ---------------------------------------------------------------------------
// The system switch cannot be kept on
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_transaction_or_savepoint_rollback_cannot_keep_the_switch_on() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );

    let owner = db.connect().await;
    assert_eq!(visible_rows(&owner).await, 0);

    // A prepared transaction: the switch was on inside it, and is off for the
    // session once it is prepared, and after it is committed.
    let prepared: i64 = one_i64(
        &owner,
        "SELECT current_setting('max_prepared_transactions')::int8",
        &[],
    )
    .await;
    assert!(
        prepared > 0,
        "this test needs max_prepared_transactions > 0 (throwaway servers have 10)"
    );
    let gid = format!("switch_{}", db.name());
    owner
        .batch_execute("BEGIN; SELECT set_config('platformkit.system', 'on', true)")
        .await
        .unwrap();
    assert_eq!(visible_rows(&owner).await, 1, "the switch is on inside");
    owner
        .batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
        .await
        .unwrap();
    assert_ne!(system_switch(&owner).await.as_deref(), Some("on"));
    assert_eq!(visible_rows(&owner).await, 0, "after PREPARE TRANSACTION");
    owner
        .batch_execute(&format!("COMMIT PREPARED '{gid}'"))
        .await
        .expect("COMMIT PREPARED");
    assert_ne!(system_switch(&owner).await.as_deref(), Some("on"));
    assert_eq!(visible_rows(&owner).await, 0, "after COMMIT PREPARED");
    assert_idle(&owner).await;

    // A savepoint rolled back takes the switch with it.
    owner
        .batch_execute("BEGIN; SAVEPOINT s; SET LOCAL platformkit.system = 'on'")
        .await
        .unwrap();
    assert_eq!(
        visible_rows(&owner).await,
        1,
        "the switch is on in the savepoint"
    );
    owner
        .batch_execute("ROLLBACK TO SAVEPOINT s")
        .await
        .unwrap();
    assert_ne!(system_switch(&owner).await.as_deref(), Some("on"));
    assert_eq!(visible_rows(&owner).await, 0, "after ROLLBACK TO SAVEPOINT");
    owner.batch_execute("COMMIT").await.unwrap();
    assert_eq!(visible_rows(&owner).await, 0, "after COMMIT");

    // A purge written as plain SQL, outside the limiter, deletes nothing; the
    // limiter's purge does.
    let admin = db.connect_admin().await;
    admin
        .batch_execute(
            "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             VALUES ('login|old', now() - interval '3 days', now() - interval '2 days', 4)",
        )
        .await
        .unwrap();
    let deleted = owner
        .execute(
            "DELETE FROM platformkit.platformkit_limits WHERE window_end < now() - interval '24 hours'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(deleted, 0, "a plain-SQL purge deleted rows");
    let deleted = owner
        .execute("DELETE FROM platformkit.platformkit_limits", &[])
        .await
        .unwrap();
    assert_eq!(deleted, 0, "a plain-SQL DELETE deleted rows");
    assert_eq!(
        counts_by_key(&admin).await,
        BTreeMap::from([("login|old".to_owned(), 4), (stored(&login, &alice), 1)])
    );
    assert_eq!(purge(&db.config()).await.unwrap(), 1);
    assert_eq!(
        counts_by_key(&admin).await,
        BTreeMap::from([(stored(&login, &alice), 1)])
    );
}
