//! What `schema.sql` promises on its own: the procedures check their
//! parameters against the very bounds the Rust side enforces, purge cannot
//! fail on any stored row, re-applying it queues behind no reader, and every
//! procedure begins with the same prologue.

use std::time::{Duration, UNIX_EPOCH};

use crate::common;
use common::db::texts;
use platformkit_limit::{
    ErrorKind, Key, Limit, Limiter, ManualClock, Postgres, PurgeTask, SCHEMA, SCHEMA_VERSION,
};
use platformkit_limit_testdb::Server;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

/// The longest stored key: the limit's name, `|`, the encoded key.
const MAX_STORED_KEY_BYTES: usize = Limit::MAX_NAME_BYTES + 1 + Key::MAX_BYTES;

/// Runs `sql` as the limiter's role; `Ok` or the SQLSTATE it failed with.
async fn run(client: &Client, sql: &str) -> Result<(), SqlState> {
    client
        .batch_execute(sql)
        .await
        .map_err(|e| e.code().cloned().unwrap_or_else(|| panic!("{sql}: {e}")))
}

/// The arguments of one direct `CALL` of `platformkit_limit_add`, as SQL
/// literals; every one valid unless a case changes it.
#[derive(Clone)]
struct Add {
    key: String,
    add: String,
    window: String,
    at: String,
    budget: String,
    max: String,
    lockout: String,
}

impl Add {
    fn valid() -> Add {
        Add {
            key: "'bounds|k'".into(),
            add: "1".into(),
            window: "60".into(),
            at: "NULL".into(),
            budget: "2000".into(),
            max: "5".into(),
            lockout: "0".into(),
        }
    }

    fn sql(&self) -> String {
        format!(
            "CALL platformkit.platformkit_limit_add(p_key => {}, p_add => {}, \
             p_window_secs => {}, p_at => {}, p_budget_ms => {}, p_relaxed => false, \
             p_previous => true, p_max => {}, p_lockout_secs => {})",
            self.key, self.add, self.window, self.at, self.budget, self.max, self.lockout
        )
    }
}

fn secs(d: Duration) -> String {
    d.as_secs().to_string()
}

