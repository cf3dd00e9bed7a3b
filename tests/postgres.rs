//! The limiter against a real PostgreSQL: shared counts, the purge, row-level
//! security and the system switch, failing open when the store is out of
//! reach, hard errors, metrics, hostile session settings and pinned time.
//!
//! Every test gets a database of its own on a throwaway server (or on the one
//! `DATABASE_URL` names), with the schema applied as `limit_owner`: the owner
//! of the table, no superuser and subject to `FORCE ROW LEVEL SECURITY`. The
//! limiter connects as that role, so its system switch is really exercised.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use platformkit_limit::metric::{
    CALL_DURATION_SECONDS, CALLS_TOTAL, LABEL_LIMIT, LABEL_OPERATION, LABEL_OUTCOME, LABEL_SOURCE,
};
use platformkit_limit::{
    ErrorKind, Key, Limit, LimitConn, Limiter, ManualClock, PURGE_BATCH_BUDGET, PURGE_BATCH_ROWS,
    Postgres, SCHEMA, Store, purge,
};
use platformkit_limit_testdb::{Options, Server, TestDb};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio::time::{Instant, sleep};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, Row, SimpleQueryMessage};

/// A window long enough that no test straddles two windows of the database's
/// clock (they open every 30 days since the Unix epoch).
const LONG_WINDOW: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// The budget of the tests that make the store unreachable.
const BUDGET: Duration = Duration::from_millis(500);

/// How much longer than its budget an unreachable call may take: scheduling
/// on a busy machine, not a speed target. A call that ignored its budget would
/// take far longer (forever, for a silent server or a held lock).
const SLACK: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------
// Support
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

