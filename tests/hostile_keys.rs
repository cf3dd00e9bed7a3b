//! Keys that would break a naive limiter, against real PostgreSQL.
//!
//! The limiter fails open: a key that made PostgreSQL raise an error would be
//! a way around every limit. And two spellings of one subject that land on
//! two rows multiply an attacker's attempts. So every hostile key here goes
//! through `failed` and `check` on a real server, and the test asserts that
//! no call errs or reports unreachable, that distinct subjects are counted
//! apart, and that equivalent spellings are counted together.

use std::time::Duration;

use crate::common;
use common::db::fresh_db;
use common::hostile_keys::hostile_subjects;
use platformkit_limit::{Limit, Limiter, Postgres};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_never_break_the_statement() {
    let db = fresh_db().await;
    // Generous: this test is about errors, not speed, on a shared machine.
    let limiter = Limiter::builder(Postgres::new(db.config()))
        .budget(Duration::from_secs(30))
        .build()
        .expect("a valid budget");
    let limit = Limit::new("hostile", 1_000, Duration::from_secs(3600)).expect("a valid limit");
    let subjects = hostile_subjects();
    let keys: usize = subjects.iter().map(|s| s.spellings.len()).sum();
    assert!(keys >= 40, "at least 40 hostile keys, have {keys}");

    // Distinct subjects must be distinct keys before the database sees them.
    for (i, a) in subjects.iter().enumerate() {
        for b in &subjects[i + 1..] {
            assert_ne!(
                a.spellings[0], b.spellings[0],
                "{:?} and {:?} share a key",
                a.what, b.what
            );
        }
    }

    // Each spelling records one failure.
    for subject in &subjects {
        for key in &subject.spellings {
            let verdict = limiter
                .failed(&limit, key)
                .await
                .unwrap_or_else(|e| panic!("failed for {:?}: {e}", subject.what));
            assert!(
                !verdict.is_unreachable(),
                "failed for {:?} reported unreachable: {:?}",
                subject.what,
                verdict.unreachable()
            );
        }
    }

    // Each subject counts exactly its own spellings, from every spelling.
    for subject in &subjects {
        for key in &subject.spellings {
            let verdict = limiter
                .check(&limit, key)
                .await
                .unwrap_or_else(|e| panic!("check for {:?}: {e}", subject.what));
            assert!(!verdict.is_unreachable(), "check for {:?}", subject.what);
            assert_eq!(
                verdict.count(),
                Some(subject.spellings.len() as u64),
                "count for {:?}",
                subject.what
            );
        }
    }

    // And the table holds one row per subject, each key within bounds.
    let admin = db.connect_admin().await;
    let row = admin
        .query_one(
            "SELECT count(*), max(octet_length(key)) FROM platformkit.platformkit_limits",
            &[],
        )
        .await
        .expect("a system read");
    let rows: i64 = row.get(0);
    let longest: i32 = row.get(1);
    assert_eq!(rows as usize, subjects.len());
    assert!(longest as usize <= "hostile|".len() + platformkit_limit::Key::MAX_BYTES);
}