/// Every bound a `Limit`, a `Key`, a budget and a pinned clock have in Rust
/// is the bound the procedure checks: the value at the bound is accepted,
/// one past it is refused with 22023, and nothing is written by a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_procedures_check_every_bound_the_rust_side_enforces() {
    let db = Server::shared().database(SCHEMA).await;
    let app = db.connect_tenant().await;
    let long_key = |n: usize| format!("'{}'", "k".repeat(n));
    type Change = fn(&mut Add, String);
    let cases: Vec<(&str, Change, String, bool)> = vec![
        ("window", |a, v| a.window = v, secs(Limit::MIN_WINDOW), true),
        (
            "window",
            |a, v| a.window = v,
            (Limit::MIN_WINDOW.as_secs() - 1).to_string(),
            false,
        ),
        ("window", |a, v| a.window = v, secs(Limit::MAX_WINDOW), true),
        (
            "window",
            |a, v| a.window = v,
            (Limit::MAX_WINDOW.as_secs() + 1).to_string(),
            false,
        ),
        ("window", |a, v| a.window = v, "NULL".into(), false),
        ("max", |a, v| a.max = v, "1".into(), true),
        ("max", |a, v| a.max = v, "0".into(), false),
        (
            "max",
            |a, v| a.max = v,
            Limit::MAX_ATTEMPTS.to_string(),
            true,
        ),
        (
            "max",
            |a, v| a.max = v,
            (u64::from(Limit::MAX_ATTEMPTS) + 1).to_string(),
            false,
        ),
        (
            "lockout",
            |a, v| a.lockout = v,
            secs(Limit::MAX_LOCKOUT),
            true,
        ),
        (
            "lockout",
            |a, v| a.lockout = v,
            (Limit::MAX_LOCKOUT.as_secs() + 1).to_string(),
            false,
        ),
        ("lockout", |a, v| a.lockout = v, "-1".into(), false),
        ("budget", |a, v| a.budget = v, "1".into(), true),
        ("budget", |a, v| a.budget = v, "0".into(), false),
        ("budget", |a, v| a.budget = v, "NULL".into(), false),
        (
            "budget",
            |a, v| a.budget = v,
            Limiter::MAX_BUDGET.as_millis().to_string(),
            true,
        ),
        (
            "budget",
            |a, v| a.budget = v,
            (Limiter::MAX_BUDGET.as_millis() + 1).to_string(),
            false,
        ),
        ("add", |a, v| a.add = v, i64::MAX.to_string(), true),
        ("add", |a, v| a.add = v, "0".into(), false),
        ("add", |a, v| a.add = v, "-3".into(), false),
        (
            "at",
            |a, v| a.at = v,
            "platformkit.platformkit_us('1900-01-01 00:00:00+00')".into(),
            true,
        ),
        (
            "at",
            |a, v| a.at = v,
            "platformkit.platformkit_us('1899-12-31 23:59:59+00')".into(),
            false,
        ),
        (
            "at",
            |a, v| a.at = v,
            "platformkit.platformkit_us('2199-12-31 23:59:59+00')".into(),
            true,
        ),
        (
            "at",
            |a, v| a.at = v,
            "platformkit.platformkit_us('2200-01-01 00:00:00+00')".into(),
            false,
        ),
        ("at", |a, v| a.at = v, i64::MAX.to_string(), false),
        ("at", |a, v| a.at = v, i64::MIN.to_string(), false),
        (
            "key",
            |a, v| a.key = v,
            long_key(MAX_STORED_KEY_BYTES),
            true,
        ),
        (
            "key",
            |a, v| a.key = v,
            long_key(MAX_STORED_KEY_BYTES + 1),
            false,
        ),
        ("key", |a, v| a.key = v, "''".into(), false),
        ("key", |a, v| a.key = v, "NULL".into(), false),
    ];
    for (what, change, value, accepted) in cases {
        let mut add = Add::valid();
        if !accepted {
            // A refused call under a key of its own: none may be stored.
            add.key = "'refused|k'".into();
        }
        change(&mut add, value.clone());
        let outcome = run(&app, &add.sql()).await;
        if accepted {
            assert_eq!(outcome, Ok(()), "{what} = {value} was refused");
        } else {
            assert_eq!(
                outcome,
                Err(SqlState::INVALID_PARAMETER_VALUE),
                "{what} = {value}"
            );
        }
    }
    // The refused calls wrote nothing.
    let stored = keys(&mut db.connect().await).await;
    assert!(!stored.is_empty());
    assert!(
        stored
            .iter()
            .all(|(key, _)| key != "refused|k" && key.len() <= MAX_STORED_KEY_BYTES),
        "a refused call was stored"
    );

    // The other procedures' own parameters.
    let refused = [
        "CALL platformkit.platformkit_limit_take_back(p_key => 'bounds|k', \
         p_window_start => 0, p_n => -1, p_budget_ms => 2000, p_relaxed => false)",
        "CALL platformkit.platformkit_limit_take_back(p_key => 'bounds|k', \
         p_window_start => 0, p_n => 0, p_budget_ms => 2000, p_relaxed => false)",
        "CALL platformkit.platformkit_limit_take_back(p_key => 'bounds|k', \
         p_window_start => 9223372036854775807, p_n => 1, p_budget_ms => 2000, p_relaxed => false)",
        "CALL platformkit.platformkit_limit_reset(p_key => '', p_budget_ms => 2000, \
         p_relaxed => false)",
        "CALL platformkit.platformkit_limit_reset(p_key => 'bounds|k', p_budget_ms => 0, \
         p_relaxed => false)",
        "SELECT * FROM platformkit.platformkit_limit_read(p_key => 'bounds|k', p_window_secs => 0, \
         p_at => NULL, p_budget_ms => 2000, p_previous => false, p_max => 5, \
         p_lockout_secs => 0)",
        &format!(
            "CALL platformkit.platformkit_limit_purge_from(p_batch => {}, p_budget_ms => 2000)",
            PurgeTask::BATCH_ROWS + 1
        ),
        "CALL platformkit.platformkit_limit_purge_from(p_batch => 0, p_budget_ms => 2000)",
        // Half a place to start from, or one that is not a number.
        "CALL platformkit.platformkit_limit_purge_from(p_batch => 10, p_budget_ms => 2000, \
         o_after => 0, o_created => NULL)",
        "CALL platformkit.platformkit_limit_purge_from(p_batch => 10, p_budget_ms => 2000, \
         o_after => 'NaN', o_created => 0)",
        "CALL platformkit.platformkit_limit_purge_from(p_batch => 10, p_budget_ms => 2000, \
         o_after => 0, o_created => 'NaN')",
        &many("add_many", Limiter::MAX_PAIRS + 1, "60"),
        &many("read_many", Limiter::MAX_PAIRS + 1, "60"),
        &many("add_many", 2, "0"),
        &many("read_many", 0, "60"),
        // An amount below one, and fewer amounts than pairs.
        &many("add_many", 2, "60").replace("ARRAY[1, 1]", "ARRAY[1, 0]"),
        &many("add_many", 2, "60").replace("ARRAY[1, 1]", "ARRAY[1]"),
        // Beside a valid key: an empty one, one a byte too long, none.
        &many("add_many", 2, "60").replacen("'bounds|many'", "''", 1),
        &many("add_many", 2, "60").replacen(
            "'bounds|many'",
            &format!("'{}'", "k".repeat(MAX_STORED_KEY_BYTES + 1)),
            1,
        ),
        &many("add_many", 2, "60").replacen("'bounds|many'", "NULL", 1),
        // All or none: the same bounds, each key once, no NULL strategy.
        &many("add_all_or_none", Limiter::MAX_PAIRS + 1, "60"),
        &many("add_all_or_none", 2, "0"),
        &many("add_all_or_none", 2, "60").replace("ARRAY[1, 1]", "ARRAY[1, 0]"),
        &many("add_all_or_none", 2, "60").replacen("'bounds|aon0'", "''", 1),
        &many("add_all_or_none", 2, "60").replacen(
            "'bounds|aon0'",
            &format!("'{}'", "k".repeat(MAX_STORED_KEY_BYTES + 1)),
            1,
        ),
        &many("add_all_or_none", 2, "60").replacen("'bounds|aon0'", "NULL", 1),
        &many("add_all_or_none", 2, "60").replacen("'bounds|aon1'", "'bounds|aon0'", 1),
        &many("add_all_or_none", 2, "60").replace("ARRAY[false, false]", "ARRAY[false, NULL]"),
        &many("add_all_or_none", 2, "60").replace("ARRAY[false, false]", "ARRAY[false]"),
    ];
    for sql in refused {
        assert_eq!(
            run(&app, sql).await,
            Err(SqlState::INVALID_PARAMETER_VALUE),
            "{sql}"
        );
    }
    // Not even the valid key beside a refused one was stored.
    assert!(
        keys(&mut db.connect().await)
            .await
            .iter()
            .all(|(key, _)| key != "bounds|many" && !key.starts_with("bounds|aon")),
        "a refused add_many or add_all_or_none stored a pair"
    );
    let accepted = [
        &format!(
            "CALL platformkit.platformkit_limit_purge_from(p_batch => {}, p_budget_ms => 2000)",
            PurgeTask::BATCH_ROWS
        ),
        &format!(
            "CALL platformkit.platformkit_limit_purge_from(p_batch => {}, p_budget_ms => 2000, \
             o_after => '-Infinity', o_created => 'Infinity')",
            PurgeTask::BATCH_ROWS
        ),
        &many("add_many", Limiter::MAX_PAIRS, "60"),
        &many("read_many", Limiter::MAX_PAIRS, "60"),
        &many("add_all_or_none", Limiter::MAX_PAIRS, "60"),
    ];
    for sql in accepted {
        assert_eq!(run(&app, sql).await, Ok(()), "{sql}");
    }
}

