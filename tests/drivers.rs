//! The behaviour tests, each written once and run on each driver the limiter
//! speaks: tokio-postgres connections (each statement one unnamed message,
//! or, through `Prepared`, prepared once per connection in deadpool's
//! statement cache) and sqlx connections (`SqlxConn`, `sqlx::PgPool`).
//!
//! Each body is a function generic over [`Driver`]; the macro at the end
//! runs it as `on_tokio_postgres::NAME`, `on_tokio_postgres_prepared::NAME`
//! and `on_sqlx::NAME`. What a driver
//! cannot do is one constant, [`Driver::CANCELS`]: sqlx keeps the cancel key
//! private, so a slow call is not stopped on the server, and the body says
//! what happens instead.
//!
//! The bodies, by concern, under `tests/drivers/`: `operations.rs` (every
//! operation, a pool as a source), `costs.rs` (asks of a cost of their
//! own), `faults.rs` (unreachable within the
//! budget), `budget.rs` (the budget on the server), `callers_transaction.rs`,
//! `keys.rs` (hostile keys) and `pgbouncer.rs`; the drivers themselves in
//! `driver.rs`.
//!
//! The tests inspect connections with the simple query protocol (and the
//! superuser's `pg_stat_activity`), which works on either driver and through
//! PgBouncer in transaction mode.

#[path = "drivers/budget.rs"]
mod budget;
#[path = "drivers/callers_transaction.rs"]
mod callers_transaction;
#[path = "drivers/costs.rs"]
mod costs;
#[path = "drivers/driver.rs"]
pub(crate) mod driver;
#[path = "drivers/faults.rs"]
mod faults;
#[path = "drivers/keys.rs"]
mod keys;
#[path = "drivers/operations.rs"]
mod operations;
#[path = "drivers/pgbouncer.rs"]
mod pgbouncer;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::db::{counts_by_key, fresh_db};
use common::limit;
use driver::{Driver, Held, Lend, hold, lend};
use platformkit_limit::driver::SqlxConn;
use platformkit_limit::{ErrorKind, Key, Limit, LimitConn, Limiter, Postgres, Verdict};
use platformkit_limit_testdb::TestDb;
use sqlx::Row as _;
use tokio::sync::Mutex;
use tokio::time::{Instant, sleep};
use tokio_postgres::Client;

// ---------------------------------------------------------------------------
// What the bodies share
// ---------------------------------------------------------------------------

/// Every key's total count, read as the superuser (who bypasses row-level
/// security).
async fn counts(db: &TestDb) -> BTreeMap<String, i64> {
    counts_by_key(&db.connect_admin().await).await
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
pub(crate) async fn wait_for_state(
    admin: &Client,
    pid: i32,
    state: Option<&str>,
    within: Duration,
) {
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

/// A fresh database and a connection held in it, lent to a limiter with
/// `budget`, which has counted one failure of alice's under `login` (a
/// limit of 5).
struct CountedOnce<D: Driver>
where
    Lend<D::Conn>: LimitConn,
{
    db: TestDb,
    admin: Client,
    held: Held<D>,
    limiter: Limiter<Postgres<Lend<D::Conn>>>,
    login: Limit,
    alice: Key,
}

async fn counted_once<D: Driver>(budget: Duration) -> CountedOnce<D>
where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    let admin = db.connect_admin().await;
    let held = hold::<D>(&db.config()).await;
    // A lent connection cannot open one of its own: the store probes
    // through the driver's own source.
    let store = Postgres::new(lend::<D>(&held)).with_probe(D::source(&db.config()));
    let limiter = Limiter::builder(store).budget(budget).build().unwrap();
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    assert_counted(&limiter.failed(&login, &alice).await.unwrap(), 1, "before");
    CountedOnce {
        db,
        admin,
        held,
        limiter,
        login,
        alice,
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
// sqlx only: a connection the request already holds
// ---------------------------------------------------------------------------

/// A `PoolConnection` a request already holds is lent to a limiter built
/// for that request, and comes back idle, usable by the request, after one
/// pair and after two in one statement; the counts are the pool's limiter's
/// too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sqlx_connection_the_request_holds_is_lent_and_taken_back() {
    let db = fresh_db().await;
    let pool = driver::Sqlx::pool(&db.config(), 2).await;
    let shared = Limiter::new(Postgres::new(pool.clone()));
    let login = limit("login", 5);
    let per_address = limit("login-address", 5);
    let alice = Key::email("alice@example.com");

    // The request's pooled connection, lent and taken back, twice.
    let mut pooled = pool.acquire().await.unwrap();
    for count in 1..=2 {
        let held = Arc::new(Mutex::new(pooled));
        let lent = Arc::clone(&held);
        let limiter = Limiter::new(Postgres::new(move || {
            let lent = Arc::clone(&lent);
            async move { Ok::<_, Infallible>(SqlxConn(lent.lock_owned().await)) }
        }));
        let verdict = if count == 1 {
            limiter.failed(&login, &alice).await.unwrap()
        } else {
            let both = [(&login, &alice), (&per_address, &alice)];
            limiter
                .failed_all(&both)
                .await
                .unwrap()
                .into_vec()
                .remove(0)
        };
        assert_counted(&verdict, count, "lent");
        drop(limiter);
        pooled = Arc::try_unwrap(held)
            .expect("the limiter and its tasks let go of the connection")
            .into_inner();
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
    ($($module:ident::$name:ident),* $(,)?) => {
        mod on_tokio_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$module::$name::<super::driver::TokioPostgres>().await;
                }
            )*
        }

        mod on_tokio_postgres_prepared {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$module::$name::<super::driver::TokioPostgresPrepared>().await;
                }
            )*
        }

        mod on_sqlx {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$module::$name::<super::driver::Sqlx>().await;
                }
            )*
        }

        #[cfg(feature = "sqlx-09")]
        mod on_sqlx_09 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$module::$name::<super::driver::sqlx09::Sqlx>().await;
                }
            )*
        }
    };
}

on_each_driver!(
    operations::every_operation_counts_alike_on_either_driver,
    operations::a_pool_is_a_source_and_gets_its_connection_back_idle,
    costs::every_ask_adds_its_cost_on_either_driver,
    costs::tiers_of_one_limit_share_one_count_on_either_driver,
    costs::all_or_nothing_counts_under_every_limit_or_none_on_either_driver,
    faults::nothing_listening_is_unreachable_within_the_budget,
    faults::a_terminated_connection_is_shed_while_the_server_is_up,
    faults::a_connection_killed_mid_call_ends_at_once,
    faults::an_exhausted_pool_is_shed_within_the_budget,
    budget::a_held_row_lock_is_a_lock_timeout_on_either_driver,
    budget::a_slow_call_ends_within_the_budget_shed_on_every_driver,
    budget::a_late_error_of_a_call_given_up_reaches_no_later_statement,
    budget::a_held_row_over_a_long_round_trip_is_a_lock_timeout_on_either_driver,
    budget::every_waiter_on_a_held_row_is_a_lock_timeout_on_either_driver,
    callers_transaction::a_connection_inside_the_callers_transaction_is_refused_on_either_driver,
    keys::hostile_keys_never_break_the_statement_on_either_driver,
    pgbouncer::every_operation_works_through_pgbouncer_on_either_driver,
);
