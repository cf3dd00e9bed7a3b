//! PgBouncer in transaction mode in front of the shared server, and what
//! another client of the one server connection sees between the limiter's
//! calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use platformkit_limit_testdb::{PgBouncer, Server};
use tokio::task::JoinHandle;
use tokio_postgres::Client;

use super::db::backend_pid;

/// A fresh database with a `scratch` table the application's transactions
/// write to, as `limit_owner`.
pub async fn fresh_db_with_scratch() -> platformkit_limit_testdb::TestDb {
    let db = super::db::fresh_db().await;
    db.connect()
        .await
        .batch_execute("CREATE TABLE scratch (n int NOT NULL)")
        .await
        .expect("creating the scratch table as limit_owner");
    db
}

/// A PgBouncer in front of the shared server, or `None` (after saying so)
/// when none is installed. In CI, which installs it, that is a failure.
pub fn start_bouncer(pool_size: u32) -> Option<PgBouncer> {
    let bouncer = PgBouncer::start(Server::shared(), pool_size);
    if bouncer.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but no pgbouncer binary was found (PATH, /usr/sbin, /usr/bin, \
             PGBOUNCER); .ci/run installs it"
        );
        eprintln!("skipped: no pgbouncer binary (apt-get install pgbouncer, or set PGBOUNCER)");
    }
    bouncer
}

/// What another client of the server connection sees, between the
/// limiter's calls: the switch is off, the table looks empty (row-level
/// security), and it is the same backend, `expected_pid`.
pub async fn observe(client: &Client, expected_pid: i32) {
    let switch: Option<String> = client
        .query_typed_one(
            "SELECT pg_catalog.current_setting('platformkit.system', true)",
            &[],
        )
        .await
        .expect("reading the system switch")
        .get(0);
    assert!(
        matches!(switch.as_deref(), None | Some("")),
        "the system switch leaked to another client of the server connection: {switch:?}"
    );
    let is_system: bool = client
        .query_typed_one("SELECT platformkit.platformkit_is_system()", &[])
        .await
        .expect("SELECT platformkit.platformkit_is_system()")
        .get(0);
    assert!(
        !is_system,
        "platformkit.platformkit_is_system() is true outside the limiter"
    );
    let visible: i64 = client
        .query_typed_one("SELECT count(*) FROM platformkit.platformkit_limits", &[])
        .await
        .expect("counting the rows")
        .get(0);
    assert_eq!(
        visible, 0,
        "rows of platformkit.platformkit_limits are visible outside the limiter's transaction"
    );
    assert_eq!(
        backend_pid(client).await,
        expected_pid,
        "the observer is not on the limiter's server connection"
    );
}

/// [`observe`] over and over on a task of its own, racing the limiter's
/// calls for the one server connection, until [`stop`](Watching::stop).
pub struct Watching {
    done: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Watching {
    pub fn start(client: Arc<Client>, expected_pid: i32) -> Watching {
        let done = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (done, rounds) = (Arc::clone(&done), Arc::clone(&rounds));
            async move {
                while !done.load(Ordering::Acquire) {
                    observe(&client, expected_pid).await;
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Watching { done, rounds, task }
    }

    /// How many observations so far, shared with the observing task.
    pub fn rounds(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.rounds)
    }

    /// Stops observing (failing the test if an observation failed) and
    /// returns how many observations there were.
    pub async fn stop(self) -> u64 {
        self.done.store(true, Ordering::Release);
        self.task.await.expect("the observer's task");
        self.rounds.load(Ordering::Relaxed)
    }
}
