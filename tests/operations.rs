//! What an operator relies on: the schema applies twice, the purge schedule
//! purges and stops, and a misconfigured connection source is an error.

use std::time::Duration;

use platformkit_limit::{Key, Limit, Limiter, Postgres, PurgeTask, SCHEMA};
use platformkit_limit_testdb::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_safe_to_apply_twice() {
    let db = Server::shared().database(SCHEMA).await;
    let owner = db.connect().await;
    owner.batch_execute(SCHEMA).await.expect("applied again");
    owner.batch_execute(SCHEMA).await.expect("and again");
    let admin = db.connect_admin().await;
    let policies: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_policy WHERE polrelid = 'platformkit.platformkit_limits'::regclass",
            &[],
        )
        .await
        .expect("a count")
        .get(0);
    assert_eq!(policies, 1, "still one policy");
    let limiter = Limiter::new(Postgres::new(db.config()));
    let limit = Limit::new("login", 3, Duration::from_secs(60)).expect("a limit");
    let verdict = limiter
        .failed(&limit, &Key::opaque("k"))
        .await
        .expect("a verdict");
    assert_eq!(verdict.count(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_schedule_purges_at_once_and_stops_when_told() {
    let db = Server::shared().database(SCHEMA).await;
    let admin = db.connect_admin().await;
    admin
        .batch_execute(
            "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             SELECT 'old|' || i, now() - interval '3 days', now() - interval '2 days', 1
             FROM generate_series(1, 100) AS i",
        )
        .await
        .expect("closed windows");
    let left = async || -> i64 {
        admin
            .query_one("SELECT count(*) FROM platformkit.platformkit_limits", &[])
            .await
            .expect("a count")
            .get(0)
    };
    let purging = PurgeTask::hourly(db.config());
    let mut waited = Duration::ZERO;
    while left().await > 0 && waited < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    assert_eq!(left().await, 0, "the first purge runs at once");
    tokio::time::timeout(Duration::from_secs(5), purging.stop())
        .await
        .expect("stops when told");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misconfigured_connection_source_is_an_error_never_an_allow() {
    let db = Server::shared().database(SCHEMA).await;
    let limit = Limit::new("login", 3, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("k");

    // The server answers, and refuses: the database does not exist.
    let mut missing = db.config();
    missing.dbname("no_such_database");
    // The configuration itself is invalid: two ports for one host.
    let mut invalid = db.config();
    invalid.port(1);
    for (what, config) in [
        ("a missing database", missing),
        ("an invalid configuration", invalid),
    ] {
        let limiter = Limiter::new(Postgres::new(config));
        let error = limiter
            .failed(&limit, &key)
            .await
            .expect_err("a misconfiguration is an error");
        assert_eq!(
            error.kind(),
            platformkit_limit::ErrorKind::Misconfigured,
            "{what}: {error}"
        );
        assert!(!error.is_unreachable(), "{what}");
    }
}

/// One vocabulary: a reservation is `reserve` in the calls, in the
/// statements sent and in its errors (its statement was once labelled
/// `hit`), and a permit's success is `take_back`.
#[tokio::test]
async fn a_reservation_is_labelled_reserve_in_every_metric_and_error() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use platformkit_limit::Reservation;
    use platformkit_limit::metric::{CALLS_TOTAL, LABEL_OPERATION, STATEMENTS_TOTAL};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let db = Server::shared().database(SCHEMA).await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let limit = Limit::new("login", 3, Duration::from_secs(60)).expect("a limit");
    match limiter
        .reserve(&limit, &Key::opaque("k"))
        .await
        .expect("a reservation")
    {
        Reservation::Granted(permit) => permit.succeeded().await.expect("taken back"),
        Reservation::Refused(verdict) => panic!("refused: {verdict:?}"),
    }

    let mut seen: Vec<(&str, String)> = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let operation = key
            .labels()
            .find(|l| l.key() == LABEL_OPERATION)
            .map(|l| l.value().to_owned())
            .unwrap_or_default();
        match (key.name(), value) {
            (CALLS_TOTAL, DebugValue::Counter(1)) => seen.push(("calls", operation)),
            (STATEMENTS_TOTAL, DebugValue::Counter(1)) => seen.push(("statements", operation)),
            _ => {}
        }
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            ("calls", "reserve".to_owned()),
            ("calls", "take_back".to_owned()),
            ("statements", "reserve".to_owned()),
            ("statements", "take_back".to_owned()),
        ]
    );

    // And its error names it: a database without the schema.
    let empty = Server::shared().empty_database().await;
    let limiter = Limiter::new(Postgres::new(empty.config()));
    let err = match limiter.reserve(&limit, &Key::opaque("k")).await {
        Err(err) => err,
        Ok(_) => panic!("a reservation without the schema"),
    };
    assert!(err.to_string().starts_with("reserve:"), "{err}");
}
