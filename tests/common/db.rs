//! Databases, the connections a test holds or lends to the limiter, and what
//! a test reads of them: as the system (the switch on), as the superuser
//! (who is not subject to row-level security), or as a login granted
//! nothing.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use platformkit_limit::{Key, Limit, LimitConn, Limiter, Postgres, SCHEMA};
use platformkit_limit_testdb::{Server, TestDb, connect};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio::time::{Instant, sleep};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, Row, SimpleQueryMessage};

/// A fresh database with the schema, on the shared server.
///
/// Every test gets a database of its own on a throwaway server (or on the
/// one `DATABASE_URL` names), with the schema applied as `limit_owner`: the
/// owner of the table, no superuser and subject to `FORCE ROW LEVEL
/// SECURITY`. A limiter over `db.config()` connects as that role, so its
/// system switch is really exercised.
pub async fn fresh_db() -> TestDb {
    Server::shared().database(SCHEMA).await
}

/// The key as the table stores it: the limit's name, `|`, the encoded key.
pub fn stored(limit: &Limit, key: &Key) -> String {
    format!("{}|{}", limit.name(), key.as_str())
}

/// One connection held for the whole test, as a framework holds the
/// connection of a request.
pub async fn hold(config: &Config) -> Arc<Mutex<Client>> {
    Arc::new(Mutex::new(connect(config).await))
}

/// A connection source that lends the held connection to one call at a time,
/// so the limiter's calls run in the session the test set up.
pub fn lend(
    held: Arc<Mutex<Client>>,
) -> impl LimitConn<Conn = OwnedMutexGuard<Client>, Error = Infallible> {
    move || {
        let held = Arc::clone(&held);
        async move { Ok::<_, Infallible>(held.lock_owned().await) }
    }
}

/// A limiter with `budget` over `held`, lent to one call at a time.
pub fn on_held(
    held: &Arc<Mutex<Client>>,
    budget: Duration,
) -> Limiter<Postgres<impl LimitConn<Conn = OwnedMutexGuard<Client>, Error = Infallible> + use<>>> {
    Limiter::builder(Postgres::new(lend(Arc::clone(held))))
        .budget(budget)
        .build()
        .expect("a valid budget")
}

/// A small pool: connections held for the whole test, each lent to one call
/// at a time, an idle one first.
pub struct Pool {
    conns: Vec<Arc<Mutex<Client>>>,
    next: AtomicUsize,
}

