//! The caller's session cannot change what the limiter counts: neither its
//! settings (isolation, read-only, TimeZone, DateStyle, row_security,
//! search_path, lock_timeout...) nor an object on its search_path, its own
//! (a temporary table, a temporary domain of every type name the routines
//! spell, operators in a schema ahead of pg_catalog) or a stranger's (an
//! operator in a writable `public`). Nor can the settings of the session,
//! the role or the database make the limiter slow enough to fail open
//! (planner switches and costs, JIT, a wait for a safe snapshot) or relax a
//! durable commit: each is pinned inside the routines or refused as
//! `Misconfigured`, and every plan reaches the table by an index. After
//! each call the session's settings, search_path included, are as it left
//! them.
//!
//! The attacks on name lookup are those of the schema red-team report
//! (section 3), run as the application's role, `limit_tenant`, on a clock
//! pinned at 10:30 UTC.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use crate::common;
use common::db::{
    assert_index_plans, explained, fresh_db, hold, lend, stored, stored_rows, stored_windows,
    stranger, system_switch,
};
use common::{JAN_1_1000_UTC, JAN_1_1100_UTC, PATIENT, pinned_clock, timed};
use platformkit_limit::{
    ErrorKind, Key, Limit, LimitConn, Limiter, ManualClock, Postgres, Reservation, SCHEMA, Store,
    purge,
};
use platformkit_limit_testdb::{Options, Server, TestDb};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio::time::Instant;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

// ---------------------------------------------------------------------------
// Session settings
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

// ---------------------------------------------------------------------------
// Name lookup never follows the caller's search_path
// ---------------------------------------------------------------------------

/// `SHOW search_path` on a session.
async fn search_path(client: &Client) -> String {
    client
        .query_one("SHOW search_path", &[])
        .await
        .expect("SHOW search_path")
        .get(0)
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
        stored_windows(db).await,
        [(stored(&hourly, &key), JAN_1_1000_UTC as i64, 6)],
        "{what}: the real table does not hold the count"
    );
}

/// A limiter that lends the held session, with the clock pinned at 10:30 UTC
/// and every call going to the store.
fn pinned_limiter(
    held: &Arc<Mutex<Client>>,
) -> Limiter<Postgres<impl LimitConn<Conn = OwnedMutexGuard<Client>, Error = Infallible>>> {
    Limiter::builder(Postgres::new(lend(Arc::clone(held))).with_clock(pinned_clock()))
        .no_refusal_cache()
        .build()
        .expect("valid settings")
}

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
        system_switch(&client).await.unwrap_or_default(),
        "",
        "the switch is on in the application's session"
    );
    assert_eq!(search_path(&client).await, path);
}

/// The type names a routine of the limiter could spell before its
/// search_path is pinned: each gets a temporary domain below.
const SHADOWED_TYPES: &[&str] = &[
    "text",
    "bool",
    "int8",
    "int4",
    "int2",
    "float8",
    "numeric",
    "interval",
    "timestamptz",
    "timestamp",
    "regclass",
    "regtype",
];

/// A temporary domain named `text`, with a CHECK that ran the caller's code,
/// stood in for the `text` of `p_budget_ms::text` in every writer's
/// prologue, which is parsed before the prologue pins the search_path: the
/// caller's code ran inside the limiter's transaction with the switch on,
/// and cleared every count (seven failures under a limit of 5 counted 1
/// each time). Now every name the prologue spells before the pin is
/// schema-qualified: a temporary domain of every type name it could spell,
/// each with a CHECK that records that it ran (in a sequence, which no
/// rollback undoes) and clears every count it can see, never runs in any of
/// the limiter's calls, and every call counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporary_types_named_as_the_prologues_types_never_run_inside_the_limiters_calls() {
    let db = fresh_db().await;
    let held = hold(&db.tenant_config()).await;
    let mut shadows = String::from(
        "CREATE TEMP SEQUENCE ran;
         CREATE FUNCTION pg_temp.ran() RETURNS pg_catalog.bool LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM pg_catalog.nextval('pg_temp.ran'::pg_catalog.regclass);
             DELETE FROM platformkit.platformkit_limits;
             RETURN true;
         END
         $$;",
    );
    for name in SHADOWED_TYPES {
        shadows.push_str(&format!(
            "CREATE DOMAIN pg_temp.\"{name}\" AS pg_catalog.\"{name}\" CHECK (pg_temp.ran());"
        ));
    }
    held.lock()
        .await
        .batch_execute(&shadows)
        .await
        .expect("the shadow types");
    {
        // Each unqualified name is the shadow in this session, and its
        // CHECK runs the caller's code.
        let client = held.lock().await;
        for name in SHADOWED_TYPES {
            let shadowing: bool = client
                .query_one(
                    &format!(
                        "SELECT '\"{name}\"'::pg_catalog.regtype \
                         OPERATOR(pg_catalog.=) 'pg_temp.\"{name}\"'::pg_catalog.regtype"
                    ),
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            assert!(shadowing, "{name}");
        }
    }
    let path = search_path(&*held.lock().await).await;

    every_operation_counts_for_real(&db, &held, "temporary types").await;

    let client = held.lock().await;
    let ran: bool = client
        .query_one("SELECT is_called FROM pg_temp.ran", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!ran, "the caller's code ran inside the limiter's calls");
    assert_eq!(search_path(&client).await, path);
}

