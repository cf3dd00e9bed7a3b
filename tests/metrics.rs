//! The metrics count every call by limit, operation and outcome, take one
//! duration sample per call, and never carry the key in a label.

use std::collections::BTreeMap;

use crate::common;
use common::db::{fresh_db, nothing_listens};
use common::metrics::{Recorded, series};
use common::{BUDGET, limit};
use metrics_util::debugging::DebuggingRecorder;
use platformkit_limit::{Key, Limiter, Postgres};
use platformkit_limit_testdb::Server;

#[tokio::test]
async fn metrics_count_every_call_by_limit_operation_and_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let db = fresh_db().await;
    // Without the refusal cache, every call reaches the store: this test is
    // about what the store's answers count (tests/refusal_cache.rs covers
    // the cache).
    let limiter = Limiter::builder(Postgres::new(db.config()))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    let unreachable = Limiter::builder(Postgres::new(nothing_listens()))
        .budget(BUDGET)
        .build()
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

/// A purge's counters exist from its first run, at 0: an alert on the
/// increase of its failures sees the first one (a counter born at 1 shows
/// no increase).
#[tokio::test]
async fn a_purge_starts_its_counters_at_zero() {
    use metrics_util::debugging::DebugValue;
    use platformkit_limit::metric::{PURGE_FAILURES_TOTAL, PURGED_ROWS_TOTAL};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let db = fresh_db().await;
    assert_eq!(
        platformkit_limit::purge(&db.config())
            .await
            .expect("a purge"),
        0
    );
    let counters: BTreeMap<String, u64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => Some((key.key().name().to_owned(), n)),
            _ => None,
        })
        .collect();
    assert_eq!(counters.get(PURGE_FAILURES_TOTAL), Some(&0), "{counters:?}");
    assert_eq!(counters.get(PURGED_ROWS_TOTAL), Some(&0), "{counters:?}");
}
