//! The red team's attacks on the schema, each run as the attacker would run
//! it, as the role it would have, on a real server: a login granted nothing
//! (`limit_stranger`), the application's own role (`limit_tenant`) with
//! objects of its own on its search_path, and the application's code calling
//! the procedures from inside its own transactions. Each test states the
//! promise the attack tried to break.
//!
//! The attacks and their SQL are those of the schema red-team report
//! (sections 2, 3 and 6). The sessions of the login with no grants set
//! `lock_timeout = '5s'`, so an attack that queues for a lock ends with an
//! error instead of hanging the test. Every limiter here runs on a clock
//! pinned at 10:30 UTC, so that no test straddles two windows.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use platformkit_limit::metric::{CALLS_TOTAL, LABEL_LIMIT, LABEL_OPERATION, LABEL_OUTCOME};
use platformkit_limit::{
    ErrorKind, Key, Limit, LimitConn, Limiter, ManualClock, Postgres, SCHEMA, Store,
};
use platformkit_limit_testdb::{Server, TestDb, connect};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio::time::{Instant, sleep};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, Row};

// ---------------------------------------------------------------------------
// Support
// ---------------------------------------------------------------------------

/// A fresh database with the schema, on the shared server.
async fn fresh_db() -> TestDb {
    Server::shared().database(SCHEMA).await
}

/// A fresh database with the schema and `public.caller_work(x int)`, a table
/// of the application's that `limit_tenant` may write.
async fn db_with_caller_work() -> TestDb {
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute("CREATE TABLE public.caller_work (x int)")
        .await
        .expect("creating caller_work as the owner");
    db
}

/// The time every test pins: 2026-01-01 10:30:00 UTC, in the middle of the
/// hour window 10:00–11:00 UTC.
const JAN_1_1030_UTC: u64 = 1_767_263_400;
const JAN_1_1000_UTC: u64 = JAN_1_1030_UTC - 30 * 60;
const JAN_1_1100_UTC: u64 = JAN_1_1030_UTC + 30 * 60;

/// The clock of every limiter here, pinned at 10:30 UTC.
fn pinned_clock() -> ManualClock {
    ManualClock::new(UNIX_EPOCH + Duration::from_secs(JAN_1_1030_UTC))
}

/// One connection held for the whole test, as a framework holds the
/// connection of a request.
async fn hold(config: &Config) -> Arc<Mutex<Client>> {
    Arc::new(Mutex::new(connect(config).await))
}

/// A connection source that lends the held connection to one call at a time,
/// so the limiter's calls run in the session the test set up.
fn lend(
    held: Arc<Mutex<Client>>,
) -> impl LimitConn<Conn = OwnedMutexGuard<Client>, Error = Infallible> {
    move || {
        let held = Arc::clone(&held);
        async move { Ok::<_, Infallible>(held.lock_owned().await) }
    }
}

/// Runs `sql` inside a transaction with the system switch on, as the limiter
/// does: the only way an ordinary role sees the table's rows.
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