/// Runs `sql` inside a transaction with the system switch on, as the limiter
/// does: the only way an ordinary role sees or changes the table.
async fn as_system(client: &mut Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<Row> {
    let tx = client.transaction().await.expect("BEGIN");
    tx.batch_execute("SET LOCAL platformkit.system = 'on'")
        .await
        .expect("turning the system switch on");
    let rows = tx
        .query(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    tx.commit().await.expect("COMMIT");
    rows
}

/// Every row of the table, read as the system: `(key, count)` by key and
/// window.
async fn stored_rows(db: &TestDb) -> Vec<(String, i64)> {
    let mut client = db.connect().await;
    as_system(
        &mut client,
        "SELECT key, count FROM platformkit.platformkit_limits ORDER BY key, window_start",
        &[],
    )
    .await
    .iter()
    .map(|row| (row.get(0), row.get(1)))
    .collect()
}

/// Whether the connection is idle, not inside a transaction: outside one,
/// each statement starts its own, so its start is the transaction's start.
async fn assert_idle(client: &Client) {
    // A simple query: one message, so one statement start.
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

/// The system switch as this session sees it, outside the limiter's calls.
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

/// Connection settings for a port where nothing listens.
fn nothing_listens() -> Config {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    let port = listener.local_addr().expect("the bound address").port();
    drop(listener);
    let mut config = Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user("limit_owner")
        .dbname("nowhere");
    config
}

/// Backends of the test's database waiting on a lock.
async fn lock_waits(admin: &Client) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity \
             WHERE datname = pg_catalog.current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .expect("reading pg_stat_activity")
        .get(0)
}

/// Waits up to two seconds for no backend of the database to wait on a lock.
async fn assert_no_lock_waits_soon(admin: &Client) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let waits = lock_waits(admin).await;
        if waits == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{waits} backend(s) still waiting on a lock two seconds later"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// What a [`DebuggingRecorder`] saw, keyed by label values.
#[derive(Debug, Default)]
struct Recorded {
    /// `platformkit_limit_calls_total` by `(limit, operation, outcome)`.
    calls: BTreeMap<(String, String, String), u64>,
    /// Samples of `platformkit_limit_call_duration_seconds` by
    /// `(limit, operation)`.
    durations: BTreeMap<(String, String), usize>,
    /// Every label of every series, as `(name, value)`.
    labels: Vec<(String, String)>,
}

impl Recorded {
    fn take(snapshotter: &Snapshotter) -> Recorded {
        let mut recorded = Recorded::default();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: BTreeMap<String, String> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            recorded
                .labels
                .extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            let label = |name: &str| labels.get(name).cloned().unwrap_or_default();
            match (key.name(), value) {
                (CALLS_TOTAL, DebugValue::Counter(n)) => {
                    assert_eq!(labels.len(), 4, "labels of {CALLS_TOTAL}: {labels:?}");
                    // Every call here reaches the store: the refusal cache is
                    // covered by tests/refusal_cache.rs.
                    assert_eq!(label(LABEL_SOURCE), "store", "{labels:?}");
                    recorded.calls.insert(
                        (
                            label(LABEL_LIMIT),
                            label(LABEL_OPERATION),
                            label(LABEL_OUTCOME),
                        ),
                        n,
                    );
                }
                (CALL_DURATION_SECONDS, DebugValue::Histogram(samples)) => {
                    assert_eq!(
                        labels.len(),
                        2,
                        "labels of {CALL_DURATION_SECONDS}: {labels:?}"
                    );
                    *recorded
                        .durations
                        .entry((label(LABEL_LIMIT), label(LABEL_OPERATION)))
                        .or_default() += samples.len();
                }
                _ => {}
            }
        }
        recorded
    }

    fn calls(&self, limit: &str, operation: &str, outcome: &str) -> u64 {
        self.calls
            .get(&(limit.to_owned(), operation.to_owned(), outcome.to_owned()))
            .copied()
            .unwrap_or(0)
    }
}

fn series(entries: &[(&str, &str, &str, u64)]) -> BTreeMap<(String, String, String), u64> {
    entries
        .iter()
        .map(|&(l, op, out, n)| ((l.to_owned(), op.to_owned(), out.to_owned()), n))
        .collect()
}

// ---------------------------------------------------------------------------
// One limit for every replica
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_limit() {
    let db = fresh_db().await;
    let replica_a = Limiter::new(Postgres::new(db.config()));
    let replica_b = Limiter::new(Postgres::new(lend(hold(&db.config()).await)));
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    assert_eq!(
        replica_a.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );
    assert_eq!(
        replica_b.failed(&login, &alice).await.unwrap().count(),
        Some(2)
    );
    let third = replica_a.check(&login, &alice).await.unwrap();
    assert!(third.is_allowed());
    assert_eq!(third.count(), Some(2));
    assert_eq!(third.remaining(), Some(1));

    let failed = replica_a.failed(&login, &alice).await.unwrap();
    assert_eq!(failed.count(), Some(3));
    assert!(failed.is_refused(), "the third failure closes the limit");

    assert_fourth_refused("a", &replica_a, &login, &alice).await;
    assert_fourth_refused("b", &replica_b, &login, &alice).await;
    assert_eq!(
        stored_rows(&db).await,
        [(stored(&login, &alice), 3)],
        "one row holds the shared count"
    );
}

async fn assert_fourth_refused<S: Store>(
    name: &str,
    replica: &Limiter<S>,
    login: &Limit,
    key: &Key,
) {
    let fourth = replica.check(login, key).await.unwrap();
    assert!(fourth.is_refused(), "replica {name} let the 4th attempt in");
    assert!(!fourth.is_unreachable());
    assert_eq!(fourth.count(), Some(3));
    assert_eq!(fourth.remaining(), Some(0));
    assert!(fourth.retry_after().unwrap() <= LONG_WINDOW);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_hits_let_exactly_max_through() {
    let db = fresh_db().await;
    let limiter = Arc::new(Limiter::new(Postgres::new(db.config())));
    let forgot = limit("forgot-password", 10);
    let key = Key::opaque("account-7");

    let calls: Vec<_> = (0..24)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            let (forgot, key) = (forgot.clone(), key.clone());
            tokio::spawn(async move { limiter.hit(&forgot, &key).await })
        })
        .collect();
    let mut counts = Vec::new();
    let mut allowed = 0;
    for call in calls {
        let verdict = call.await.unwrap().unwrap();
        assert!(!verdict.is_unreachable(), "{:?}", verdict.unreachable());
        allowed += usize::from(verdict.is_allowed());
        counts.push(verdict.count().unwrap());
    }
    counts.sort_unstable();
    assert_eq!(
        counts,
        (1..=24).collect::<Vec<u64>>(),
        "every hit counted once"
    );
    assert_eq!(allowed, 10, "exactly max hits go ahead");
    assert_eq!(stored_rows(&db).await, [(stored(&forgot, &key), 24)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_counted_apart_per_limit() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = limit("login", 3);
    let reset_password = limit("reset-password", 3);
    let alice = Key::email("alice@example.com");

    limiter.failed(&login, &alice).await.unwrap();
    limiter.failed(&login, &alice).await.unwrap();
    limiter.failed(&reset_password, &alice).await.unwrap();

    assert_eq!(
        limiter.check(&login, &alice).await.unwrap().count(),
        Some(2)
    );
    assert_eq!(
        limiter
            .check(&reset_password, &alice)
            .await
            .unwrap()
            .count(),
        Some(1)
    );
    assert_eq!(
        stored_rows(&db).await,
        [
            (stored(&login, &alice), 2),
            (stored(&reset_password, &alice), 1)
        ]
    );

    limiter.reset(&login, &alice).await.unwrap();
    assert_eq!(
        limiter.check(&login, &alice).await.unwrap().count(),
        Some(0)
    );
    assert_eq!(
        limiter
            .check(&reset_password, &alice)
            .await
            .unwrap()
            .count(),
        Some(1),
        "a reset under one limit leaves the other alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stored_key_is_the_limit_name_and_the_encoded_key() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = limit("login", 3);
    // A quote, a separator, a NUL and non-ASCII text: all travel as a bind
    // parameter and come back as they went.
    let key = Key::new(["it's", "a|b", "nul\0here", "Ωμέγα ✓"]).unwrap();

    limiter.failed(&login, &key).await.unwrap();
    assert_eq!(stored_rows(&db).await, [(stored(&login, &key), 1)]);
    assert_eq!(limiter.check(&login, &key).await.unwrap().count(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_writes_nothing() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    for _ in 0..5 {
        let verdict = limiter.check(&login, &alice).await.unwrap();
        assert!(verdict.is_allowed());
        assert_eq!(verdict.count(), Some(0));
    }
    assert_eq!(stored_rows(&db).await, [], "a check left a row behind");

    limiter.failed(&login, &alice).await.unwrap();
    for _ in 0..5 {
        assert_eq!(
            limiter.check(&login, &alice).await.unwrap().count(),
            Some(1)
        );
    }
    assert_eq!(stored_rows(&db).await, [(stored(&login, &alice), 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaxed_durability_counts_and_stays_inside_the_limiter_transaction() {
    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    held.lock()
        .await
        .batch_execute("SET synchronous_commit = on")
        .await
        .unwrap();
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))).with_relaxed_durability());
    let login = limit("login", 2);
    let alice = Key::email("alice@example.com");

    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );
    let hit = limiter.hit(&login, &alice).await.unwrap();
    assert_eq!(hit.count(), Some(2));
    assert!(hit.is_allowed());
    assert!(limiter.check(&login, &alice).await.unwrap().is_refused());
    limiter.reset(&login, &alice).await.unwrap();
    assert_eq!(stored_rows(&db).await, []);

    let client = held.lock().await;
    let setting: String = client
        .query_one("SELECT current_setting('synchronous_commit')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(setting, "on", "the session's own commits stay durable");
    assert_idle(&client).await;
}

// ---------------------------------------------------------------------------
// Purge
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_drops_windows_that_closed_long_ago() {
    let db = fresh_db().await;
    let mut system = db.connect().await;
    // Relative to the database's clock; purge keeps a day of closed windows.
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         SELECT key, window_end - interval '15 minutes', window_end, 1
         FROM (VALUES
             ('old|a', now() - interval '24 hours 1 minute'),
             ('old|b', now() - interval '3 days'),
             ('old|c', now() - interval '300 days'),
             ('old|a', now() - interval '30 days'),
             ('recent|a', now() - interval '23 hours 59 minutes'),
             ('recent|b', now() - interval '1 minute'),
             ('open|a', now() + interval '1 second'),
             ('open|b', now() + interval '30 days')
         ) AS rows (key, window_end)",
        &[],
    )
    .await;

    let purged = purge(&db.config()).await.unwrap();
    assert_eq!(purged, 4, "the windows that closed more than a day ago");
    let left: Vec<String> = stored_rows(&db).await.into_iter().map(|r| r.0).collect();
    assert_eq!(left, ["open|a", "open|b", "recent|a", "recent|b"]);

    assert_eq!(
        purge(&db.config()).await.unwrap(),
        0,
        "nothing more to purge"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_works_through_more_rows_than_one_batch() {
    let db = fresh_db().await;
    let mut system = db.connect().await;
    let closed = 2 * PURGE_BATCH_ROWS + 2_000;
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         SELECT 'old|' || g, now() - interval '3 days', now() - interval '2 days', g
         FROM generate_series(1, $1::int8) AS g",
        &[&closed],
    )
    .await;
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         VALUES ('open|a', now() - interval '1 minute', now() + interval '1 hour', 1)",
        &[],
    )
    .await;

    assert_eq!(purge(&db.config()).await.unwrap(), closed as u64);
    let left: Vec<String> = stored_rows(&db).await.into_iter().map(|r| r.0).collect();
    assert_eq!(left, ["open|a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_of_exactly_one_full_batch_stops() {
    let db = fresh_db().await;
    let mut system = db.connect().await;
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         SELECT 'old|' || g, now() - interval '3 days', now() - interval '2 days', 1
         FROM generate_series(1, $1::int8) AS g",
        &[&PURGE_BATCH_ROWS],
    )
    .await;
    assert_eq!(purge(&db.config()).await.unwrap(), PURGE_BATCH_ROWS as u64);
    assert_eq!(stored_rows(&db).await, []);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_skips_rows_it_would_wait_for() {
    let db = fresh_db().await;
    let mut system = db.connect().await;
    as_system(
        &mut system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         VALUES ('old|locked', now() - interval '3 days', now() - interval '2 days', 1),
                ('old|free', now() - interval '3 days', now() - interval '2 days', 1)",
        &[],
    )
    .await;

    let mut locker = db.connect().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("SET LOCAL platformkit.system = 'on'")
        .await
        .unwrap();
    let locked = lock
        .query(
            "SELECT 1 FROM platformkit.platformkit_limits WHERE key = 'old|locked' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(locked.len(), 1);

    let started = Instant::now();
    assert_eq!(purge(&db.config()).await.unwrap(), 1, "only the free row");
    assert!(
        started.elapsed() < PURGE_BATCH_BUDGET,
        "purge waited for the lock"
    );
    lock.rollback().await.unwrap();

    assert_eq!(purge(&db.config()).await.unwrap(), 1, "the row, once free");
    assert_eq!(stored_rows(&db).await, []);
}

// ---------------------------------------------------------------------------
// Row-level security and the system switch
// ---------------------------------------------------------------------------

/// Tables in schema `public` that may stay outside row-level security, each
/// with the reason. None today: every table of the crate holds keys.
const EXEMPT: &[(&str, &str)] = &[];

/// Tables in schema `public` without row-level security enabled *and* forced
/// *and* at least one policy, less the [`EXEMPT`] ones.
async fn unscoped_tables(client: &Client) -> Vec<String> {
    client
        .query(
            "SELECT c.relname::text
             FROM pg_catalog.pg_class AS c
             JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public'
               AND c.relkind IN ('r', 'p')
               AND NOT (c.relrowsecurity
                        AND c.relforcerowsecurity
                        AND EXISTS (SELECT 1 FROM pg_catalog.pg_policy AS p
                                    WHERE p.polrelid = c.oid))
             ORDER BY 1",
            &[],
        )
        .await
        .expect("listing tables")
        .iter()
        .map(|row| row.get::<_, String>(0))
        .filter(|table| !EXEMPT.iter().any(|(exempt, _)| exempt == table))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_table_is_scoped_or_exempt_on_purpose() {
    let db = fresh_db().await;
    let client = db.connect().await;
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'platformkit' \
             AND tablename = 'platformkit_limits'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        tables, 1,
        "the schema creates platformkit_limits in schema platformkit"
    );
    assert_eq!(unscoped_tables(&client).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scope_check_finds_an_unscoped_table() {
    let db = Server::shared().empty_database().await;
    let client = db.connect().await;
    client.batch_execute(SCHEMA).await.unwrap();
    client
        .batch_execute("CREATE TABLE scratch_unscoped (x int)")
        .await
        .unwrap();
    assert_eq!(unscoped_tables(&client).await, ["scratch_unscoped"]);

    client
        .batch_execute(
            "CREATE TABLE scratch_not_forced (x int);
             ALTER TABLE scratch_not_forced ENABLE ROW LEVEL SECURITY;
             CREATE POLICY p ON scratch_not_forced USING (false);
             CREATE TABLE scratch_no_policy (x int);
             ALTER TABLE scratch_no_policy ENABLE ROW LEVEL SECURITY;
             ALTER TABLE scratch_no_policy FORCE ROW LEVEL SECURITY;",
        )
        .await
        .unwrap();
    assert_eq!(
        unscoped_tables(&client).await,
        [
            "scratch_no_policy",
            "scratch_not_forced",
            "scratch_unscoped"
        ]
    );
}

/// With a row the limiter wrote, `client` (outside the limiter's transaction)
/// can neither see, add, change nor delete a row.
async fn assert_out_of_reach(db: &TestDb, client: &Client, login: &Limit, key: &Key) {
    let key = stored(login, key);
    assert_eq!(stored_rows(db).await, [(key.clone(), 2)]);

    let seen: i64 = client
        .query_one("SELECT count(*) FROM platformkit.platformkit_limits", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 0, "SELECT saw the limiter's rows");
    let is_system: bool = client
        .query_one("SELECT platformkit.platformkit_is_system()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!is_system);

    let insert = client
        .execute(
            "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             VALUES ('login|forged', now(), now() + interval '1 hour', 0)",
            &[],
        )
        .await
        .expect_err("INSERT went through row-level security");
    assert_eq!(
        insert.code(),
        Some(&SqlState::INSUFFICIENT_PRIVILEGE),
        "{insert:?}"
    );
    assert!(
        insert
            .as_db_error()
            .is_some_and(|e| e.message().contains("row-level security")),
        "refused for another reason than row-level security: {insert:?}"
    );

    let updated = client
        .execute(
            "UPDATE platformkit.platformkit_limits SET count = 0 WHERE key = $1",
            &[&key],
        )
        .await
        .unwrap();
    assert_eq!(updated, 0, "UPDATE reached the limiter's row");
    let deleted = client
        .execute("DELETE FROM platformkit.platformkit_limits", &[])
        .await
        .unwrap();
    assert_eq!(deleted, 0, "DELETE reached the limiter's row");

    assert_eq!(stored_rows(db).await, [(key, 2)], "the row changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owning_role_cannot_reach_the_rows_outside_the_limiter() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    limiter.failed(&login, &alice).await.unwrap();
    limiter.failed(&login, &alice).await.unwrap();

    let owner = db.connect().await;
    assert_out_of_reach(&db, &owner, &login, &alice).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_role_cannot_reach_the_rows_outside_the_limiter() {
    let db = fresh_db().await;
    // The limiter connects as the application role: its grants are enough.
    let limiter = Limiter::new(Postgres::new(db.tenant_config()));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    limiter.failed(&login, &alice).await.unwrap();
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(2)
    );

    let tenant = db.connect_tenant().await;
    assert_out_of_reach(&db, &tenant, &login, &alice).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_switch_does_not_outlive_the_limiter_transaction() {
    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");

    for call in ["failed", "hit", "check", "reset"] {
        match call {
            "failed" => drop(limiter.failed(&login, &alice).await.unwrap()),
            "hit" => drop(limiter.hit(&login, &alice).await.unwrap()),
            "check" => drop(limiter.check(&login, &alice).await.unwrap()),
            _ => limiter.reset(&login, &alice).await.unwrap(),
        }
        let client = held.lock().await;
        let switch = system_switch(&client).await;
        assert!(
            matches!(switch.as_deref(), None | Some("")),
            "after {call}, the switch reads {switch:?}"
        );
        assert_idle(&client).await;
        if call != "reset" {
            let seen: i64 = client
                .query_one("SELECT count(*) FROM platformkit.platformkit_limits", &[])
                .await
                .unwrap()
                .get(0);
            assert_eq!(seen, 0, "after {call}, the session sees the rows");
        }
    }
}

// ---------------------------------------------------------------------------
// Unreachable: allowed, loudly, within the budget
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_server_that_does_not_listen_is_unreachable() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let limiter = Limiter::new(Postgres::new(nothing_listens()))
        .with_budget(BUDGET)
        .unwrap();
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    let started = Instant::now();
    let verdict = limiter.failed(&login, &alice).await.unwrap();
    let took = started.elapsed();
    assert!(verdict.is_allowed() && verdict.is_unreachable());
    assert_eq!(verdict.unreachable().unwrap().kind(), ErrorKind::Connect);
    assert_eq!(verdict.count(), None);
    assert!(took < BUDGET + SLACK, "took {took:?}");

    let err = limiter.reset(&login, &alice).await.unwrap_err();
    assert!(err.is_unreachable(), "{err:?}");

    let recorded = Recorded::take(&snapshotter);
    assert_eq!(recorded.calls("login", "failed", "unreachable"), 1);
    assert_eq!(recorded.calls("login", "reset", "unreachable"), 1);
}

#[tokio::test]
async fn a_server_that_never_answers_is_unreachable_within_the_budget() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    // Accepts connections and never says a word.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let silent = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            sockets.push(socket);
        }
    });
    let mut config = Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user("limit_owner")
        .dbname("silent");

    let limiter = Limiter::new(Postgres::new(config))
        .with_budget(BUDGET)
        .unwrap();
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    for _ in 0..2 {
        let started = Instant::now();
        let verdict = limiter.check(&login, &alice).await.unwrap();
        let took = started.elapsed();
        assert!(verdict.is_allowed() && verdict.is_unreachable());
        assert_eq!(verdict.unreachable().unwrap().kind(), ErrorKind::Timeout);
        assert!(took >= BUDGET - Duration::from_millis(50), "took {took:?}");
        assert!(took < BUDGET + SLACK, "took {took:?}");
    }
    silent.abort();

    let recorded = Recorded::take(&snapshotter);
    assert_eq!(recorded.calls("login", "check", "unreachable"), 2);
}

#[tokio::test]
/// A lock held past the server's part of the budget is the server
/// answering, not an outage: whoever holds it (a stuck session, or the
/// limiter's own role with the switch on) cannot turn it into an allow.
async fn a_row_locked_by_another_session_is_a_lock_timeout_never_an_allow() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))))
        .with_budget(BUDGET)
        .unwrap();
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );

    // Another session holds the row.
    let mut locker = db.connect().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("SET LOCAL platformkit.system = 'on'")
        .await
        .unwrap();
    let locked = lock
        .query(
            "SELECT count FROM platformkit.platformkit_limits WHERE key = $1 FOR UPDATE",
            &[&stored(&login, &alice)],
        )
        .await
        .unwrap();
    assert_eq!(locked.len(), 1);

    let started = Instant::now();
    let err = limiter
        .failed(&login, &alice)
        .await
        .expect_err("a held lock gave a verdict");
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::LockTimeout, "{err:?}");
    assert_eq!(err.code(), Some(&SqlState::LOCK_NOT_AVAILABLE));
    assert!(!err.is_unreachable());
    assert!(took < BUDGET + SLACK, "took {took:?}");

    // The server gives up the wait by itself, lock still held: the statement
    // is aborted, not left to go through once the lock is released.
    let admin = db.connect_admin().await;
    assert_no_lock_waits_soon(&admin).await;
    lock.rollback().await.unwrap();

    {
        let client = held.lock().await;
        let one = client.simple_query("SELECT 1").await.unwrap();
        assert!(!one.is_empty());
        assert_idle(&client).await;
        let switch = system_switch(&client).await;
        assert!(matches!(switch.as_deref(), None | Some("")), "{switch:?}");
    }
    let next = limiter.failed(&login, &alice).await.unwrap();
    assert!(!next.is_unreachable(), "{:?}", next.unreachable());
    assert_eq!(
        next.count(),
        Some(2),
        "the failure refused at the lock was recorded after all"
    );

    let recorded = Recorded::take(&snapshotter);
    assert_eq!(recorded.calls("login", "failed", "unreachable"), 0);
    assert_eq!(recorded.calls("login", "failed", "error"), 1);
    assert_eq!(recorded.calls("login", "failed", "allowed"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_is_cancelled_on_the_server_within_the_budget_and_the_connection_comes_back_idle()
 {
    let db = fresh_db().await;
    // A server slow for reasons no lock_timeout covers: every write of the
    // table takes 0.8 s.
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
    let held = hold(&db.config()).await;
    let budget = Duration::from_millis(300);
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))))
        .with_budget(budget)
        .unwrap();
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");

    let started = Instant::now();
    let verdict = limiter.failed(&login, &alice).await.unwrap();
    let took = started.elapsed();
    assert!(verdict.is_allowed() && verdict.is_unreachable());
    let cause = verdict.unreachable().unwrap();
    assert_eq!(cause.kind(), ErrorKind::Timeout, "{cause:?}");
    assert_eq!(
        cause.code(),
        Some(&SqlState::QUERY_CANCELED),
        "the server stopped the call: the limiter cancelled it before its budget ran out"
    );
    assert!(took < budget + SLACK, "took {took:?}");

    // Nothing was left running or half done: the connection answers at once,
    // outside any transaction, with the switch off, and nothing was written.
    {
        let client = held.lock().await;
        client.simple_query("SELECT 1").await.unwrap();
        assert_idle(&client).await;
        let switch = system_switch(&client).await;
        assert!(matches!(switch.as_deref(), None | Some("")), "{switch:?}");
    }
    assert_eq!(
        stored_rows(&db).await,
        [],
        "the cancelled call wrote nothing"
    );

    db.connect()
        .await
        .batch_execute("DROP TRIGGER slow_write ON platformkit.platformkit_limits")
        .await
        .unwrap();
    let next = limiter.failed(&login, &alice).await.unwrap();
    assert!(!next.is_unreachable(), "{:?}", next.unreachable());
    assert_eq!(next.count(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_connection_is_unreachable() {
    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))))
        .with_budget(BUDGET)
        .unwrap();
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    limiter.failed(&login, &alice).await.unwrap();

    let pid: i32 = held
        .lock()
        .await
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let admin = db.connect_admin().await;
    let terminated: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(terminated);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !held.lock().await.is_closed() {
        assert!(Instant::now() < deadline, "the connection stayed open");
        sleep(Duration::from_millis(10)).await;
    }

    let started = Instant::now();
    let verdict = limiter.failed(&login, &alice).await.unwrap();
    assert!(verdict.is_allowed() && verdict.is_unreachable());
    assert_eq!(verdict.unreachable().unwrap().kind(), ErrorKind::Connect);
    assert!(started.elapsed() < BUDGET + SLACK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_unreachable_and_the_counts_are_there_when_it_is_back() {
    let server = tokio::task::block_in_place(|| Server::start(Options::default()));
    let db = server.database(SCHEMA).await;
    let limiter = Limiter::new(Postgres::new(db.config()))
        .with_budget(BUDGET)
        .unwrap();
    let held = hold(&db.config()).await;
    let held_limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))))
        .with_budget(BUDGET)
        .unwrap();
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );

    tokio::task::block_in_place(|| server.pg_ctl(&["stop", "-m", "fast", "-w"]));
    let started = Instant::now();
    let verdict = limiter.failed(&login, &alice).await.unwrap();
    assert!(verdict.is_allowed() && verdict.is_unreachable());
    assert_eq!(verdict.unreachable().unwrap().kind(), ErrorKind::Connect);
    assert!(started.elapsed() < BUDGET + SLACK);
    // A connection held across the stop is lost too.
    let started = Instant::now();
    let verdict = held_limiter.failed(&login, &alice).await.unwrap();
    assert!(verdict.is_allowed() && verdict.is_unreachable());
    assert_eq!(verdict.unreachable().unwrap().kind(), ErrorKind::Connect);
    assert!(started.elapsed() < BUDGET + SLACK);

    tokio::task::block_in_place(|| server.pg_ctl(&["start", "-w"]));
    let verdict = limiter.failed(&login, &alice).await.unwrap();
    assert!(!verdict.is_unreachable(), "{:?}", verdict.unreachable());
    assert_eq!(
        verdict.count(),
        Some(2),
        "the count outlived the restart; the unreachable failures were not recorded"
    );
    drop(held_limiter);
    drop(held);
    tokio::task::block_in_place(|| drop(server));
}