/// Each bound has one home in the schema, a function the routines check
/// against, and it returns the Rust constant that owns the bound; no
/// routine spells the number itself. The table's window check, which keeps
/// its own copy, accepts the longest window and refuses one a second longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bound_is_written_once_in_the_schema_and_is_the_rust_constant() {
    let db = Server::shared().database(SCHEMA).await;
    let app = db.connect_tenant().await;
    let number = |sql: &'static str| {
        let app = &app;
        async move { app.query_one(sql, &[]).await.expect(sql).get::<_, i64>(0) }
    };
    let as_i64 = |n: u128| i64::try_from(n).unwrap();
    assert_eq!(
        number("SELECT platformkit.platformkit_max_budget_ms()").await,
        as_i64(Limiter::MAX_BUDGET.as_millis())
    );
    assert_eq!(
        number("SELECT platformkit.platformkit_max_key_bytes()").await,
        as_i64(MAX_STORED_KEY_BYTES as u128)
    );
    assert_eq!(
        number("SELECT platformkit.platformkit_max_window_secs()").await,
        as_i64(Limit::MAX_WINDOW.as_secs().into())
    );
    assert_eq!(
        number("SELECT platformkit.platformkit_max_attempts()").await,
        i64::from(Limit::MAX_ATTEMPTS)
    );
    assert_eq!(
        number("SELECT platformkit.platformkit_max_lockout_secs()").await,
        as_i64(Limit::MAX_LOCKOUT.as_secs().into())
    );
    assert_eq!(
        number("SELECT platformkit.platformkit_max_block_secs()").await,
        as_i64(Limiter::MAX_BLOCK.as_secs().into())
    );
    let (by, reason) = Limiter::MAX_AUDIT_BYTES;
    assert_eq!(
        number("SELECT platformkit.platformkit_max_by_bytes()").await,
        as_i64(by as u128)
    );
    assert_eq!(
        number("SELECT platformkit.platformkit_max_reason_bytes()").await,
        as_i64(reason as u128)
    );
    // The pinned clock's years, as the Rust side refuses them
    // (a_clock_pinned_outside_1900_to_2199_is_an_invalid_option).
    assert_eq!(
        number("SELECT platformkit.platformkit_min_at()").await,
        -2_208_988_800_000_000
    );
    assert_eq!(
        number("SELECT platformkit.platformkit_end_at()").await,
        7_258_118_400_000_000
    );

    let routines = &SCHEMA[SCHEMA
        .find("-- The limiter's operations.")
        .expect("the routines")..];
    for literal in [
        "60000",
        "249",
        "31622400",
        "1000000000",
        "'1900-01-01",
        "'2200-01-01",
        "AND 86400",
        "86400 >=",
        "2592000",
        "AND 200\n",
    ] {
        assert!(
            !routines.contains(literal),
            "a routine spells the bound {literal} instead of its function"
        );
    }

    let mut owner = db.connect().await;
    for (secs, accepted) in [
        (Limit::MAX_WINDOW.as_secs(), true),
        (Limit::MAX_WINDOW.as_secs() + 1, false),
    ] {
        let tx = owner.transaction().await.unwrap();
        tx.batch_execute("SET LOCAL platformkit.system = 'on'")
            .await
            .unwrap();
        let outcome = tx
            .batch_execute(&format!(
                "INSERT INTO platformkit.platformkit_limits VALUES \
                 ('w', now(), now() + interval '{secs} seconds', 1)"
            ))
            .await;
        assert_eq!(
            outcome.map_err(|e| e.code().cloned()).err(),
            (!accepted).then_some(Some(SqlState::CHECK_VIOLATION)),
            "a window of {secs} s"
        );
    }
}

/// A direct call of `add_many` (a procedure) or `read_many` (a function)
/// over `pairs` copies of one pair with a window of `window` seconds, or
/// of `add_all_or_none` over `pairs` keys of their own
/// (`'bounds|aon0'`, …), fixed windows all.
fn many(procedure: &str, pairs: usize, window: &str) -> String {
    if procedure == "add_all_or_none" {
        let keys: Vec<String> = (0..pairs).map(|i| format!("'bounds|aon{i}'")).collect();
        let each = |value: &str| vec![value; pairs].join(", ");
        return format!(
            "CALL platformkit.platformkit_limit_add_all_or_none(\
             p_keys => ARRAY[{}]::text[], p_window_secs => ARRAY[{}]::int8[], \
             p_adds => ARRAY[{}]::int8[], p_at => NULL, p_budget_ms => 2000, \
             p_relaxed => false, p_sliding => ARRAY[{}]::boolean[], \
             p_maxes => ARRAY[{}]::int8[], p_lockout_secs => ARRAY[{}]::int8[])",
            keys.join(", "),
            each(window),
            each("1"),
            each("false"),
            each("5"),
            each("0"),
        );
    }
    let keys = vec!["'bounds|many'"; pairs].join(", ");
    let windows = vec![window; pairs].join(", ");
    let maxes = vec!["5"; pairs].join(", ");
    let lockouts = vec!["0"; pairs].join(", ");
    let adds = format!("p_adds => ARRAY[{}]::int8[], ", vec!["1"; pairs].join(", "));
    let (call, add, previous) = if procedure == "add_many" {
        let sliding = vec!["false"; pairs].join(", ");
        let sliding = format!("p_sliding => ARRAY[{sliding}]::boolean[]");
        ("CALL", format!("{adds}p_relaxed => false, "), sliding)
    } else {
        (
            "SELECT * FROM",
            String::new(),
            "p_previous => false".to_owned(),
        )
    };
    format!(
        "{call} platformkit.platformkit_limit_{procedure}(p_keys => ARRAY[{keys}]::text[], \
         p_window_secs => ARRAY[{windows}]::int8[], {add}p_at => NULL, p_budget_ms => 2000, \
         {previous}, p_maxes => ARRAY[{maxes}]::int8[], \
         p_lockout_secs => ARRAY[{lockouts}]::int8[])"
    )
}