/// Every operation of the limiter on the held session, each counting for
/// real: six failures and a check (add, read) as in
/// [`six_failures_count_for_real`], then add_many and read_many over two
/// pairs, a reservation given back (take_back), a reset, and a purge, which
/// deletes the pinned window (closed long ago on the database's clock).
async fn every_operation_counts_for_real(db: &TestDb, held: &Arc<Mutex<Client>>, what: &str) {
    let limiter = pinned_limiter(held);
    six_failures_count_for_real(db, &limiter, what).await;
    let hourly = Limit::new("login", 5, Duration::from_secs(60 * 60)).unwrap();
    let address = Limit::new("address", 50, Duration::from_secs(60 * 60)).unwrap();
    let victim = Key::email("victim@example.com");
    let ip = Key::email("ip@example.com");
    let pairs = [(&hourly, &victim), (&address, &ip)];
    let counts: Vec<Option<u64>> = limiter
        .hit_all(&pairs)
        .await
        .unwrap_or_else(|e| panic!("{what}: add_many: {e:?}"))
        .iter()
        .map(|v| v.count())
        .collect();
    assert_eq!(counts, [Some(7), Some(1)], "{what}: add_many");
    let counts: Vec<Option<u64>> = limiter
        .check_all(&pairs)
        .await
        .unwrap_or_else(|e| panic!("{what}: read_many: {e:?}"))
        .iter()
        .map(|v| v.count())
        .collect();
    assert_eq!(counts, [Some(7), Some(1)], "{what}: read_many");
    match limiter.reserve(&address, &ip).await.unwrap() {
        Reservation::Granted(permit) => {
            assert_eq!(permit.verdict().count(), Some(2), "{what}: reserve");
            permit.succeeded().await.unwrap();
        }
        Reservation::Refused(verdict) => panic!("{what}: refused: {verdict:?}"),
    }
    assert_eq!(
        limiter.check(&address, &ip).await.unwrap().count(),
        Some(1),
        "{what}: take_back"
    );
    limiter.reset(&address, &ip).await.unwrap();
    assert_eq!(
        stored_windows(db).await,
        [(stored(&hourly, &victim), JAN_1_1000_UTC as i64, 7)],
        "{what}: reset"
    );
    assert_eq!(
        purge(&lend(Arc::clone(held))).await.unwrap(),
        1,
        "{what}: purge"
    );
    assert_eq!(stored_windows(db).await, [], "{what}: purge");
}

/// Every operation of the limiter on the held session is refused as
/// `Misconfigured` (PK001), none gives a verdict, and nothing is stored.
async fn every_operation_is_a_misconfiguration(db: &TestDb, held: &Arc<Mutex<Client>>, what: &str) {
    let limiter = pinned_limiter(held);
    let hourly = Limit::new("login", 5, Duration::from_secs(60 * 60)).unwrap();
    let victim = Key::email("victim@example.com");
    let ip = Key::email("ip@example.com");
    let pairs = [(&hourly, &victim), (&hourly, &ip)];
    let outcomes: Vec<(&str, Result<(), platformkit_limit::Error>)> = vec![
        ("add", limiter.failed(&hourly, &victim).await.map(drop)),
        ("read", limiter.check(&hourly, &victim).await.map(drop)),
        ("add_many", limiter.hit_all(&pairs).await.map(drop)),
        ("read_many", limiter.check_all(&pairs).await.map(drop)),
        ("reserve", limiter.reserve(&hourly, &victim).await.map(drop)),
        ("reset", limiter.reset(&hourly, &victim).await.map(drop)),
        ("purge", purge(&lend(Arc::clone(held))).await.map(drop)),
    ];
    for (operation, outcome) in outcomes {
        let err = outcome.expect_err(&format!("{what}: {operation} gave a verdict"));
        assert_eq!(
            err.kind(),
            ErrorKind::Misconfigured,
            "{what}: {operation}: {err:?}"
        );
        assert_eq!(
            err.code(),
            Some(&SqlState::from_code("PK001")),
            "{what}: {operation}"
        );
        assert!(!err.is_unreachable(), "{what}: {operation}");
    }
    assert_eq!(stored_windows(db).await, [], "{what}: something was stored");
}