// ---------------------------------------------------------------------------
// Hard errors: never a silent allow
// ---------------------------------------------------------------------------

/// Hands the limiter a connection inside a transaction the caller opened with
/// `begin` (which may write to `caller_work`), and checks that the limiter
/// refuses it with an error, commits nothing and leaves the connection idle.
async fn assert_refused_inside_callers_transaction(begin: &str) {
    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    held.lock()
        .await
        .batch_execute("CREATE TABLE caller_work (x int)")
        .await
        .unwrap();
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");

    // The caller's script may end in an error on purpose (an aborted
    // transaction); what matters is the state it leaves.
    let _ = held.lock().await.batch_execute(begin).await;

    let err = limiter
        .failed(&login, &alice)
        .await
        .expect_err("a connection inside a transaction gave a verdict");
    assert!(!err.is_unreachable(), "{err:?}");

    {
        let client = held.lock().await;
        assert_idle(&client).await;
        let seen: i64 = client
            .query_one("SELECT count(*) FROM caller_work", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(seen, 0, "the caller's work was committed");
        let switch = system_switch(&client).await;
        assert!(matches!(switch.as_deref(), None | Some("")), "{switch:?}");
    }
    let other: i64 = db
        .connect()
        .await
        .query_one("SELECT count(*) FROM caller_work", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(other, 0, "the caller's work was committed");
    assert_eq!(stored_rows(&db).await, [], "the failure was recorded");

    let verdict = limiter.failed(&login, &alice).await.unwrap();
    assert_eq!(verdict.count(), Some(1), "the connection is usable again");

    // Said as what it is, so the caller can tell it from a misconfiguration.
    assert_eq!(err.kind(), ErrorKind::InTransaction, "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_inside_the_callers_transaction_is_an_error_and_nothing_is_committed() {
    assert_refused_inside_callers_transaction("BEGIN; INSERT INTO caller_work VALUES (1)").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_inside_a_serializable_transaction_is_an_error_and_nothing_is_committed() {
    assert_refused_inside_callers_transaction(
        "BEGIN ISOLATION LEVEL SERIALIZABLE; INSERT INTO caller_work VALUES (1)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_inside_a_read_only_transaction_is_an_error() {
    assert_refused_inside_callers_transaction("BEGIN READ ONLY; SELECT count(*) FROM caller_work")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_inside_a_failed_transaction_is_an_error_and_nothing_is_committed() {
    assert_refused_inside_callers_transaction(
        "BEGIN; INSERT INTO caller_work VALUES (1); SELECT 1 / 0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_schema_table_or_privilege_is_an_error_not_an_allow() {
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");

    // No schema at all: the limiter's schema and procedures are missing.
    let empty = Server::shared().empty_database().await;
    let held = hold(&empty.config()).await;
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))));
    for verdict in [
        limiter.check(&login, &alice).await,
        limiter.failed(&login, &alice).await,
        limiter.hit(&login, &alice).await,
    ] {
        let err = verdict.expect_err("a missing schema gave a verdict");
        assert_eq!(err.kind(), ErrorKind::Query, "{err:?}");
        assert_eq!(err.code(), Some(&SqlState::INVALID_SCHEMA_NAME));
        assert!(!err.is_unreachable());
    }
    let err = limiter.reset(&login, &alice).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Query, "{err:?}");
    assert_idle(&*held.lock().await).await;

    // The procedures without their table: the statement fails inside the
    // limiter's transaction, with the system switch already on.
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute("DROP TABLE platformkit.platformkit_limits")
        .await
        .unwrap();
    let held = hold(&db.config()).await;
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))));
    for verdict in [
        limiter.check(&login, &alice).await,
        limiter.failed(&login, &alice).await,
        limiter.hit(&login, &alice).await,
    ] {
        let err = verdict.expect_err("a missing table gave a verdict");
        assert_eq!(err.kind(), ErrorKind::Query, "{err:?}");
        assert_eq!(err.code(), Some(&SqlState::UNDEFINED_TABLE));
        assert!(!err.is_unreachable());
    }
    {
        let client = held.lock().await;
        assert_idle(&client).await;
        let switch = system_switch(&client).await;
        assert!(matches!(switch.as_deref(), None | Some("")), "{switch:?}");
    }

    // The table without the grants the limiter needs.
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute("REVOKE ALL ON platformkit.platformkit_limits FROM limit_tenant")
        .await
        .unwrap();
    let limiter = Limiter::new(Postgres::new(db.tenant_config()));
    let err = limiter
        .failed(&login, &alice)
        .await
        .expect_err("a missing privilege gave a verdict");
    assert_eq!(err.kind(), ErrorKind::Query, "{err:?}");
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
}