/// `add_many` with the same pair twice, each with the largest amount,
/// saturates at the largest bigint instead of failing on the sum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_many_saturates_a_huge_amount_over_repeated_pairs() {
    let db = Server::shared().database(SCHEMA).await;
    let app = db.connect_tenant().await;
    let row = app
        .query_one(
            &format!(
                "CALL platformkit.platformkit_limit_add_many(\
                 p_keys => ARRAY['sat|k', 'sat|k'], p_window_secs => ARRAY[60, 60]::int8[], \
                 p_adds => ARRAY[{max}, {max}]::int8[], p_at => NULL, p_budget_ms => 2000, \
                 p_relaxed => false, p_sliding => ARRAY[false, false], p_maxes => ARRAY[5, 5]::int8[], \
                 p_lockout_secs => ARRAY[0, 0]::int8[])",
                max = i64::MAX
            ),
            &[],
        )
        .await
        .expect("a saturated count, not an overflow");
    let counts: Vec<i64> = row.get(0);
    assert_eq!(counts, [i64::MAX, i64::MAX]);
}

/// A pinned clock outside the years the procedures accept is refused in
/// Rust, before any statement, as the procedures would refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_pinned_outside_1900_to_2199_is_an_invalid_option() {
    let db = Server::shared().database(SCHEMA).await;
    let login = Limit::new("login", 5, Duration::from_secs(60)).unwrap();
    let first = UNIX_EPOCH - Duration::from_secs(2_208_988_800);
    let end = UNIX_EPOCH + Duration::from_secs(7_258_118_400);
    for (at, ok) in [
        (first, true),
        (first - Duration::from_secs(1), false),
        (end - Duration::from_secs(1), true),
        (end, false),
    ] {
        let limiter = Limiter::new(Postgres::new(db.config()).with_clock(ManualClock::new(at)));
        let result = limiter.failed(&login, &Key::opaque("k")).await;
        if ok {
            assert_eq!(result.expect("within the years").count(), Some(1));
        } else {
            let err = result.expect_err("outside the years");
            assert_eq!(err.kind(), ErrorKind::InvalidOption, "{err:?}");
        }
    }
}

async fn keys(client: &mut Client) -> Vec<(String, i64)> {
    let tx = client.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL platformkit.system = 'on'")
        .await
        .unwrap();
    let rows = tx
        .query(
            "SELECT key, count FROM platformkit.platformkit_limits ORDER BY key",
            &[],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// The database records the schema's version, the crate's
/// `SCHEMA_VERSION`, where the limiter's role may ask for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_records_its_version() {
    let fresh = Server::shared().database(SCHEMA).await;
    let version: i32 = fresh
        .connect_tenant()
        .await
        .query_one("SELECT platformkit.platformkit_schema_version()", &[])
        .await
        .expect("the version")
        .get(0);
    assert_eq!(u32::try_from(version).ok(), Some(SCHEMA_VERSION));
}

/// The window check refuses a window purge could not delete: not finite,
/// backwards, or longer than 366 days.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_refuses_a_window_purge_could_not_delete() {
    let fresh = Server::shared().database(SCHEMA).await;
    for db in [fresh] {
        let mut owner = db.connect().await;
        for (start, end) in [
            ("'-infinity'", "'-infinity'"),
            ("now()", "'infinity'"),
            ("now()", "now() - interval '1 second'"),
            ("now()", "now() + interval '367 days'"),
        ] {
            let tx = owner.transaction().await.unwrap();
            tx.batch_execute("SET LOCAL platformkit.system = 'on'")
                .await
                .unwrap();
            let err = tx
                .batch_execute(&format!(
                    "INSERT INTO platformkit.platformkit_limits VALUES ('k', {start}, {end}, 1)"
                ))
                .await
                .expect_err("a window purge could not delete was stored");
            assert_eq!(
                err.code(),
                Some(&SqlState::CHECK_VIOLATION),
                "{start}..{end}"
            );
        }
    }
}

/// Re-applying the schema when nothing changes takes no lock on the table:
/// behind a long reader (a pg_dump, a report) it does not queue, so it does
/// not queue every limiter call behind itself either. Whatever the session's
/// search_path: one that finds a function `clock_timestamp` of its own
/// before pg_catalog's must not make the column's default read as another,
/// and be set again on every start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reapplying_the_schema_waits_for_no_reader() {
    for session in [
        "",
        "CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE sql RETURN now();
         SET search_path = platformkit, public, pg_catalog;",
    ] {
        let db = Server::shared().database(SCHEMA).await;
        let mut reader = db.connect().await;
        let long_read = reader.transaction().await.unwrap();
        long_read
            .batch_execute("SELECT count(*) FROM platformkit.platformkit_limits")
            .await
            .unwrap();
        let migrator = db.connect().await;
        migrator
            .batch_execute(&format!("{session} SET lock_timeout = '2s'"))
            .await
            .unwrap();
        migrator.batch_execute(SCHEMA).await.unwrap_or_else(|e| {
            panic!("the re-apply waited for the reader's lock ({session}): {e}")
        });
        long_read.rollback().await.unwrap();
    }
}