/// The role's own defaults, `default_transaction_isolation = serializable`,
/// `default_transaction_read_only = on` and
/// `default_transaction_deferrable = on` (a role may set its own), made
/// every call wait for a safe snapshot whenever any serializable read-write
/// transaction ran on the cluster: a wait no `lock_timeout` ends, past the
/// budget, which the library read as an outage and allowed. The wait
/// happens before the routine's body runs, so the body cannot stop it; what
/// it sees is the transaction that waited, and it refuses every call under
/// those defaults as `Misconfigured`, the same refusal as a short
/// `statement_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_read_only_deferrable_default_is_a_misconfiguration_never_an_allow() {
    let db = fresh_db().await;
    let tenant = db.connect_tenant().await;
    tenant
        .batch_execute(&format!(
            "ALTER ROLE limit_tenant IN DATABASE \"{db}\" SET default_transaction_isolation = 'serializable';
             ALTER ROLE limit_tenant IN DATABASE \"{db}\" SET default_transaction_read_only = on;
             ALTER ROLE limit_tenant IN DATABASE \"{db}\" SET default_transaction_deferrable = on;",
            db = db.name()
        ))
        .await
        .expect("the role's own defaults");
    let held = hold(&db.tenant_config()).await;
    every_operation_is_a_misconfiguration(&db, &held, "serializable read only deferrable").await;
}

/// `default_transaction_read_only = on` for the database (its owner may
/// set it) on a primary: each writer's own transaction is READ WRITE
/// whatever the default, so every call counts; were it left read-only,
/// every write would fail with the SQLSTATE of a standby (25006), which
/// the library reads as unreachable, and the refusal on a primary is
/// `Misconfigured` instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_default_on_the_primary_counts_and_is_never_read_as_a_standby() {
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET default_transaction_read_only = on",
            db.name()
        ))
        .await
        .expect("the database owner's default");
    let held = hold(&db.tenant_config()).await;
    let read_only: String = held
        .lock()
        .await
        .query_one("SHOW transaction_read_only", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(read_only, "on");
    every_operation_counts_for_real(&db, &held, "read-only default").await;
}

/// `enable_indexscan = off`, `enable_bitmapscan = off` and
/// `enable_nestloop = off` (and now `enable_tidscan = off`) set in a pooled session before the limiter's
/// first call made every statement on the table a sequential scan (16 s for
/// a merged write of 16 pairs over 2 M rows, past any budget, which the
/// library read as an outage and allowed). The routines pin the planner's
/// switches: every call counts, and every plan reaches the table by an
/// index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planner_switches_of_the_session_do_not_turn_the_limiters_plans_into_table_scans() {
    let db = fresh_db().await;
    let (held, plans) = explained(&db).await;
    held.lock()
        .await
        .batch_execute(
            "SET enable_indexscan = off;
             SET enable_bitmapscan = off;
             SET enable_indexonlyscan = off;
             SET enable_nestloop = off;
             SET enable_tidscan = off;
             SET enable_seqscan = on;",
        )
        .await
        .unwrap();
    every_operation_counts_for_real(&db, &held, "planner switches").await;
    assert_index_plans(&plans, "planner switches");
    // The purge deletes by place even so: with the table's scan pinned off,
    // no other plan can find a row by its ctid.
    let plans = plans.lock().unwrap();
    let delete = plans
        .iter()
        .find(|plan| plan.contains("platformkit_limits_purge_order"))
        .expect("the plan of the purge's DELETE");
    assert!(
        delete.contains("Tid Scan on platformkit_limits l"),
        "planner switches: the purge's DELETE:\n{delete}"
    );
}

/// Planner costs set in the session (index pages dearer than any scan of
/// the table, a sequential page free, parallel workers free and forced)
/// would make the same table scans as the switches above. The routines pin
/// the costs and allow no parallel workers: every call counts, and every
/// plan reaches the table by an index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planner_costs_of_the_session_do_not_turn_the_limiters_plans_into_table_scans() {
    let db = fresh_db().await;
    let (held, plans) = explained(&db).await;
    held.lock()
        .await
        .batch_execute(
            "SET random_page_cost = 1e300;
             SET cpu_index_tuple_cost = 1e300;
             SET cpu_operator_cost = 0;
             SET seq_page_cost = 0;
             SET cpu_tuple_cost = 0;
             SET parallel_setup_cost = 0;
             SET parallel_tuple_cost = 0;
             SET min_parallel_table_scan_size = 0;
             SET force_parallel_mode = on;",
        )
        .await
        .unwrap();
    every_operation_counts_for_real(&db, &held, "planner costs").await;
    assert_index_plans(&plans, "planner costs");
}

