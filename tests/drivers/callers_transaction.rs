//! The caller's transaction: a connection lent inside one is refused.

use std::collections::BTreeMap;

use platformkit_limit::{ErrorKind, Key, LimitConn, Limiter, Postgres};
use tokio_postgres::error::SqlState;

use super::driver::{Driver, Lend, assert_idle_and_switch_off, hold, int, lend, text};
use super::{assert_counted, counts};
use crate::common::db::fresh_db;
use crate::common::limit;

/// A connection lent inside a transaction of the caller's (with work in it,
/// serializable, read only, or already failed): an `InTransaction` error,
/// never a verdict; the caller's work is not committed, the connection goes
/// back idle with the switch off, nothing is counted, and the next call on
/// it counts.
pub async fn a_connection_inside_the_callers_transaction_is_refused_on_either_driver<D: Driver>()
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