/// A routine's variables have schema-qualified types. A `DECLARE` is read
/// when the routine is compiled, under the caller's `search_path`, before
/// the prologue pins it: an unqualified `timestamptz` there was a pg_temp
/// domain of the caller's, whose `CHECK` ran the caller's code inside the
/// limiter's transaction (`temporary_types_named_as_the_prologues_types_never_run_inside_the_limiters_calls`
/// runs one).
#[test]
fn every_routines_variables_have_schema_qualified_types() {
    let mut declared = 0;
    for routine in SCHEMA.split("CREATE OR REPLACE ").skip(1) {
        if !(routine.starts_with("PROCEDURE") || routine.starts_with("FUNCTION")) {
            continue;
        }
        let name = routine.split('(').next().unwrap_or_default();
        let Some((_, body)) = routine.split_once("AS $$\n") else {
            continue;
        };
        let body = body.split("\n$$;").next().unwrap_or_default();
        let Some(variables) = body.strip_prefix("DECLARE\n") else {
            continue;
        };
        let variables = variables.split("\nBEGIN").next().unwrap_or_default();
        for line in variables
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with("--"))
        {
            let ty = line.split_whitespace().nth(1).unwrap_or_default();
            assert!(ty.starts_with("pg_catalog."), "{name}: {line}");
            declared += 1;
        }
    }
    assert!(
        declared >= 10,
        "only {declared} variables read: the split no longer finds them"
    );
}

/// `schema.sql` is `schema/limits.sql` with each line
/// `-- include: schema/NAME.sql[: A, B, …][ then: REST]` made that piece:
/// each of its lines indented as the marker is, `{1}`, `{2}`, … made A, B,
/// …, and REST put at the end of its last line. The pieces are what several
/// routines share (the prologues, the readers' head and tail, which pin
/// their settings and turn the switch back, the lockout-or-block
/// expression, the upsert of pairs, the checks and tails the writers have
/// in common): nothing is kept by hand in several places. With
/// `PLATFORMKIT_WRITE_SCHEMA=1` the test writes `schema.sql` instead of
/// failing.
#[test]
fn schema_sql_is_built_from_its_source() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| {
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let include = |indent: &str, marker: &str| {
        let (marker, rest) = marker.split_once(" then: ").unwrap_or((marker, ""));
        let (path, args) = marker.split_once(": ").unwrap_or((marker, ""));
        let args: Vec<&str> = args.split(", ").filter(|arg| !arg.is_empty()).collect();
        let mut piece = read(path).trim_end().to_owned();
        for (n, arg) in (1..).zip(&args) {
            assert!(piece.contains(&format!("{{{n}}}")), "{path} has no {{{n}}}");
            piece = piece.replace(&format!("{{{n}}}"), arg);
        }
        let more = format!("{{{}}}", args.len() + 1);
        assert!(!piece.contains(&more), "{path}: no argument for {more}");
        let lines: Vec<String> = piece
            .lines()
            .map(|l| format!("{indent}{l}").trim_end().to_owned())
            .collect();
        format!("{}{rest}\n", lines.join("\n"))
    };
    let built: String = read("schema/limits.sql")
        .split_inclusive('\n')
        .map(|line| match line.trim_end().split_once("-- include: ") {
            Some((indent, marker)) if indent.trim().is_empty() => include(indent, marker),
            _ => line.to_owned(),
        })
        .collect();
    if std::env::var_os("PLATFORMKIT_WRITE_SCHEMA").is_some() {
        std::fs::write(root.join("schema.sql"), &built).expect("schema.sql written");
        return;
    }
    assert!(
        built == SCHEMA,
        "schema.sql is not schema/limits.sql with its pieces: \
         PLATFORMKIT_WRITE_SCHEMA=1 cargo test --all-features --test suite schema::"
    );
}

/// The one statement a writer runs after its COMMIT: how long the commit
/// waited, outside the pinned settings, so every name in it is qualified.
const COMMIT_WAIT: &str = "    -- How long the commit waited (merging's places follow it). Past the
    -- COMMIT the pinned settings are gone: every name here is qualified.
    o_commit_us := platformkit.platformkit_us(pg_catalog.clock_timestamp()) \
OPERATOR(pg_catalog.-) platformkit.platformkit_us(v_committing);";