/// `jit_above_cost = 0` as the role's default (with the inlining and
/// optimising thresholds at 0) compiled every statement of the limiter's
/// routines, 22 to 45 ms of CPU a call. The routines turn JIT off: every
/// call counts, and no plan was compiled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jit_thresholds_of_the_role_never_compile_the_limiters_statements() {
    let db = fresh_db().await;
    db.connect_tenant()
        .await
        .batch_execute(&format!(
            "ALTER ROLE limit_tenant IN DATABASE \"{db}\" SET jit = on;
             ALTER ROLE limit_tenant IN DATABASE \"{db}\" SET jit_above_cost = 0;
             ALTER ROLE limit_tenant IN DATABASE \"{db}\" SET jit_inline_above_cost = 0;
             ALTER ROLE limit_tenant IN DATABASE \"{db}\" SET jit_optimize_above_cost = 0;",
            db = db.name()
        ))
        .await
        .expect("the role's own defaults");
    let (held, plans) = explained(&db).await;
    {
        // JIT is there to be used: a statement of the session's own is compiled.
        let client = held.lock().await;
        client
            .batch_execute("SELECT count(*) FROM pg_catalog.pg_class")
            .await
            .unwrap();
        let compiled = plans
            .lock()
            .unwrap()
            .iter()
            .any(|plan| plan.contains("JIT:"));
        assert!(compiled, "JIT is not available on this server");
        plans.lock().unwrap().clear();
    }
    every_operation_counts_for_real(&db, &held, "JIT thresholds").await;
    assert_index_plans(&plans, "JIT thresholds");
}

/// The CALL of `platformkit_limit_add` the library sends, with literals.
fn add_call(key: &str, relaxed: bool) -> String {
    format!(
        "CALL platformkit.platformkit_limit_add(p_key => '{key}', p_add => 1, \
         p_window_secs => 60, p_at => NULL, p_budget_ms => 2000, p_relaxed => {relaxed}, \
         p_previous => false, p_max => 5, p_lockout_secs => 0)"
    )
}

/// `synchronous_commit = off` as the role's default (a role may set its
/// own) silently relaxed the durable default: the procedures set the
/// setting only to relax it. Now a durable call commits with
/// `synchronous_commit = on` whatever the session says, and only a relaxed
/// one does not wait. Shown on a server of its own whose commits wait for a
/// synchronous standby that never comes: the durable call waits for it
/// (until the test cancels the wait), the relaxed one commits at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_call_commits_durably_whatever_the_roles_synchronous_commit() {
    let server = tokio::task::block_in_place(|| Server::start(Options::default()));
    let db = server.database(SCHEMA).await;
    let admin = db.connect_admin().await;
    admin
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'nowhere'")
        .await
        .unwrap();
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    db.connect_tenant()
        .await
        .batch_execute("ALTER ROLE limit_tenant SET synchronous_commit = off")
        .await
        .expect("the role's own default");
    let deadline = Instant::now() + PATIENT;
    let tenant = loop {
        let tenant = db.connect_tenant().await;
        let standby: String = tenant
            .query_one("SHOW synchronous_standby_names", &[])
            .await
            .unwrap()
            .get(0);
        if standby == "nowhere" {
            break tenant;
        }
        assert!(
            Instant::now() < deadline,
            "the server never reloaded its settings"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let session: String = tenant
        .query_one("SHOW synchronous_commit", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(session, "off");

    let durable =
        tokio::spawn(async move { tenant.batch_execute(&add_call("durable|k", false)).await });
    let deadline = Instant::now() + PATIENT;
    let pid: i32 = loop {
        let waiting = admin
            .query(
                "SELECT pid FROM pg_catalog.pg_stat_activity
                 WHERE datname = pg_catalog.current_database()
                   AND query LIKE 'CALL platformkit.%' AND wait_event = 'SyncRep'",
                &[],
            )
            .await
            .unwrap();
        if let Some(row) = waiting.first() {
            break row.get(0);
        }
        assert!(
            !durable.is_finished(),
            "the durable call committed without waiting for the synchronous standby"
        );
        assert!(
            Instant::now() < deadline,
            "the durable call never committed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The commit is local already; the cancel ends its wait for the standby.
    admin
        .execute("SELECT pg_catalog.pg_cancel_backend($1)", &[&pid])
        .await
        .unwrap();
    durable
        .await
        .unwrap()
        .expect("the durable call, once its wait is cancelled");

    let relaxed = db.connect_tenant().await;
    let (outcome, _) = timed(
        PATIENT,
        "the relaxed call",
        relaxed.batch_execute(&add_call("relaxed|k", true)),
    )
    .await;
    outcome.expect("the relaxed call");
}
