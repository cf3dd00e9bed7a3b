//! Every metric and label value that the Grafana dashboard and the
//! Prometheus alerts query is one the library really emits, read from a
//! recorder after exercising each operation: a rename cannot silently blank
//! a panel or mute an alert.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use metrics_util::debugging::DebuggingRecorder;
use platformkit_limit::{Key, Limit, Limiter, Memory, Postgres, SCHEMA, purge};
use platformkit_limit_testdb::Server;

/// What the library emitted: metric names, and for each label key the values
/// seen.
#[derive(Debug, Default)]
struct Emitted {
    names: BTreeSet<String>,
    labels: BTreeMap<String, BTreeSet<String>>,
}

/// Runs every operation and every outcome once under a recorder.
fn emitted() -> Emitted {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let limit = Limit::new("dash", 1, Duration::from_secs(60)).expect("a limit");
            let key = Key::opaque("k");
            let memory = Limiter::new(Memory::new());
            memory.check(&limit, &key).await.expect("allowed");
            memory.failed(&limit, &key).await.expect("refused");
            memory.hit(&limit, &key).await.expect("refused");
            memory.reset(&limit, &key).await.expect("cleared");

            let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let server = Server::shared();
            let db = server.database(SCHEMA).await;
            // A fresh config: adding a port to one that has one would be
            // a configuration error, not an unreachable server.
            let mut closed = tokio_postgres::Config::new();
            closed.host("127.0.0.1").port(nowhere).user("limit_owner");
            let unreachable = Limiter::builder(Postgres::new(closed.clone()))
                .budget(Duration::from_millis(500))
                .build()
                .expect("a budget");
            let verdict = unreachable.check(&limit, &key).await.expect("a verdict");
            assert!(verdict.is_unreachable());

            let bare = server.empty_database().await;
            let broken = Limiter::new(Postgres::new(bare.config()));
            broken.failed(&limit, &key).await.expect_err("no schema");

            // A limiter answered before, whose one connection is held
            // elsewhere: the wait is load, and the call is shed.
            let held = std::sync::Arc::new(tokio::sync::Mutex::new(db.connect().await));
            let lend = {
                let held = held.clone();
                move || {
                    let held = held.clone();
                    async move { Ok::<_, std::convert::Infallible>(held.lock_owned().await) }
                }
            };
            let busy = Limiter::builder(Postgres::new(lend))
                .budget(Duration::from_millis(200))
                .build()
                .expect("a budget");
            busy.check(&limit, &key).await.expect("answered");
            let taken = held.lock().await;
            let verdict = busy.check(&limit, &key).await.expect("a verdict");
            assert!(verdict.is_shed(), "{verdict:?}");
            drop(taken);

            let postgres = Limiter::new(Postgres::new(db.config()));
            postgres.failed(&limit, &key).await.expect("a verdict");
            purge(&db.config()).await.expect("a purge");
            purge(&closed).await.expect_err("an unreachable purge");
        });
    });
    let mut emitted = Emitted::default();
    for (key, _, _, _) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        emitted.names.insert(key.name().to_owned());
        for label in key.labels() {
            emitted
                .labels
                .entry(label.key().to_owned())
                .or_default()
                .insert(label.value().to_owned());
        }
    }
    emitted
}

/// The metric names a query text mentions, histogram suffixes removed.
fn queried_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("platformkit_limit_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        names.insert(name.to_owned());
        rest = &tail[end..];
    }
    names
}

/// The values a query text matches for `label` (`label="a"` or
/// `label=~"a|b"`), skipping dashboard variables.
fn queried_values(text: &str, label: &str) -> BTreeSet<String> {
    let mut values = BTreeSet::new();
    for opener in [format!("{label}=\""), format!("{label}=~\"")] {
        let mut rest = text;
        while let Some(at) = rest.find(&opener) {
            let tail = &rest[at + opener.len()..];
            let end = tail.find('"').expect("a closing quote");
            for value in tail[..end].split('|') {
                if !value.starts_with('$') && !value.is_empty() {
                    values.insert(value.to_owned());
                }
            }
            rest = &tail[end..];
        }
    }
    values
}

fn contrib(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("contrib")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_metric_the_dashboard_and_alerts_query_is_emitted() {
    let emitted = emitted();
    for file in ["grafana/platformkit-limit.json", "prometheus/alerts.yml"] {
        let text = contrib(file);
        let names = queried_names(&text);
        assert!(!names.is_empty(), "{file} queries no metric");
        for name in names {
            assert!(
                emitted.names.contains(&name),
                "{file} queries {name}, which the library does not emit; it emits {:?}",
                emitted.names
            );
        }
        for label in ["outcome", "operation", "source"] {
            for value in queried_values(&text, label) {
                assert!(
                    emitted
                        .labels
                        .get(label)
                        .is_some_and(|v| v.contains(&value)),
                    "{file} matches {label}=\"{value}\", which the library never emits; it emits {:?}",
                    emitted.labels.get(label)
                );
            }
        }
    }
}

#[test]
fn the_metric_check_can_fail() {
    // The scanner finds what a renamed metric or outcome would break.
    let text = r#"rate(platformkit_limit_calls_totl{outcome=~"allowed|denied"}[5m])"#;
    assert_eq!(
        queried_names(text),
        BTreeSet::from(["platformkit_limit_calls_totl".to_owned()])
    );
    assert_eq!(
        queried_values(text, "outcome"),
        BTreeSet::from(["allowed".to_owned(), "denied".to_owned()])
    );
    let emitted = emitted();
    assert!(!emitted.names.contains("platformkit_limit_calls_totl"));
    assert!(!emitted.labels["outcome"].contains("denied"));
    for outcome in [
        "allowed",
        "refused",
        "unreachable",
        "shed",
        "error",
        "cleared",
    ] {
        assert!(emitted.labels["outcome"].contains(outcome), "{outcome}");
    }
}