/// Every procedure begins with the same prologue, word for word: the
/// guarantees it carries (never inside a caller's transaction, search_path
/// pinned, budget checked, the switch for this transaction only) hold for
/// all or none.
#[test]
fn every_procedure_begins_with_the_same_prologue() {
    let procedures: Vec<&str> = SCHEMA
        .split("CREATE OR REPLACE PROCEDURE")
        .skip(1)
        .collect();
    assert_eq!(
        procedures.len(),
        8,
        "the writers, define, operate and purge"
    );
    same_prologue(&procedures, "-- prologue\n", "-- end of prologue\n");
    for procedure in &procedures {
        let name = procedure.split('(').next().unwrap_or_default().trim();
        let body_end = procedure.find("\nEND\n$$;").expect("the body's end");
        // Or with the commit wait's measure after it, every name qualified.
        let body = procedure[..body_end].trim_end();
        let body = body.strip_suffix(COMMIT_WAIT).unwrap_or(body);
        assert!(
            body.trim_end().ends_with("COMMIT;"),
            "{name} does not end with its own COMMIT"
        );
    }

    // The readers: functions with their own prologue, the search_path
    // pinned by a SET clause, and the switch turned back at the end.
    let readers: Vec<&str> = SCHEMA
        .split("CREATE OR REPLACE FUNCTION platformkit.platformkit_limit_")
        .skip(1)
        .collect();
    assert_eq!(
        readers.len(),
        5,
        "read, read_many, list, the limits and the audit"
    );
    same_prologue(
        &readers,
        "-- reader's prologue\n",
        "-- end of reader's prologue\n",
    );
    let writer_pins = writer_pins(procedures[0]);
    for pinned in [
        ("synchronous_commit", "on"),
        ("enable_seqscan", "off"),
        ("enable_indexscan", "on"),
        ("enable_bitmapscan", "off"),
        ("enable_nestloop", "on"),
        ("max_parallel_workers_per_gather", "0"),
        ("jit", "off"),
    ] {
        assert!(
            writer_pins.contains(&(pinned.0.to_owned(), pinned.1.to_owned())),
            "the writers do not pin {pinned:?}"
        );
    }
    for reader in &readers {
        let name = reader.split('(').next().unwrap_or_default().trim();
        assert!(
            reader.contains("\nSET search_path = pg_catalog, pg_temp\n"),
            "{name} does not pin its search_path"
        );
        // The readers pin the writers' settings, but for the switch, the
        // lock_timeout (set in the body) and synchronous_commit (they write
        // nothing), to the same values.
        let mut reader_pins: Vec<(String, String)> = reader
            .lines()
            .take_while(|line| !line.starts_with("AS $$"))
            .filter_map(|line| line.strip_prefix("SET "))
            .map(|set| {
                let (setting, value) = set.split_once(" = ").expect("SET name = value");
                (setting.to_owned(), value.to_owned())
            })
            .filter(|(setting, _)| setting != "lock_timeout")
            .collect();
        reader_pins.sort();
        let mut expected: Vec<(String, String)> = writer_pins
            .iter()
            .filter(|(setting, _)| {
                !["platformkit.system", "lock_timeout", "synchronous_commit"]
                    .contains(&setting.as_str())
            })
            .cloned()
            .collect();
        expected.sort();
        assert_eq!(
            reader_pins, expected,
            "{name} pins other settings than the writers"
        );
        let body_end = reader.find("\nEND\n$$;").expect("the body's end");
        assert!(
            reader[..body_end].trim_end().ends_with(
                "v_switch := set_config('platformkit.system', COALESCE(v_switch, ''), true);"
            ),
            "{name} does not turn the switch back"
        );
    }
}

/// The checks both prologues make (the standby, the budget's range, a
/// session timeout no longer than the budget) are spelled alike in both:
/// every line of the writers' prologue that recognises a standby, reads the
/// budget or a session timeout (but for the `set_config` calls, which
/// differ for the reasons the guide gives) is a line of the readers'
/// prologue too. Once the writers and the readers compared the budget in
/// two spellings.
#[test]
fn the_readers_and_the_writers_spell_each_shared_check_alike() {
    let prologue = |routine: &str, start: &str, end: &str| -> String {
        let from = SCHEMA.find(routine).expect("the routine");
        let body = &SCHEMA[from..];
        body[body.find(start).expect("a prologue")..body.find(end).expect("its end")].to_owned()
    };
    let writer = prologue(
        "PROCEDURE platformkit.platformkit_limit_add(",
        "-- prologue\n",
        "-- end of prologue\n",
    );
    let reader = prologue(
        "FUNCTION platformkit.platformkit_limit_read(",
        "-- reader's prologue\n",
        "-- end of reader's prologue\n",
    );
    let reader_lines: Vec<&str> = reader.lines().map(str::trim).collect();
    let shared: Vec<&str> = writer
        .lines()
        .map(str::trim)
        .filter(|line| {
            [
                "p_budget_ms",
                "current_setting('statement_timeout')",
                "current_setting('transaction_timeout'",
                "standby",
            ]
            .iter()
            .any(|word| line.contains(word))
                && !line.contains("set_config(")
        })
        .collect();
    assert!(shared.len() >= 8, "the shared checks: {shared:#?}");
    for line in shared {
        assert!(
            reader_lines.contains(&line),
            "the readers spell this check otherwise: {line}"
        );
    }
}

/// Every routine's text between `start` and `end` is the same, and nothing
/// before it runs an expression (a DECLARE initialiser would, before the
/// search_path is pinned).
fn same_prologue(routines: &[&str], start: &str, end: &str) {
    let prologues: Vec<&str> = routines
        .iter()
        .map(|body| {
            let from = body.find(start).expect("a prologue");
            let to = body.find(end).expect("its end");
            &body[from..to]
        })
        .collect();
    for (routine, prologue) in routines.iter().zip(&prologues) {
        let name = routine.split('(').next().unwrap_or_default().trim();
        assert_eq!(prologue, &prologues[0], "{name}'s prologue differs");
        let before = &routine[..routine.find(start).unwrap()];
        assert!(
            !before.contains(":="),
            "{name} has a DECLARE initialiser, run before the search_path is pinned"
        );
    }
}