// ---------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------

#[tokio::test]
async fn metrics_count_every_call_by_limit_operation_and_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let db = fresh_db().await;
    // Without the refusal cache, every call reaches the store: this test is
    // about what the store's answers count (tests/refusal_cache.rs covers
    // the cache).
    let limiter = Limiter::new(Postgres::new(db.config())).without_refusal_cache();
    let unreachable = Limiter::new(Postgres::new(nothing_listens()))
        .with_budget(BUDGET)
        .unwrap();
    let missing_table = Limiter::new(Postgres::new(
        Server::shared().empty_database().await.config(),
    ));
    let login = limit("login", 2);
    let alice = Key::email("alice@example.com");

    assert!(limiter.check(&login, &alice).await.unwrap().is_allowed());
    assert!(limiter.failed(&login, &alice).await.unwrap().is_allowed());
    assert!(limiter.failed(&login, &alice).await.unwrap().is_refused());
    assert!(limiter.check(&login, &alice).await.unwrap().is_refused());
    assert!(limiter.hit(&login, &alice).await.unwrap().is_refused());
    limiter.reset(&login, &alice).await.unwrap();
    assert!(
        unreachable
            .check(&login, &alice)
            .await
            .unwrap()
            .is_unreachable()
    );
    assert!(missing_table.failed(&login, &alice).await.is_err());

    let recorded = Recorded::take(&snapshotter);
    assert_eq!(
        recorded.calls,
        series(&[
            ("login", "check", "allowed", 1),
            ("login", "check", "refused", 1),
            ("login", "check", "unreachable", 1),
            ("login", "failed", "allowed", 1),
            ("login", "failed", "error", 1),
            ("login", "failed", "refused", 1),
            ("login", "hit", "refused", 1),
            ("login", "reset", "cleared", 1),
        ])
    );
    let durations: BTreeMap<(String, String), usize> =
        [("check", 3), ("failed", 3), ("hit", 1), ("reset", 1)]
            .into_iter()
            .map(|(op, n)| (("login".to_owned(), op.to_owned()), n))
            .collect();
    assert_eq!(
        recorded.durations, durations,
        "one duration sample per call"
    );

    for (name, value) in &recorded.labels {
        assert!(
            !value.contains("alice") && value != alice.as_str(),
            "label {name} carries the key: {value:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// Hostile sessions and pinned time
// ---------------------------------------------------------------------------

/// 2024-06-15 11:30:00 UTC: 23:15 on the same day in Pacific/Chatham
/// (+12:45), so a day counted in the session's time zone would end at
/// 11:15 UTC instead of midnight UTC.
const JUNE_15_1130_UTC: u64 = 1_718_451_000;
const JUNE_16_MIDNIGHT_UTC: u64 = 1_718_496_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_session_settings_do_not_break_the_statement() {
    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    held.lock()
        .await
        .batch_execute(
            "SET default_transaction_isolation = 'serializable';
             SET default_transaction_deferrable = on;
             SET TimeZone = 'Pacific/Chatham';
             SET default_transaction_read_only = on;
             SET row_security = off;
             SET DateStyle = 'SQL, DMY';
             SET IntervalStyle = 'sql_standard';
             SET standard_conforming_strings = off;
             SET transform_null_equals = on;
             SET search_path = public;
             SET lock_timeout = 1;
             SET synchronous_commit = on;",
        )
        .await
        .unwrap();
    let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(JUNE_15_1130_UTC));
    let hostile = Limiter::new(Postgres::new(lend(Arc::clone(&held))).with_clock(clock.clone()));
    let plain = Limiter::new(Postgres::new(db.config()).with_clock(clock.clone()));
    let daily = Limit::new("daily", 3, Duration::from_secs(24 * 60 * 60)).unwrap();
    let alice = Key::email("alice@example.com");
    let bob = Key::email("bob@example.com");

    let first = hostile.failed(&daily, &alice).await.unwrap();
    assert!(!first.is_unreachable(), "{:?}", first.unreachable());
    assert_eq!(first.count(), Some(1));
    assert_eq!(
        hostile.check(&daily, &alice).await.unwrap().count(),
        Some(1)
    );
    let hit = hostile.hit(&daily, &alice).await.unwrap();
    assert_eq!(hit.count(), Some(2));
    assert!(hit.is_allowed());
    assert_eq!(stored_rows(&db).await, [(stored(&daily, &alice), 2)]);

    // The session's time zone does not move the window's end.
    let midnight = UNIX_EPOCH + Duration::from_secs(JUNE_16_MIDNIGHT_UTC);
    assert_eq!(first.reopens_at(), Some(midnight));
    let under_utc = plain.failed(&daily, &bob).await.unwrap();
    assert_eq!(under_utc.reopens_at(), first.reopens_at());

    hostile.reset(&daily, &alice).await.unwrap();
    assert_eq!(
        hostile.check(&daily, &alice).await.unwrap().count(),
        Some(0)
    );
    assert_eq!(stored_rows(&db).await, [(stored(&daily, &bob), 1)]);

    // The limiter's own settings ended with its transactions; the session's
    // are as the session left them.
    let row = held
        .lock()
        .await
        .query_one(
            "SELECT current_setting('default_transaction_isolation'),
                    current_setting('default_transaction_read_only'),
                    current_setting('TimeZone'),
                    current_setting('row_security'),
                    current_setting('lock_timeout'),
                    current_setting('synchronous_commit'),
                    coalesce(current_setting('platformkit.system', true), '')",
            &[],
        )
        .await
        .unwrap();
    let settings: Vec<String> = (0..row.len()).map(|i| row.get(i)).collect();
    assert_eq!(
        settings,
        [
            "serializable",
            "on",
            "Pacific/Chatham",
            "off",
            "1ms",
            "on",
            ""
        ]
    );
}

/// A session `statement_timeout` shorter than the budget would let the
/// server cancel a call the limiter has not given up on; a role default
/// (`ALTER ROLE app SET statement_timeout = '1ms'`) would make every replica
/// fail open. It is refused as a misconfiguration before anything is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_statement_timeout_shorter_than_the_budget_is_a_misconfiguration_never_an_allow()
{
    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );
    for timeout in ["1ms", "200ms", "1s"] {
        held.lock()
            .await
            .batch_execute(&format!("SET statement_timeout = '{timeout}'"))
            .await
            .unwrap();
        for result in [
            limiter.check(&login, &alice).await,
            limiter.failed(&login, &alice).await,
        ] {
            let err = result.expect_err("a short statement_timeout gave a verdict");
            assert!(!err.is_unreachable(), "{timeout}: {err:?}");
            if timeout == "1ms" {
                // The server may stop the call before the procedure reaches
                // its check: a cancel the limiter did not send, as hard.
                assert!(
                    matches!(err.kind(), ErrorKind::Misconfigured | ErrorKind::Cancelled),
                    "{err:?}"
                );
            } else {
                assert_eq!(err.kind(), ErrorKind::Misconfigured, "{timeout}: {err:?}");
                assert_eq!(err.code(), Some(&SqlState::from_code("PK001")));
            }
        }
        assert_idle(&*held.lock().await).await;
    }

    // Longer than the budget: the limiter gives up first, so it is no
    // concern of the procedure's.
    held.lock()
        .await
        .batch_execute("SET statement_timeout = '1min'")
        .await
        .unwrap();
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(2),
        "a refused call counted, or a long timeout was refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_time_crosses_windows() {
    let db = fresh_db().await;
    let t = UNIX_EPOCH + Duration::from_micros(1_700_000_123_456_789);
    let clock = ManualClock::new(t);
    let limiter = Limiter::new(Postgres::new(db.config()).with_clock(clock.clone()));
    let login = Limit::new("login", 3, Duration::from_secs(60)).unwrap();
    let alice = Key::email("alice@example.com");

    for n in 1..=3 {
        let verdict = limiter.failed(&login, &alice).await.unwrap();
        assert_eq!(verdict.count(), Some(n));
        assert_eq!(verdict.is_refused(), n == 3);
    }
    let fourth = limiter.check(&login, &alice).await.unwrap();
    assert!(fourth.is_refused());
    let reopens_at = fourth.reopens_at().unwrap();
    let since_epoch = reopens_at.duration_since(UNIX_EPOCH).unwrap();
    assert_eq!(since_epoch, Duration::from_secs(1_700_000_160));
    assert_eq!(since_epoch.as_secs() % 60, 0);
    assert_eq!(since_epoch.subsec_nanos(), 0);
    assert_eq!(
        fourth.retry_after(),
        Some(reopens_at.duration_since(t).unwrap()),
        "measured on the pinned clock"
    );

    clock.set(reopens_at - Duration::from_micros(1));
    assert!(
        limiter.check(&login, &alice).await.unwrap().is_refused(),
        "the window is still open a microsecond before its end"
    );

    clock.set(reopens_at);
    let next = limiter.check(&login, &alice).await.unwrap();
    assert!(next.is_allowed());
    assert_eq!(next.count(), Some(0));
    assert_eq!(
        next.reopens_at(),
        Some(reopens_at + Duration::from_secs(60))
    );
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );
    assert_eq!(
        stored_rows(&db).await,
        [(stored(&login, &alice), 3), (stored(&login, &alice), 1)],
        "one row per window"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_before_the_epoch_are_whole_multiples_too() {
    let db = fresh_db().await;
    let clock = ManualClock::new(UNIX_EPOCH - Duration::from_secs(90));
    let limiter = Limiter::new(Postgres::new(db.config()).with_clock(clock));
    let login = Limit::new("login", 3, Duration::from_secs(60)).unwrap();
    let verdict = limiter
        .failed(&login, &Key::opaque("account-1"))
        .await
        .unwrap();
    let expected: SystemTime = UNIX_EPOCH - Duration::from_secs(60);
    assert_eq!(verdict.reopens_at(), Some(expected));
}
