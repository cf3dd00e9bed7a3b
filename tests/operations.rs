//! What an operator relies on: the schema applies twice, the purge schedule
//! purges and stops, and (with the `tracing` feature) every unreachable
//! outcome and every purge is a warning event that names the limit and the
//! cause, never the key.

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
            "SELECT count(*) FROM pg_policy WHERE polrelid = 'platformkit_limits'::regclass",
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
            "INSERT INTO platformkit_limits (key, window_start, window_end, count)
             SELECT 'old|' || i, now() - interval '3 days', now() - interval '2 days', 1
             FROM generate_series(1, 100) AS i",
        )
        .await
        .expect("closed windows");
    let left = async || -> i64 {
        admin
            .query_one("SELECT count(*) FROM platformkit_limits", &[])
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

#[cfg(feature = "tracing")]
mod events {
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    /// The warning events seen, as `field=value` strings.
    #[derive(Clone, Default)]
    pub struct Seen(pub Arc<Mutex<Vec<(Level, String)>>>);

    struct Fields(String);

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!("{}={:?} ", field.name(), value));
        }
    }

    impl Subscriber for Seen {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            self.0
                .lock()
                .expect("not poisoned")
                .push((*event.metadata().level(), fields.0));
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
}

#[cfg(feature = "tracing")]
#[test]
fn unreachable_outcomes_and_purges_are_warning_events_without_the_key() {
    let seen = events::Seen::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    tracing::subscriber::with_default(seen.clone(), || {
        runtime.block_on(async {
            let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let db = Server::shared().database(SCHEMA).await;
            // A fresh config: adding a port to one that has one would be
            // a configuration error, not an unreachable server.
            let mut closed = tokio_postgres::Config::new();
            closed.host("127.0.0.1").port(nowhere).user("limit_owner");
            let limiter = Limiter::new(Postgres::new(closed))
                .with_budget(Duration::from_millis(500))
                .expect("a budget");
            let limit = Limit::new("login", 3, Duration::from_secs(60)).expect("a limit");
            let key = Key::email("secret-alice@example.com");
            let verdict = limiter.failed(&limit, &key).await.expect("a verdict");
            assert!(verdict.is_unreachable());
            platformkit_limit::purge(&db.config())
                .await
                .expect("a purge");
        });
    });
    let seen = seen.0.lock().expect("not poisoned").clone();
    let warnings: Vec<&String> = seen
        .iter()
        .filter(|(level, _)| *level == tracing::Level::WARN)
        .map(|(_, fields)| fields)
        .collect();
    let unreachable = warnings
        .iter()
        .find(|f| f.contains("fail-open"))
        .expect("a warning for the unreachable outcome");
    assert!(unreachable.contains("limit=\"login\""), "{unreachable}");
    assert!(
        unreachable.contains("operation=\"failed\""),
        "{unreachable}"
    );
    assert!(unreachable.contains("cause="), "{unreachable}");
    assert!(
        warnings.iter().any(|f| f.contains("purged")),
        "a warning for the purge: {warnings:?}"
    );
    for (_, fields) in &seen {
        assert!(
            !fields.contains("secret-alice"),
            "an event shows the key: {fields}"
        );
    }
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