/// Until its search_path is pinned, a writer's prologue is parsed under
/// the caller's: a type, function or operator it spelled without its schema
/// would be whatever the caller's `pg_temp` or an earlier schema holds (a
/// temporary domain `text` once ran the caller's code inside the limiter's
/// transaction). So every cast, type and function up to the end of the
/// statement that pins it names `pg_catalog`, and no operator is used.
#[test]
fn the_prologue_names_every_builtin_with_its_schema_until_it_pins_the_search_path() {
    for procedure in SCHEMA.split("CREATE OR REPLACE PROCEDURE").skip(1) {
        let name = procedure.split('(').next().unwrap_or_default().trim();
        let from = procedure.find("-- prologue\n").expect("a prologue");
        let pin = procedure.find("set_config('search_path'").expect("the pin");
        let to = pin + procedure[pin..].find(';').expect("the pin's end");
        let before = unquoted(&procedure[from..to]);
        for (at, _) in before.match_indices("::") {
            assert!(
                before[at + 2..].starts_with("pg_catalog."),
                "{name}: a cast to a type without its schema: {}",
                &before[at..(at + 30).min(before.len())]
            );
        }
        for (at, _) in before.match_indices('(') {
            let word: String = before[..at]
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            assert!(
                word.is_empty() || word.starts_with("pg_catalog."),
                "{name}: the function {word} without its schema"
            );
        }
        let operators = before
            .replace("ERRCODE =", "")
            .replace("MESSAGE =", "")
            .replace("--", "");
        assert!(
            !operators.contains(['<', '>', '=', '+', '-', '*', '/', '~', '!', '|', '&', '%']),
            "{name}: an operator before the search_path is pinned"
        );
    }
}

/// `sql` with the text of every string literal blanked.
fn unquoted(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quoted = false;
    for c in sql.chars() {
        if c == '\'' {
            quoted = !quoted;
            out.push(c);
        } else {
            out.push(if quoted { ' ' } else { c });
        }
    }
    out
}

/// The settings a writer's prologue pins with `set_config(name, value,
/// true)`, as `(name, value)`; the lock_timeout's value is the budget.
fn writer_pins(procedure: &str) -> Vec<(String, String)> {
    let from = procedure.find("-- prologue\n").expect("a prologue");
    let to = procedure.find("-- end of prologue\n").expect("its end");
    procedure[from..to]
        .split("pg_catalog.set_config('")
        .skip(1)
        .map(|call| {
            let (setting, rest) = call.split_once("', ").expect("set_config(name, value");
            let value = rest.split(", true)").next().expect("is_local");
            (setting.to_owned(), value.trim_matches('\'').to_owned())
        })
        .collect()
}

/// `Postgres::migrate` is the start-up step: on an empty database it
/// applies the schema through the store's own connection source, and every
/// replica of a service may run it at the same moment on every start.
#[tokio::test(flavor = "multi_thread")]
async fn replicas_migrating_at_once_on_an_empty_database_all_succeed() {
    const REPLICAS: usize = 6;
    let db = Server::shared().empty_database().await;
    let starts = (0..REPLICAS).map(|_| {
        let config = db.config();
        tokio::spawn(async move { Postgres::new(config).migrate().await })
    });
    for (replica, started) in futures::future::join_all(starts)
        .await
        .into_iter()
        .enumerate()
    {
        started
            .expect("no panic")
            .unwrap_or_else(|e| panic!("replica {replica}: {e:?}"));
    }
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = Limit::new("login", 3, Duration::from_secs(60)).unwrap();
    let verdict = limiter
        .failed(&login, &Key::email("alice@example.com"))
        .await
        .unwrap();
    assert_eq!(verdict.count(), Some(1));
    // And again, over the schema it made.
    Postgres::new(db.config())
        .migrate()
        .await
        .expect("a second start");
}

/// A login granted nothing may take any advisory lock, the schema's too:
/// `migrate` then waits at most `platformkit.migrate_lock_wait` and fails
/// with `PK005`, naming the session that holds it, never hangs a
/// replica's start-up; once that session lets go, it applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_hold_on_the_schemas_lock_fails_migrate_within_its_bound_naming_the_holder() {
    let db = Server::shared().empty_database().await;
    let stranger = platformkit_limit_testdb::connect(&db.stranger_config()).await;
    let pid: i32 = stranger
        .query_one(
            "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock(31643310761011572)) AS taken",
            &[],
        )
        .await
        .expect("a stranger takes the schema's lock")
        .get(0);
    let held = common::db::hold(&db.config()).await;
    held.lock()
        .await
        .batch_execute("SET platformkit.migrate_lock_wait = '1s'")
        .await
        .expect("a short bound");
    let store = Postgres::new(common::db::lend(held.clone()));
    let started = std::time::Instant::now();
    let err = store.migrate().await.expect_err("the lock is held");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "waited {:?}",
        started.elapsed()
    );
    assert_eq!(err.code().map(SqlState::code), Some("PK005"), "{err:?}");
    let said = format!("{:?}", err);
    assert!(
        said.contains(&format!("pid {pid} (role limit_stranger)")),
        "{said}"
    );
    drop(stranger);
    store
        .migrate()
        .await
        .expect("applied once the lock is free");
}

/// A role that may not create the schema gets a typed error naming the
/// step, never a panic or a half-applied schema it then runs on.
#[tokio::test]
async fn a_role_that_may_not_create_the_schema_gets_a_query_error_from_migrate() {
    let db = Server::shared().empty_database().await;
    let err = Postgres::new(db.stranger_config())
        .migrate()
        .await
        .expect_err("a login granted nothing cannot create the schema");
    assert_eq!(err.kind(), ErrorKind::Query, "{err:?}");
    assert!(err.to_string().starts_with("migrate"), "{err}");
    let admin = db.connect_admin().await;
    let schemas = texts(
        &admin,
        "SELECT nspname::text FROM pg_namespace WHERE nspname = 'platformkit'",
    )
    .await;
    assert!(schemas.is_empty(), "{schemas:?}");
}

