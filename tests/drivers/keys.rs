//! Keys: the hostile keys of `tests/common/hostile_keys.rs`, on each driver.

use std::time::Duration;

use platformkit_limit::{Key, Limit, LimitConn, Limiter, Postgres};

use super::driver::{Driver, Lend, hold, lend};
use crate::common::db::fresh_db;
use crate::common::hostile_keys;

/// Every hostile key goes through `failed` and `check` without an error or
/// an unreachable verdict; each subject counts exactly its own spellings;
/// the table holds one row per subject.
pub async fn hostile_keys_never_break_the_statement_on_either_driver<D: Driver>()
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