impl Pool {
    pub async fn open(config: &Config, size: usize) -> Pool {
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

/// Runs `sql` inside a transaction with the system switch on, as the limiter
/// does: the only way an ordinary role sees or changes the table.
pub async fn as_system(client: &mut Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<Row> {
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
pub async fn stored_rows(db: &TestDb) -> Vec<(String, i64)> {
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

/// Every row of the real table, read by its owner with the switch on:
/// `(key, window_start as Unix seconds, count)`.
pub async fn stored_windows(db: &TestDb) -> Vec<(String, i64, i64)> {
    let mut owner = db.connect().await;
    as_system(
        &mut owner,
        "SELECT key, pg_catalog.date_part('epoch', window_start)::bigint, count \
         FROM platformkit.platformkit_limits ORDER BY key, window_start",
        &[],
    )
    .await
    .iter()
    .map(|row| (row.get(0), row.get(1), row.get(2)))
    .collect()
}

/// The one `bigint` a query returns.
pub async fn one_i64(client: &Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> i64 {
    client
        .query_one(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .get(0)
}

/// The first column of every row a query returns, as text.
pub async fn texts(client: &Client, sql: &str) -> Vec<String> {
    client
        .query(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Every key's total count, read as the superuser (who is not subject to
/// row-level security).
pub async fn counts_by_key(admin: &Client) -> BTreeMap<String, i64> {
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

/// How many rows of the table this session sees.
pub async fn visible_rows(client: &Client) -> i64 {
    one_i64(
        client,
        "SELECT count(*) FROM platformkit.platformkit_limits",
        &[],
    )
    .await
}

/// Whether the connection is idle, not inside a transaction: outside one,
/// each statement starts its own, so its start is the transaction's start.
pub async fn assert_idle(client: &Client) {
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
pub async fn system_switch(client: &Client) -> Option<String> {
    client
        .query_one(
            "SELECT pg_catalog.current_setting('platformkit.system', true)",
            &[],
        )
        .await
        .expect("reading the system switch")
        .get(0)
}

/// The pid of the session's backend. A typed query, which prepares no named
/// statement: one would not outlive its transaction through PgBouncer in
/// transaction pooling mode.
pub async fn backend_pid(client: &Client) -> i32 {
    client
        .query_typed_one("SELECT pg_catalog.pg_backend_pid()", &[])
        .await
        .expect("SELECT pg_backend_pid()")
        .get(0)
}

/// Connection settings for a port where nothing listens.
pub fn nothing_listens() -> Config {
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

/// Locks the key's rows from a session of its own, as the system, and keeps
/// the lock until the returned client is dropped or rolls back. Panics unless
/// there was a row to lock.
pub async fn lock_row(db: &TestDb, stored_key: &str) -> Client {
    lock_row_from(db.connect().await, stored_key).await
}

/// As [`lock_row`], from the session `locker`, of whichever role.
pub async fn lock_row_from(locker: Client, stored_key: &str) -> Client {
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

/// Writes `n` rows (`old|1` … `old|n`, a count of 1 each) whose windows
/// closed two days ago, rows any purge deletes; written through
/// [`as_system`].
pub async fn old_rows(system: &mut Client, n: i32) {
    as_system(
        system,
        "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         SELECT 'old|' || g, now() - interval '2 days 1 minute', now() - interval '2 days', 1
         FROM generate_series(1, $1) AS g",
        &[&n],
    )
    .await;
}

/// Revokes what [`grants`](platformkit_limit::grants) gave `role`, as
/// `owner` (the schema's owner), then drops the role, as `admin`.
pub async fn drop_role(owner: &Client, admin: &Client, role: &str) {
    owner
        .batch_execute(&format!(
            "REVOKE ALL ON ALL ROUTINES IN SCHEMA platformkit FROM \"{role}\";
             REVOKE ALL ON ALL TABLES IN SCHEMA platformkit FROM \"{role}\";
             REVOKE ALL ON SCHEMA platformkit FROM \"{role}\";"
        ))
        .await
        .unwrap();
    admin
        .batch_execute(&format!("DROP ROLE \"{role}\""))
        .await
        .unwrap();
}

/// Waits, for at most `within`, until a call of the limiter in the test's
/// database waits on a lock, and returns the pid of its backend.
pub async fn until_a_call_waits_on_a_lock(admin: &Client, within: Duration) -> i32 {
    let deadline = Instant::now() + within;
    loop {
        let waiting = admin
            .query(
                "SELECT pid FROM pg_catalog.pg_stat_activity
                 WHERE datname = pg_catalog.current_database()
                   AND query LIKE 'CALL platformkit.%' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .expect("reading pg_stat_activity");
        if let Some(row) = waiting.first() {
            return row.get(0);
        }
        assert!(
            Instant::now() < deadline,
            "the limiter's call never waited on the row lock"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// Terminates the backend `pid`, as the superuser `admin`; panics unless it
/// was there to terminate.
pub async fn terminate_backend(admin: &Client, pid: i32) {
    let terminated: bool = admin
        .query_one("SELECT pg_catalog.pg_terminate_backend($1)", &[&pid])
        .await
        .expect("SELECT pg_terminate_backend")
        .get(0);
    assert!(terminated, "backend {pid} was not there to terminate");
}

/// Backends of the test's database waiting on a lock.
pub async fn lock_waits(admin: &Client) -> i64 {
    one_i64(
        admin,
        "SELECT count(*) FROM pg_catalog.pg_stat_activity \
         WHERE datname = pg_catalog.current_database() AND wait_event_type = 'Lock'",
        &[],
    )
    .await
}

/// Waits up to two seconds for no backend of the database to wait on a lock
/// (after `what`, which the failure names).
pub async fn assert_no_lock_waits_soon(admin: &Client, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let waits = lock_waits(admin).await;
        if waits == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {waits} backend(s) still waiting on a lock two seconds later"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// A session of `limit_stranger`, with a lock timeout so that nothing it
/// queues for hangs the test, its backend's pid, and a trigger function of
/// its own for CREATE TRIGGER.
pub async fn stranger(db: &TestDb) -> (Client, i32) {
    let client = connect(&db.stranger_config()).await;
    client
        .batch_execute(
            "SET lock_timeout = '5s';
             CREATE FUNCTION pg_temp.pass() RETURNS trigger LANGUAGE plpgsql
                 AS $$ BEGIN RETURN NEW; END $$;",
        )
        .await
        .expect("a stranger's session");
    let pid = backend_pid(&client).await;
    (client, pid)
}

/// The error's SQLSTATE and message; panics on success.
pub fn refused<T: std::fmt::Debug>(
    result: Result<T, tokio_postgres::Error>,
    what: &str,
) -> (SqlState, String) {
    let err = match result {
        Ok(ok) => panic!("{what}: succeeded ({ok:?}), expected it to be refused"),
        Err(err) => err,
    };
    let db = err
        .as_db_error()
        .unwrap_or_else(|| panic!("{what}: not an answer from the server: {err:?}"));
    (db.code().clone(), db.message().to_owned())
}

/// The plans a session sent back, each the text of one NOTICE.
pub type Plans = Arc<std::sync::Mutex<Vec<String>>>;

/// The settings [`explained`] has `limit_tenant` set, granted once per
/// server (PostgreSQL 15's `GRANT SET ON PARAMETER`).
static EXPLAIN_GRANTED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// A session of the limiter's role, `limit_tenant`, in which every
/// statement, those the limiter's routines run included, sends its plan
/// back as a NOTICE (`auto_explain` at level NOTICE), and the plans it has
/// sent. The superuser grants the role the settings this takes and preloads
/// `auto_explain` for the role's sessions in this database only; the
/// session sets them itself, as an ordinary role may once granted.
pub async fn explained(db: &TestDb) -> (Arc<Mutex<Client>>, Plans) {
    let admin = db.connect_admin().await;
    EXPLAIN_GRANTED
        .get_or_init(|| async {
            admin
                .batch_execute(
                    "GRANT SET ON PARAMETER session_preload_libraries,
                         auto_explain.log_min_duration, auto_explain.log_nested_statements,
                         auto_explain.log_level, auto_explain.log_analyze,
                         auto_explain.log_buffers
                     TO limit_tenant",
                )
                .await
                .expect("granting limit_tenant auto_explain's settings");
        })
        .await;
    admin
        .batch_execute(&format!(
            "ALTER ROLE limit_tenant IN DATABASE \"{}\" SET session_preload_libraries = 'auto_explain'",
            db.name()
        ))
        .await
        .expect("preloading auto_explain");
    let (client, mut connection) = db
        .tenant_config()
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connecting as limit_tenant");
    let plans = Plans::default();
    let sent = Arc::clone(&plans);
    tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(tokio_postgres::AsyncMessage::Notice(notice)) => {
                    if notice.message().contains("plan:") {
                        sent.lock().unwrap().push(notice.message().to_owned());
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    client
        .batch_execute(
            "SET auto_explain.log_min_duration = 0;
             SET auto_explain.log_nested_statements = on;
             SET auto_explain.log_level = notice;",
        )
        .await
        .expect("turning auto_explain on");
    (Arc::new(Mutex::new(client)), plans)
}

/// Asserts that the plans sent so far reached the limiter's table, and
/// only through an index: no sequential scan of it, no JIT compilation and
/// no parallel workers in any of them.
#[track_caller]
pub fn assert_index_plans(plans: &Plans, what: &str) {
    let plans = plans.lock().unwrap();
    let table: Vec<&String> = plans
        .iter()
        .filter(|plan| plan.contains(" on platformkit_limits"))
        .collect();
    assert!(!table.is_empty(), "{what}: no plan reached the table");
    for plan in table {
        assert!(
            !plan.contains("Seq Scan on platformkit_limits"),
            "{what}: a sequential scan of the table:\n{plan}"
        );
        assert!(
            !plan.contains("JIT:"),
            "{what}: a JIT-compiled plan:\n{plan}"
        );
        assert!(!plan.contains("Gather"), "{what}: a parallel plan:\n{plan}");
    }
}

/// Makes every later session's commits on `db` (a durable server's) wait
/// `micros` before their flush, as a hosted database's do.
pub async fn slow_commits(db: &TestDb, micros: u32) {
    db.connect_admin()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE \"{0}\" SET commit_delay = {micros}; \
             ALTER DATABASE \"{0}\" SET commit_siblings = 0",
            db.name()
        ))
        .await
        .expect("slow commits");
}