/// A database whose schema is newer than the crate's is left as it is: a
/// replica of the release before, starting during a rolling deploy, gets an
/// error from `migrate` naming both versions, and the newer routines stay.
/// The guard's number is the crate's version too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_over_a_newer_schema_changes_nothing_and_says_so() {
    let guarded = format!("IF found > {SCHEMA_VERSION} THEN");
    assert!(
        SCHEMA.contains(&guarded),
        "the guard compares with {SCHEMA_VERSION}"
    );
    let db = Server::shared().database(SCHEMA).await;
    let owner = db.connect().await;
    let newer = SCHEMA_VERSION + 1;
    owner
        .batch_execute(&format!(
            "CREATE OR REPLACE FUNCTION platformkit.platformkit_schema_version() RETURNS integer \
             LANGUAGE sql IMMUTABLE RETURN {newer};
             COMMENT ON PROCEDURE platformkit.platformkit_limit_reset(text, bigint, boolean, bigint) \
             IS 'the newer release''s';"
        ))
        .await
        .expect("a newer release's schema");
    let err = Postgres::new(db.config())
        .migrate()
        .await
        .expect_err("an older schema over a newer one");
    assert_eq!(err.kind(), ErrorKind::Query, "{err:?}");
    let chain = format!("{:?}", err);
    assert!(
        chain.contains(&format!("schema version {newer}")),
        "{chain}"
    );
    let kept = texts(
        &owner,
        "SELECT COALESCE(obj_description('platformkit.platformkit_limit_reset(text, bigint, boolean, bigint)'::regprocedure), 'replaced')",
    )
    .await;
    assert_eq!(kept, ["the newer release's"], "the newer routines stay");
}

/// What a database holds of the schema, one sorted line per object: the
/// table and its row-level security, columns, constraints, indexes, the
/// policy, each routine's signature, settings and a digest of its body, and
/// who may use what.
const CATALOG: &str = "
    SELECT line FROM (
        SELECT format('schema %s owner=%s acl=%s', n.nspname, n.nspowner::regrole, n.nspacl) AS line
        FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'platformkit'
        UNION ALL
        SELECT format('relation %s kind=%s rls=%s force=%s owner=%s options=%s acl=%s', c.relname,
                      c.relkind, c.relrowsecurity, c.relforcerowsecurity, c.relowner::regrole,
                      c.reloptions, c.relacl)
        FROM pg_catalog.pg_class AS c WHERE c.relnamespace = 'platformkit'::regnamespace
        UNION ALL
        SELECT format('column %s.%s %s not_null=%s default=%s collation=%s', c.relname, a.attname,
                      pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull,
                      pg_catalog.pg_get_expr(d.adbin, d.adrelid), a.attcollation::regcollation)
        FROM pg_catalog.pg_attribute AS a
        JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid
        LEFT JOIN pg_catalog.pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'platformkit'::regnamespace AND c.relkind = 'r'
          AND a.attnum > 0 AND NOT a.attisdropped
        UNION ALL
        SELECT format('constraint %s.%s %s', c.relname, k.conname, pg_catalog.pg_get_constraintdef(k.oid))
        FROM pg_catalog.pg_constraint AS k JOIN pg_catalog.pg_class AS c ON c.oid = k.conrelid
        WHERE c.relnamespace = 'platformkit'::regnamespace
        UNION ALL
        SELECT format('index %s', pg_catalog.pg_get_indexdef(i.indexrelid))
        FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS c ON c.oid = i.indrelid
        WHERE c.relnamespace = 'platformkit'::regnamespace
        UNION ALL
        SELECT format('policy %s.%s cmd=%s roles=%s using=%s check=%s', p.tablename, p.policyname,
                      p.cmd, p.roles, p.qual, p.with_check)
        FROM pg_catalog.pg_policies AS p WHERE p.schemaname = 'platformkit'
        UNION ALL
        SELECT format('routine %s kind=%s returns=%s volatile=%s security_definer=%s config=%s owner=%s acl=%s body=%s',
                      p.oid::regprocedure, p.prokind, pg_catalog.pg_get_function_result(p.oid),
                      p.provolatile, p.prosecdef, p.proconfig, p.proowner::regrole, p.proacl,
                      pg_catalog.md5(coalesce(p.prosrc, '') || coalesce(pg_catalog.pg_get_function_sqlbody(p.oid), '')))
        FROM pg_catalog.pg_proc AS p WHERE p.pronamespace = 'platformkit'::regnamespace
    ) AS catalog ORDER BY line";

/// Applying the schema again over an install with rows, as every start
/// of a new release does, gives the catalog of a fresh install: each
/// object, its settings and its grants, compared line by line. A release
/// whose schema needs more than that (a changed table) brings a numbered
/// upgrade, as the header of `schema/limits.sql` says, and makes this test
/// apply it before the schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reapplying_the_schema_over_an_install_with_rows_gives_a_fresh_installs_catalog() {
    let fresh = Server::shared().database(SCHEMA).await;
    let admin = fresh.connect_admin().await;
    let expected = texts(&admin, CATALOG).await;

    let db = Server::shared().database(SCHEMA).await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = Limit::new("login", 5, Duration::from_secs(60)).unwrap();
    limiter
        .failed(&login, &Key::email("alice@example.com"))
        .await
        .unwrap();
    db.connect().await.batch_execute(SCHEMA).await.unwrap();
    let reapplied = texts(&db.connect_admin().await, CATALOG).await;
    assert!(
        reapplied == expected,
        "applied again: {}",
        first_difference(&reapplied, &expected)
    );
    assert!(
        expected
            .iter()
            .any(|line| line.starts_with("routine platformkit.platformkit_limit_add("))
    );
}

/// The first line where `a` and `b` differ, for a failure message.
fn first_difference(a: &[String], b: &[String]) -> String {
    let (mut a, mut b) = (a.iter(), b.iter());
    loop {
        match (a.next(), b.next()) {
            (None, None) => return "the same".to_owned(),
            (x, y) if x != y => return format!("found {x:?}, a fresh install has {y:?}"),
            _ => {}
        }
    }
}