/// Every row of the real table, read by its owner with the switch on:
/// `(key, window_start as Unix seconds, count)`.
async fn stored_rows(db: &TestDb) -> Vec<(String, i64, i64)> {
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

/// The key as the table stores it: the limit's name, `|`, the encoded key.
fn stored(limit: &Limit, key: &Key) -> String {
    format!("{}|{}", limit.name(), key.as_str())
}

/// The system switch as a session sees it, outside the limiter's calls.
async fn system_switch(client: &Client) -> String {
    client
        .query_one(
            "SELECT coalesce(pg_catalog.current_setting('platformkit.system', true), '')",
            &[],
        )
        .await
        .expect("reading the system switch")
        .get(0)
}

/// `SHOW search_path` on a session.
async fn search_path(client: &Client) -> String {
    client
        .query_one("SHOW search_path", &[])
        .await
        .expect("SHOW search_path")
        .get(0)
}

/// The error's SQLSTATE and message; panics on success.
fn refused<T: std::fmt::Debug>(
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

/// Asserts that `result` is the server's 42501 for schema `platformkit`.
fn assert_denied_the_schema<T: std::fmt::Debug>(
    result: Result<T, tokio_postgres::Error>,
    what: &str,
) {
    let (code, message) = refused(result, what);
    assert_eq!(
        code,
        SqlState::INSUFFICIENT_PRIVILEGE,
        "{what}: {message} ({})",
        code.code()
    );
    assert_eq!(
        message, "permission denied for schema platformkit",
        "{what}: refused, but not at the schema"
    );
}

/// Six failures under a limit of 5 in the hour window 10:00–11:00 UTC, at
/// the pinned 10:30 UTC: counts 1 to 6, the 5th and 6th refused, every
/// answer from the store, the window closing at 11:00 UTC; then `check`
/// reads 6, and the real table holds one row with 6 in that window.
async fn six_failures_count_for_real<S: Store>(db: &TestDb, limiter: &Limiter<S>, what: &str) {
    let hourly = Limit::new("login", 5, Duration::from_secs(60 * 60)).unwrap();
    let key = Key::email("victim@example.com");
    let closes = UNIX_EPOCH + Duration::from_secs(JAN_1_1100_UTC);
    for n in 1..=6 {
        let verdict = limiter
            .failed(&hourly, &key)
            .await
            .unwrap_or_else(|e| panic!("{what}: failure {n}: {e:?}"));
        assert!(
            !verdict.is_unreachable(),
            "{what}: failure {n}: {:?}",
            verdict.unreachable()
        );
        assert_eq!(verdict.count(), Some(n), "{what}: failure {n}");
        assert_eq!(
            verdict.is_refused(),
            n >= 5,
            "{what}: failure {n} of a limit of 5"
        );
        assert_eq!(
            verdict.reopens_at(),
            Some(closes),
            "{what}: failure {n}: the window is not 10:00–11:00 UTC"
        );
    }
    let check = limiter.check(&hourly, &key).await.unwrap();
    assert!(check.is_refused(), "{what}: the 7th attempt was let in");
    assert_eq!(check.count(), Some(6), "{what}");
    assert_eq!(
        stored_rows(db).await,
        [(stored(&hourly, &key), JAN_1_1000_UTC as i64, 6)],
        "{what}: the real table does not hold the count"
    );
}

/// A limiter that lends the held session, with the clock pinned at 10:30 UTC
/// and every call going to the store.
fn pinned_limiter(
    held: &Arc<Mutex<Client>>,
) -> Limiter<Postgres<impl LimitConn<Conn = OwnedMutexGuard<Client>, Error = Infallible>>> {
    Limiter::new(Postgres::new(lend(Arc::clone(held))).with_clock(pinned_clock()))
        .without_refusal_cache()
}

/// `platformkit_limit_calls_total` by `(limit, operation, outcome)`.
fn calls_by_outcome(snapshotter: &Snapshotter) -> BTreeMap<(String, String, String), u64> {
    let mut calls = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        if key.name() != CALLS_TOTAL {
            continue;
        }
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        if let DebugValue::Counter(n) = value {
            *calls
                .entry((
                    label(LABEL_LIMIT),
                    label(LABEL_OPERATION),
                    label(LABEL_OUTCOME),
                ))
                .or_default() += n;
        }
    }
    calls
}

// ---------------------------------------------------------------------------
// 1. A login with no grants
// ---------------------------------------------------------------------------

/// The commands PostgreSQL runs far enough to lock a table before it checks
/// the table's privileges (red-team 6.1–6.3). With PUBLIC's USAGE on the
/// table's schema, a login with no grants held AccessShareLock with the
/// first and queued for AccessExclusiveLock with CREATE RULE from a second
/// session, and every limiter call waited out its budget behind the queue.
const LOCK_FIRST: &[(&str, &str)] = &[
    (
        "PREPARE",
        "PREPARE p AS SELECT 1 FROM platformkit.platformkit_limits",
    ),
    (
        "CREATE TEMP VIEW",
        "CREATE TEMP VIEW v AS SELECT * FROM platformkit.platformkit_limits",
    ),
    (
        "CREATE RULE",
        "CREATE RULE r AS ON INSERT TO platformkit.platformkit_limits DO ALSO NOTHING",
    ),
    (
        "CREATE TRIGGER",
        "CREATE TRIGGER t BEFORE INSERT ON platformkit.platformkit_limits \
         FOR EACH ROW EXECUTE FUNCTION pg_temp.pass()",
    ),
    (
        "COMMENT ON TABLE",
        "COMMENT ON TABLE platformkit.platformkit_limits IS 'mine'",
    ),
    (
        "PARTITION OF",
        "CREATE TEMP TABLE part PARTITION OF platformkit.platformkit_limits FOR VALUES IN ('x')",
    ),
    (
        "REFERENCES",
        "CREATE TEMP TABLE fk (key text, window_start timestamptz, \
         FOREIGN KEY (key, window_start) REFERENCES platformkit.platformkit_limits)",
    ),
];

/// A session of `limit_stranger`, with a lock timeout so that nothing it
/// queues for hangs the test, its backend's pid, and a trigger function of
/// its own for CREATE TRIGGER.
async fn stranger(db: &TestDb) -> (Client, i32) {
    let client = connect(&db.stranger_config()).await;
    client
        .batch_execute(
            "SET lock_timeout = '5s';
             CREATE FUNCTION pg_temp.pass() RETURNS trigger LANGUAGE plpgsql
                 AS $$ BEGIN RETURN NEW; END $$;",
        )
        .await
        .expect("a stranger's session");
    let pid = client
        .query_one("SELECT pg_catalog.pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    (client, pid)
}

/// Locks the backends `pids` hold or wait for on the table (or anything
/// else in schema `platformkit`), and every lock wait in the database, as
/// the superuser sees them.
async fn locks_of(admin: &Client, pids: &[i32]) -> (Vec<String>, i64) {
    let held = admin
        .query(
            "SELECT l.pid || ' ' || l.mode || CASE WHEN l.granted THEN ' granted' ELSE ' waiting' END
             FROM pg_catalog.pg_locks AS l
             WHERE l.pid = ANY($1) AND l.locktype = 'relation'
               AND (l.relation = 'platformkit.platformkit_limits'::regclass
                    OR l.relation IN (SELECT c.oid FROM pg_catalog.pg_class AS c
                                      WHERE c.relnamespace = 'platformkit'::regnamespace))",
            &[&pids],
        )
        .await
        .expect("reading pg_locks")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let waits = admin
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_locks AS l
             JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
             WHERE a.datname = pg_catalog.current_database() AND NOT l.granted",
            &[],
        )
        .await
        .expect("reading pg_locks")
        .get(0);
    (held, waits)
}

/// Red-team F1 (6.1–6.3): a login with no grants made every limit fail open
/// by holding and queueing for the table's locks. Now it cannot name the
/// table: each lock-first command fails at the schema, at once, with nothing
/// locked, while its transactions stay open; and the limiter, meanwhile,
/// counts every failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_with_no_grants_takes_no_lock_on_the_table_and_the_limiter_keeps_counting() {
    let db = fresh_db().await;
    let admin = db.connect_admin().await;
    let limiter = Limiter::new(Postgres::new(db.tenant_config()).with_clock(pinned_clock()))
        .without_refusal_cache();
    let login = Limit::new("login", 100, Duration::from_secs(30 * 24 * 60 * 60)).unwrap();
    let alice = Key::email("alice@example.com");

    // The first session keeps a transaction open with the PREPARE that held
    // AccessShareLock; the second runs each lock-first command in a
    // transaction of its own, left open while the limiter is called.
    let (holder, holder_pid) = stranger(&db).await;
    let (queuer, queuer_pid) = stranger(&db).await;
    holder.batch_execute("BEGIN").await.unwrap();
    assert_denied_the_schema(
        holder
            .batch_execute("PREPARE p AS SELECT 1 FROM platformkit.platformkit_limits")
            .await,
        "the holder's PREPARE",
    );

    for (n, (what, sql)) in LOCK_FIRST.iter().enumerate() {
        queuer.batch_execute("BEGIN").await.unwrap();
        // Refused at the schema, so before any lock: a command that had
        // queued would have ended with 55P03 at the 5 s lock timeout.
        assert_denied_the_schema(queuer.batch_execute(sql).await, what);

        let (held, waits) = locks_of(&admin, &[holder_pid, queuer_pid]).await;
        assert_eq!(
            held,
            Vec::<String>::new(),
            "after {what}, with both transactions open, the stranger holds locks on the table"
        );
        assert_eq!(waits, 0, "after {what}, a backend waits on a lock");

        let verdict = limiter
            .failed(&login, &alice)
            .await
            .unwrap_or_else(|e| panic!("after {what}: {e:?}"));
        assert!(
            !verdict.is_unreachable(),
            "after {what}: {:?}",
            verdict.unreachable()
        );
        assert_eq!(
            verdict.count(),
            Some(n as u64 + 1),
            "after {what}: the failure was not counted"
        );
        queuer.batch_execute("ROLLBACK").await.unwrap();
    }
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        limiter.check(&login, &alice).await.unwrap().count(),
        Some(LOCK_FIRST.len() as u64)
    );
}

