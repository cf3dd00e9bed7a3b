//! A login granted nothing (`limit_stranger`, any other login on a shared
//! server) can neither take a lock on the table, which made every limit fail
//! open behind the lock queue, nor call the limiter's procedures, nor name
//! the table through its search_path; and the limiter keeps counting
//! meanwhile.
//!
//! The attacks are those of the schema red-team report (section 6). The
//! stranger's sessions set `lock_timeout = '5s'`, so an attack that queues
//! for a lock ends with an error instead of hanging the test.

use std::time::Duration;

use crate::common;
use common::db::{fresh_db, refused, stranger};
use common::pinned_clock;
use platformkit_limit::{Key, Limit, Limiter, Postgres};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

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
    let limiter = Limiter::builder(Postgres::new(db.tenant_config()).with_clock(pinned_clock()))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
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
         p_window_secs => ARRAY[60::bigint], p_adds => ARRAY[1::bigint], p_at => NULL, p_budget_ms => 2000, \
         p_relaxed => false, p_sliding => ARRAY[false], p_maxes => ARRAY[5::bigint], \
         p_lockout_secs => ARRAY[0::bigint])",
        "CALL platformkit.platformkit_limit_add_all_or_none(p_keys => ARRAY['login|k'], \
         p_window_secs => ARRAY[60::bigint], p_adds => ARRAY[1::bigint], p_at => NULL, p_budget_ms => 2000, \
         p_relaxed => false, p_sliding => ARRAY[false], p_maxes => ARRAY[5::bigint], \
         p_lockout_secs => ARRAY[0::bigint])",
        "SELECT * FROM platformkit.platformkit_limit_read(p_key => 'login|k', p_window_secs => 60, \
         p_at => NULL, p_budget_ms => 2000, p_previous => false, p_max => 5, p_lockout_secs => 0)",
        "SELECT * FROM platformkit.platformkit_limit_read_many(p_keys => ARRAY['login|k'], \
         p_window_secs => ARRAY[60::bigint], p_at => NULL, p_budget_ms => 2000, \
         p_previous => false, p_maxes => ARRAY[5::bigint], p_lockout_secs => ARRAY[0::bigint])",
        "SELECT * FROM platformkit.platformkit_limit_list(p_prefix => 'login|', p_window_secs => 60, \
         p_at => NULL, p_budget_ms => 2000, p_previous => false, p_max => 5, p_lockout_secs => 0, \
         p_at_most => 10)",
        "CALL platformkit.platformkit_limit_take_back(p_key => 'login|k', \
         p_window_start => 0, p_n => 1, p_budget_ms => 2000, p_relaxed => false)",
        "CALL platformkit.platformkit_limit_reset(p_key => 'login|k', p_budget_ms => 2000, \
         p_relaxed => false)",
        "CALL platformkit.platformkit_limit_purge_from(p_batch => 10, p_budget_ms => 2000)",
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
        29,
        "eight procedures, five readers, the policy's function, the schema's version, \
         the ten bounds, the two conversions of an instant, the decision and a block's \
         mark: {executable:?}"
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