/// The stranger can call none of the limiter's procedures (the schema
/// refuses it first, and EXECUTE is revoked from PUBLIC underneath), and a
/// search_path naming the schema does not make the table visible to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_with_no_grants_can_neither_call_the_procedures_nor_name_the_table() {
    let db = fresh_db().await;
    let (stranger, _) = stranger(&db).await;

    let calls = [
        "CALL platformkit.platformkit_limit_add(p_key => 'login|k', p_add => 1, \
         p_window_secs => 60, p_at => NULL, p_budget_ms => 2000, p_relaxed => false, \
         p_previous => false, p_max => 5, p_lockout_secs => 0)",
        "CALL platformkit.platformkit_limit_add_many(p_keys => ARRAY['login|k'], \
         p_window_secs => ARRAY[60::bigint], p_add => 1, p_at => NULL, p_budget_ms => 2000, \
         p_relaxed => false, p_previous => false, p_maxes => ARRAY[5::bigint], \
         p_lockout_secs => ARRAY[0::bigint])",
        "CALL platformkit.platformkit_limit_read(p_key => 'login|k', p_window_secs => 60, \
         p_at => NULL, p_budget_ms => 2000, p_previous => false, p_max => 5, p_lockout_secs => 0)",
        "CALL platformkit.platformkit_limit_read_many(p_keys => ARRAY['login|k'], \
         p_window_secs => ARRAY[60::bigint], p_at => NULL, p_budget_ms => 2000, \
         p_previous => false, p_maxes => ARRAY[5::bigint], p_lockout_secs => ARRAY[0::bigint])",
        "CALL platformkit.platformkit_limit_take_back(p_key => 'login|k', \
         p_window_start => now(), p_n => 1, p_budget_ms => 2000, p_relaxed => false)",
        "CALL platformkit.platformkit_limit_reset(p_key => 'login|k', p_budget_ms => 2000, \
         p_relaxed => false)",
        "CALL platformkit.platformkit_limit_purge(p_batch => 10, p_budget_ms => 2000)",
    ];
    for call in calls {
        assert_denied_the_schema(stranger.batch_execute(call).await, call);
    }

    // Underneath the schema: no routine of the schema is executable by the
    // stranger (the procedures and the policy's function).
    let admin = db.connect_admin().await;
    let executable: Vec<(String, bool)> = admin
        .query(
            "SELECT p.oid::regprocedure::text,
                    pg_catalog.has_function_privilege('limit_stranger', p.oid, 'EXECUTE')
             FROM pg_catalog.pg_proc AS p
             WHERE p.pronamespace = 'platformkit'::regnamespace
             ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        executable.len(),
        8,
        "seven procedures and one function: {executable:?}"
    );
    assert!(
        executable.iter().all(|(_, can)| !can),
        "the stranger may execute: {executable:?}"
    );

    stranger
        .batch_execute("SET search_path = platformkit")
        .await
        .unwrap();
    let (code, message) = refused(
        stranger
            .query("SELECT count(*) FROM platformkit_limits", &[])
            .await,
        "an unqualified name with platformkit on the search_path",
    );
    assert_eq!(code, SqlState::UNDEFINED_TABLE, "{message}");
}

// ---------------------------------------------------------------------------
// 2. Name lookup never follows the caller's search_path
// ---------------------------------------------------------------------------

/// Red-team 3.1: a temporary table of the application's role in its own
/// (pooled) session, with a trigger that zeroes every count, took the
/// limiter's writes: every call counted 0. Now the procedures write the real
/// table whatever the session's search_path says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temporary_table_of_the_callers_does_not_stand_in_for_the_limiters_table() {
    let db = fresh_db().await;
    let held = hold(&db.tenant_config()).await;
    let path = "pg_temp, platformkit, public";
    held.lock()
        .await
        .batch_execute(&format!(
            "CREATE TEMP TABLE platformkit_limits
                 (LIKE platformkit.platformkit_limits INCLUDING ALL);
             CREATE FUNCTION pg_temp.zero() RETURNS trigger LANGUAGE plpgsql
                 AS $$ BEGIN NEW.count := 0; RETURN NEW; END $$;
             CREATE TRIGGER zero BEFORE INSERT OR UPDATE ON pg_temp.platformkit_limits
                 FOR EACH ROW EXECUTE FUNCTION pg_temp.zero();
             SET search_path = {path};"
        ))
        .await
        .expect("the shadow table");
    {
        // The session's unqualified name is the shadow.
        let shadowing: bool = held
            .lock()
            .await
            .query_one(
                "SELECT 'platformkit_limits'::regclass = 'pg_temp.platformkit_limits'::regclass",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(shadowing);
    }

    six_failures_count_for_real(&db, &pinned_limiter(&held), "temporary table").await;

    let client = held.lock().await;
    let shadowed: i64 = client
        .query_one("SELECT count(*) FROM pg_temp.platformkit_limits", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(shadowed, 0, "the limiter wrote the shadow table");
    assert_eq!(search_path(&client).await, path);
}

/// Red-team 3.2: a temporary domain named `timestamptz` over `timestamp`
/// made the session's TimeZone decide the window (10:30–11:30 UTC in
/// Kathmandu instead of 10:00–11:00).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temporary_timestamptz_type_and_the_session_time_zone_do_not_move_the_window() {
    let db = fresh_db().await;
    let held = hold(&db.tenant_config()).await;
    let path = {
        let client = held.lock().await;
        client
            .batch_execute(
                "CREATE DOMAIN pg_temp.timestamptz AS pg_catalog.timestamp;
                 SET TimeZone = 'Asia/Kathmandu';",
            )
            .await
            .expect("the shadow type");
        // The session's unqualified timestamptz is the shadow.
        let shadowing: bool = client
            .query_one(
                "SELECT 'timestamptz'::regtype <> 'pg_catalog.timestamptz'::regtype",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(shadowing);
        search_path(&client).await
    };

    six_failures_count_for_real(&db, &pinned_limiter(&held), "temporary timestamptz").await;

    let client = held.lock().await;
    assert_eq!(search_path(&client).await, path);
    let zone: String = client
        .query_one("SELECT current_setting('TimeZone')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(zone, "Asia/Kathmandu");
}

/// Red-team 3.3: operators `*(bigint, interval)` and `*(float8, interval)`
/// that return a microsecond, in a schema of the application's role ahead
/// of pg_catalog on its search_path, made every window a microsecond long:
/// a limit of 5 allowed every attempt, silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_in_a_schema_ahead_of_pg_catalog_do_not_shrink_the_window() {
    let db = fresh_db().await;
    db.connect_admin()
        .await
        .batch_execute("CREATE SCHEMA AUTHORIZATION limit_tenant")
        .await
        .expect("a schema owned by limit_tenant");
    let held = hold(&db.tenant_config()).await;
    let path = "limit_tenant, pg_catalog, public";
    held.lock()
        .await
        .batch_execute(&format!(
            "CREATE FUNCTION limit_tenant.tiny(bigint, interval) RETURNS interval
                 LANGUAGE sql AS $$ SELECT interval '1 microsecond' $$;
             CREATE FUNCTION limit_tenant.tiny(float8, interval) RETURNS interval
                 LANGUAGE sql AS $$ SELECT interval '1 microsecond' $$;
             CREATE OPERATOR limit_tenant.* (
                 LEFTARG = bigint, RIGHTARG = interval, FUNCTION = limit_tenant.tiny);
             CREATE OPERATOR limit_tenant.* (
                 LEFTARG = float8, RIGHTARG = interval, FUNCTION = limit_tenant.tiny);
             SET search_path = {path};"
        ))
        .await
        .expect("the shadow operators");
    {
        // The operators are live in this session.
        let client = held.lock().await;
        let tiny: String = client
            .query_one(
                "SELECT (60::bigint * interval '1 second')::text
                     || ' ' || (60::float8 * interval '1 second')::text",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(tiny, "00:00:00.000001 00:00:00.000001");
    }

    six_failures_count_for_real(&db, &pinned_limiter(&held), "shadow operators").await;

    assert_eq!(search_path(&*held.lock().await).await, path);
}

/// Red-team 3.6: where `public` is writable by PUBLIC (PostgreSQL 14's
/// default, kept by upgraded databases), a login with no grants planted
/// `public.*(bigint, interval)`; the limiter's ordinary calls ran it as the
/// application's role with the switch on, copying every limit row into the
/// stranger's table and leaving the switch on for the session. Now the
/// stranger's code never runs inside the limiter's calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_operator_in_a_writable_public_schema_never_runs_inside_the_limiters_calls() {
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        .await
        .expect("PostgreSQL 14's public schema");
    let (stranger, _) = stranger(&db).await;
    stranger
        .batch_execute(
            "CREATE TABLE public.loot (who text, what text);
             GRANT SELECT, INSERT ON public.loot TO PUBLIC;
             CREATE FUNCTION public.steal(bigint, interval) RETURNS interval
             LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO public.loot VALUES (current_user, 'ran');
                 INSERT INTO public.loot
                     SELECT current_user, l.key || '=' || l.count
                     FROM platformkit.platformkit_limits AS l;
                 PERFORM pg_catalog.set_config('platformkit.system', 'on', false);
                 RETURN $2 OPERATOR(pg_catalog.*) $1::float8;
             END
             $$;
             CREATE OPERATOR public.* (
                 LEFTARG = bigint, RIGHTARG = interval, FUNCTION = public.steal);",
        )
        .await
        .expect("the stranger plants its operator");

    let held = hold(&db.tenant_config()).await;
    let path = "public, pg_catalog";
    held.lock()
        .await
        .batch_execute(&format!("SET search_path = {path}"))
        .await
        .unwrap();
    {
        // What the application's `bigint * interval` finds is the stranger's.
        let planted: bool = held
            .lock()
            .await
            .query_one(
                "SELECT '*(bigint, interval)'::regoperator
                      = 'public.*(bigint, interval)'::regoperator",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(planted);
    }

    six_failures_count_for_real(&db, &pinned_limiter(&held), "the stranger's operator").await;

    let loot: Vec<(String, String)> = stranger
        .query("SELECT who, what FROM public.loot", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(loot, [], "the stranger's code ran inside the limiter");
    let client = held.lock().await;
    assert_eq!(
        system_switch(&client).await,
        "",
        "the switch is on in the application's session"
    );
    assert_eq!(search_path(&client).await, path);
}

// ---------------------------------------------------------------------------
// 3. Nothing of the limiter's transaction runs on into the caller's code
// ---------------------------------------------------------------------------

/// The rows of `caller_work`, read by the tenant.
async fn caller_work(db: &TestDb) -> Vec<i32> {
    db.connect_tenant()
        .await
        .query("SELECT x FROM public.caller_work ORDER BY x", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Red-team 2.9 and 2.10: called from a DO block or a procedure of the
/// caller's that had written, the limiter's leading COMMIT committed the
/// caller's work, and the caller's later failure could not take it back.
/// Now the CALL is refused (2D000) and the caller's work goes with its
/// failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_code_that_wrote_before_the_call_is_refused_and_its_work_is_not_committed() {
    let db = db_with_caller_work().await;
    let tenant = db.connect_tenant().await;

    let (code, message) = refused(
        tenant
            .batch_execute(
                "DO $$
                 DECLARE d bigint;
                 BEGIN
                     INSERT INTO public.caller_work VALUES (1);
                     CALL platformkit.platformkit_limit_reset(
                         p_key => 'k', p_budget_ms => 2000, p_relaxed => false, o_deleted => d);
                     RAISE EXCEPTION 'the caller fails after the call';
                 END
                 $$",
            )
            .await,
        "a DO block that wrote, then called",
    );
    assert_eq!(code, SqlState::INVALID_TRANSACTION_TERMINATION, "{message}");
    assert_eq!(
        caller_work(&db).await,
        Vec::<i32>::new(),
        "the DO block's write was committed"
    );

    tenant
        .batch_execute(
            "CREATE PROCEDURE pg_temp.caller() LANGUAGE plpgsql AS $$
             DECLARE d bigint;
             BEGIN
                 INSERT INTO public.caller_work VALUES (2);
                 CALL platformkit.platformkit_limit_reset(
                     p_key => 'k', p_budget_ms => 2000, p_relaxed => false, o_deleted => d);
                 RAISE EXCEPTION 'the caller fails after the call';
             END
             $$",
        )
        .await
        .unwrap();
    let (code, message) = refused(
        tenant.batch_execute("CALL pg_temp.caller()").await,
        "a procedure that wrote, then called",
    );
    assert_eq!(code, SqlState::INVALID_TRANSACTION_TERMINATION, "{message}");
    assert_eq!(
        caller_work(&db).await,
        Vec::<i32>::new(),
        "the procedure's write was committed"
    );
}

/// What the caller's code after the CALL records of its own transaction:
/// the transaction and table locks it holds (read in a statement of its
/// own, before a statement that names the table takes one), the switch, and
/// the rows it can see.
const OBSERVE: &str = "
    SELECT count(*) INTO locks FROM pg_catalog.pg_locks AS l
    WHERE l.pid = pg_catalog.pg_backend_pid()
      AND (l.locktype = 'transactionid'
           OR (l.locktype = 'relation'
               AND l.relation = 'platformkit.platformkit_limits'::regclass));
    INSERT INTO pg_temp.observed
    SELECT locks, coalesce(pg_catalog.current_setting('platformkit.system', true), ''),
           (SELECT count(*) FROM platformkit.platformkit_limits);";

/// The limiter's add, as caller code writes it in PL/pgSQL (at 10:30 UTC).
const ADD_IN_PLPGSQL: &str = "
    CALL platformkit.platformkit_limit_add(
        p_key => 'login|k', p_add => 1, p_window_secs => 3600,
        p_at => '2026-01-01 10:30:00+00',
        p_budget_ms => 2000, p_relaxed => false, p_previous => false, p_max => 5,
        p_lockout_secs => 0, o_count => c, o_window_end => we, o_now => nw,
        o_previous => pv, o_locked_until => lu);";

/// Red-team 2.9, 2.10 and 6.4: after a CALL from a DO block or a procedure
/// of the caller's, the caller's code ran on inside the limiter's system
/// transaction: the switch on, every row visible and writable, the row lock
/// held until the caller's block ended. Now the caller's code after the
/// CALL sees the switch off, no rows, and holds no lock of the limiter's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_code_after_the_call_sees_no_switch_no_rows_and_holds_no_lock_of_the_limiters() {
    let db = db_with_caller_work().await;
    let tenant = db.connect_tenant().await;
    // Rows to see, had the switch stayed on.
    let limiter = Limiter::new(Postgres::new(db.tenant_config()).with_clock(pinned_clock()));
    let login = Limit::new("login", 5, Duration::from_secs(3600)).unwrap();
    limiter
        .failed(&login, &Key::email("alice@example.com"))
        .await
        .unwrap();
    tenant
        .batch_execute(&format!(
            "CREATE TEMP TABLE observed (locks bigint, switch text, rows bigint);
             CREATE PROCEDURE pg_temp.caller() LANGUAGE plpgsql AS $$
             DECLARE c bigint; we timestamptz; nw timestamptz; pv bigint; lu timestamptz; locks bigint;
             BEGIN
                 {ADD_IN_PLPGSQL}
                 {OBSERVE}
             END
             $$;"
        ))
        .await
        .unwrap();

    tenant
        .batch_execute(&format!(
            "DO $$
             DECLARE c bigint; we timestamptz; nw timestamptz; pv bigint; lu timestamptz; locks bigint;
             BEGIN
                 {ADD_IN_PLPGSQL}
                 {OBSERVE}
             END
             $$"
        ))
        .await
        .expect("a DO block that calls, then reads");
    tenant
        .batch_execute("CALL pg_temp.caller()")
        .await
        .expect("a procedure that calls, then reads");

    let observed: Vec<(i64, String, i64)> = tenant
        .query("SELECT locks, switch, rows FROM pg_temp.observed", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    assert_eq!(
        observed,
        [(0, String::new(), 0), (0, String::new(), 0)],
        "(locks held, switch, rows visible) after the CALL in a DO block, then in a procedure"
    );
    assert_eq!(system_switch(&tenant).await, "");
    // Both calls counted.
    let stored = stored_rows(&db).await;
    assert!(
        stored
            .iter()
            .any(|(key, _, count)| key == "login|k" && *count == 2),
        "{stored:?}"
    );
}

/// A minimal client of PostgreSQL's wire protocol, for pipelines:
/// tokio-postgres sends a Sync after every statement, and what these tests
/// need is several statements before one Sync. Trust authentication only
/// (the harness's throwaway servers).
mod wire {
    use bytes::BytesMut;
    use fallible_iterator::FallibleIterator;
    use postgres_protocol::IsNull;
    use postgres_protocol::message::backend::{ErrorResponseBody, Message};
    use postgres_protocol::message::frontend;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio_postgres::Config;
    use tokio_postgres::config::Host;

    /// What one statement of a pipeline answered.
    #[derive(Debug, PartialEq, Eq)]
    pub enum Answer {
        /// It ran: its rows, in text format.
        Rows(Vec<Vec<Option<String>>>),
        /// It failed: the SQLSTATE and the message.
        Error(String, String),
        /// An earlier statement failed, so the server skipped it.
        Skipped,
    }

    pub struct Wire {
        stream: TcpStream,
        read: BytesMut,
    }

    impl Wire {
        /// StartupMessage, then everything up to ReadyForQuery.
        pub async fn connect(config: &Config) -> Wire {
            let host = match config.get_hosts().first() {
                Some(Host::Tcp(host)) => host.clone(),
                other => panic!("the wire-protocol client needs a TCP host, not {other:?}"),
            };
            let port = config.get_ports().first().copied().unwrap_or(5432);
            let stream = TcpStream::connect((host.as_str(), port))
                .await
                .unwrap_or_else(|e| panic!("connecting to {host}:{port}: {e}"));
            let mut wire = Wire {
                stream,
                read: BytesMut::new(),
            };
            let mut out = BytesMut::new();
            frontend::startup_message(
                [
                    ("user", config.get_user().expect("a user")),
                    ("database", config.get_dbname().expect("a database")),
                    ("client_encoding", "UTF8"),
                ],
                &mut out,
            )
            .unwrap();
            wire.send(&out).await;
            loop {
                match wire.next().await {
                    Message::AuthenticationOk
                    | Message::ParameterStatus(_)
                    | Message::BackendKeyData(_)
                    | Message::NoticeResponse(_) => {}
                    Message::ReadyForQuery(_) => return wire,
                    Message::ErrorResponse(body) => {
                        panic!("the server refused the connection: {:?}", error(&body))
                    }
                    _ => panic!(
                        "the server asked for more than trust authentication, which is all \
                         this test's wire-protocol client speaks"
                    ),
                }
            }
        }

        async fn send(&mut self, bytes: &[u8]) {
            self.stream.write_all(bytes).await.expect("writing");
        }

        async fn next(&mut self) -> Message {
            loop {
                if let Some(message) = Message::parse(&mut self.read).expect("a backend message") {
                    return message;
                }
                let n = self.stream.read_buf(&mut self.read).await.expect("reading");
                assert!(n > 0, "the server closed the connection");
            }
        }

        /// Parse, Bind and Execute of each statement (no parameters, text
        /// results), then one Sync: one implicit transaction. Returns each
        /// statement's answer and the transaction status of the
        /// ReadyForQuery that ends it (`b'I'`: idle).
        pub async fn pipeline(&mut self, statements: &[&str]) -> (Vec<Answer>, u8) {
            let mut out = BytesMut::new();
            for sql in statements {
                frontend::parse("", sql, std::iter::empty(), &mut out).unwrap();
                if frontend::bind(
                    "",
                    "",
                    std::iter::empty(),
                    std::iter::empty::<()>(),
                    |(), _| Ok(IsNull::Yes),
                    std::iter::empty(),
                    &mut out,
                )
                .is_err()
                {
                    panic!("encoding Bind");
                }
                frontend::execute("", 0, &mut out).unwrap();
            }
            frontend::sync(&mut out);
            self.send(&out).await;

            let mut answers = Vec::new();
            let mut rows = Vec::new();
            let status = loop {
                match self.next().await {
                    Message::ParseComplete
                    | Message::BindComplete
                    | Message::NoticeResponse(_)
                    | Message::ParameterStatus(_) => {}
                    Message::DataRow(row) => {
                        let values = row
                            .ranges()
                            .map(|range| {
                                Ok(range.map(|r| {
                                    String::from_utf8_lossy(&row.buffer()[r]).into_owned()
                                }))
                            })
                            .collect()
                            .expect("a data row");
                        rows.push(values);
                    }
                    Message::CommandComplete(_) => {
                        answers.push(Answer::Rows(std::mem::take(&mut rows)));
                    }
                    Message::ErrorResponse(body) => {
                        let (code, message) = error(&body);
                        answers.push(Answer::Error(code, message));
                    }
                    Message::ReadyForQuery(ready) => break ready.status(),
                    _ => panic!("an unexpected message in a pipeline's answer"),
                }
            };
            while answers.len() < statements.len() {
                answers.push(Answer::Skipped);
            }
            (answers, status)
        }
    }

    /// The SQLSTATE and message of an ErrorResponse.
    fn error(body: &ErrorResponseBody) -> (String, String) {
        let (mut code, mut message) = (String::new(), String::new());
        let mut fields = body.fields();
        while let Some(field) = fields.next().expect("error fields") {
            let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
            match field.type_() {
                b'C' => code = value,
                b'M' => message = value,
                _ => {}
            }
        }
        (code, message)
    }
}

use wire::{Answer, Wire};

/// Red-team 2.11: in an extended-protocol pipeline, a write before the CALL
/// and before the Sync was committed by the limiter's COMMIT, though the
/// pipeline failed. Now the CALL is refused and the write is not committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_write_before_the_call_is_refused_and_not_committed() {
    let db = db_with_caller_work().await;
    let mut wire = Wire::connect(&db.tenant_config()).await;

    let (answers, status) = wire
        .pipeline(&[
            "INSERT INTO public.caller_work VALUES (7)",
            "CALL platformkit.platformkit_limit_reset(\
             p_key => 'k', p_budget_ms => 2000, p_relaxed => false)",
            "SELECT 1/0",
        ])
        .await;
    assert_eq!(answers[0], Answer::Rows(vec![]), "the INSERT ran");
    match &answers[1] {
        Answer::Error(code, _) => assert_eq!(code, "2D000", "{answers:?}"),
        other => panic!("the CALL inside the pipeline's transaction was not refused: {other:?}"),
    }
    assert_eq!(answers[2], Answer::Skipped);
    assert_eq!(status, b'I', "the pipeline left a transaction open");
    assert_eq!(
        caller_work(&db).await,
        Vec::<i32>::new(),
        "row 7 was committed"
    );
}

/// Red-team 2.11: in a pipeline, the statements after the CALL and before
/// the Sync ran inside the limiter's system transaction, switch on, and read
/// every row. Now they see the switch off and no rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_statement_after_the_call_sees_no_switch_and_no_rows() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.tenant_config()).with_clock(pinned_clock()));
    let login = Limit::new("login", 5, Duration::from_secs(3600)).unwrap();
    limiter
        .failed(&login, &Key::email("alice@example.com"))
        .await
        .unwrap();
    let mut wire = Wire::connect(&db.tenant_config()).await;

    let (answers, status) = wire
        .pipeline(&[
            "CALL platformkit.platformkit_limit_read(p_key => 'login|email|alice@example.com', \
             p_window_secs => 3600, p_at => '2026-01-01 10:30:00+00', p_budget_ms => 2000, \
             p_previous => false, p_max => 5, p_lockout_secs => 0)",
            "SELECT coalesce(pg_catalog.current_setting('platformkit.system', true), ''), \
             (SELECT count(*) FROM platformkit.platformkit_limits)",
        ])
        .await;
    match &answers[0] {
        Answer::Rows(rows) => assert_eq!(rows[0][0].as_deref(), Some("1"), "{answers:?}"),
        other => panic!("the CALL failed: {other:?}"),
    }
    assert_eq!(
        answers[1],
        Answer::Rows(vec![vec![Some(String::new()), Some("0".to_owned())]]),
        "(switch, rows visible) after the CALL, before the Sync"
    );
    assert_eq!(status, b'I');
}

// ---------------------------------------------------------------------------
// 4. A cancel the limiter did not send
// ---------------------------------------------------------------------------

/// Red-team 6.9 and F5: another session of the application's role cancelled
/// a limiter call waiting on a lock; the 57014 it got read as the budget
/// running out, so the store counted as unreachable and the attempt went
/// through uncounted. Now a cancel this call did not send is an error.
#[tokio::test]
async fn a_cancel_the_limiter_did_not_send_is_an_error_never_an_allow() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let db = fresh_db().await;
    // A long budget: the limiter's own lock timeout and cancel come long
    // after the stranger's cancel.
    let limiter = Limiter::new(Postgres::new(db.tenant_config()).with_clock(pinned_clock()))
        .with_budget(Duration::from_secs(10))
        .unwrap()
        .without_refusal_cache();
    let login = Limit::new("login", 5, Duration::from_secs(3600)).unwrap();
    let alice = Key::email("alice@example.com");
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );

    // Another session holds the row, with the switch on.
    let mut locker = db.connect_tenant().await;
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

    // A third session of the same role cancels the limiter's waiting call.
    let admin = db.connect_admin().await;
    let canceller = db.connect_tenant().await;
    let cancel = async {
        let deadline = Instant::now() + Duration::from_secs(8);
        let pid: i32 = loop {
            let waiting = admin
                .query(
                    "SELECT pid FROM pg_catalog.pg_stat_activity
                     WHERE datname = pg_catalog.current_database()
                       AND query LIKE 'CALL platformkit.%' AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap();
            if let Some(row) = waiting.first() {
                break row.get(0);
            }
            assert!(
                Instant::now() < deadline,
                "the limiter's call never waited on the row lock"
            );
            sleep(Duration::from_millis(20)).await;
        };
        let cancelled: bool = canceller
            .query_one("SELECT pg_catalog.pg_cancel_backend($1)", &[&pid])
            .await
            .unwrap()
            .get(0);
        assert!(cancelled, "pg_cancel_backend refused");
    };
    let (result, ()) = tokio::join!(limiter.failed(&login, &alice), cancel);

    let err = result.expect_err("a cancelled call gave a verdict");
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err:?}");
    assert_eq!(err.code(), Some(&SqlState::QUERY_CANCELED));
    assert!(!err.is_unreachable(), "{err:?}");
    lock.rollback().await.unwrap();

    let next = limiter.failed(&login, &alice).await.unwrap();
    assert_eq!(
        next.count(),
        Some(2),
        "the cancelled failure was counted, or the next was not"
    );

    let calls = calls_by_outcome(&snapshotter);
    let failed = |outcome: &str| {
        calls
            .get(&("login".to_owned(), "failed".to_owned(), outcome.to_owned()))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(failed("unreachable"), 0, "{calls:?}");
    assert_eq!(failed("error"), 1, "{calls:?}");
    assert_eq!(failed("allowed"), 2, "{calls:?}");
}
