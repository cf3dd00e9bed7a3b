//! Tests of the harness's PgBouncer, in front of the shared server.
//!
//! Through transaction pooling, prepared statements do not survive from one transaction to
//! the next, so these tests use `query_typed` (unnamed statements) and the simple protocol.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use platformkit_limit_testdb::{PgBouncer, Server, connect};
use tokio_postgres::Client;

const SCHEMA: &str = "CREATE TABLE notes (id bigint PRIMARY KEY, body text);";

/// A PgBouncer with `pool_size` server connections per pair, or `None` (after saying so)
/// when none is installed. In CI, which installs it, a missing PgBouncer is a failure.
fn start_bouncer(pool_size: u32) -> Option<PgBouncer> {
    let bouncer = PgBouncer::start(Server::shared(), pool_size);
    if bouncer.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but no pgbouncer binary was found (PATH, /usr/sbin, /usr/bin, PGBOUNCER)"
        );
        eprintln!("skipped: no pgbouncer binary (apt-get install pgbouncer)");
    }
    bouncer
}

async fn text(client: &Client, sql: &str) -> Option<String> {
    client
        .query_typed_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

async fn backend_pid(client: &Client) -> i32 {
    client
        .query_typed_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("SELECT pg_backend_pid()")
        .get(0)
}

#[tokio::test]
async fn each_role_reaches_its_database_through_the_bouncer() {
    let Some(bouncer) = start_bouncer(2) else {
        return;
    };
    let server = Server::shared();
    assert_ne!(bouncer.port(), server.port());
    let db = server.database(SCHEMA).await;

    let config = bouncer.config_for(&db.config());
    assert_eq!(config.get_user(), db.config().get_user());
    assert_eq!(config.get_dbname(), Some(db.name()));
    assert_eq!(config.get_password(), db.config().get_password());
    assert_eq!(config.get_ports(), [bouncer.port()]);

    let owner = connect(&config).await;
    assert_eq!(
        text(&owner, "SELECT current_user::text").await.as_deref(),
        Some("limit_owner")
    );
    assert_eq!(
        text(&owner, "SELECT current_database()::text")
            .await
            .as_deref(),
        Some(db.name())
    );
    owner
        .batch_execute("INSERT INTO notes VALUES (1, 'through the bouncer')")
        .await
        .unwrap();

    let tenant = connect(&bouncer.config_for(&db.tenant_config())).await;
    assert_eq!(
        text(&tenant, "SELECT current_user::text").await.as_deref(),
        Some("limit_tenant")
    );
    assert_eq!(
        text(&tenant, "SELECT body FROM notes WHERE id = 1")
            .await
            .as_deref(),
        Some("through the bouncer")
    );

    let admin = connect(&bouncer.config_for(&db.admin_config())).await;
    let superuser: bool = admin
        .query_typed_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(superuser);
}

/// Transaction pooling: with one server connection per pair, every client of the pair
/// runs on the same backend, and session state set by one is seen by the next.
#[tokio::test]
async fn clients_take_turns_on_one_server_connection() {
    let Some(bouncer) = start_bouncer(1) else {
        return;
    };
    let db = Server::shared().database(SCHEMA).await;
    let config = bouncer.config_for(&db.config());
    let first = connect(&config).await;
    let second = connect(&config).await;

    assert_eq!(backend_pid(&first).await, backend_pid(&second).await);
    first
        .batch_execute("SELECT set_config('testdb.marker', 'first', false)")
        .await
        .unwrap();
    assert_eq!(
        text(&second, "SELECT current_setting('testdb.marker', true)")
            .await
            .as_deref(),
        Some("first"),
        "a session setting of one client is visible to the next: transaction pooling"
    );

    // A transaction keeps the server connection until it ends.
    first.batch_execute("BEGIN").await.unwrap();
    let waiting = tokio::spawn(async move { backend_pid(&second).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "the second client ran mid-transaction"
    );
    first.batch_execute("COMMIT").await.unwrap();
    let pid = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the second client ran once the transaction ended")
        .unwrap();
    assert_eq!(pid, backend_pid(&first).await);
}

#[tokio::test]
async fn dropping_the_bouncer_stops_it() {
    let Some(bouncer) = start_bouncer(1) else {
        return;
    };
    let port = bouncer.port();
    let db = Server::shared().database(SCHEMA).await;
    let client = connect(&bouncer.config_for(&db.config())).await;
    client.batch_execute("SELECT 1").await.unwrap();

    drop(bouncer);
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "something still listens on the bouncer's port {port}"
    );
    assert!(
        client.batch_execute("SELECT 1").await.is_err(),
        "a client of a stopped bouncer still got an answer"
    );
}

const CHILD_MARKER: &str = "PGBOUNCER_CHILD_REPORT";

/// Run by `a_bouncer_does_not_outlive_its_process` in a child process: starts a bouncer,
/// reports its port, and waits to be killed.
#[test]
#[ignore = "run in a child process by a_bouncer_does_not_outlive_its_process"]
fn bouncer_child_process_body() {
    if std::env::var_os("PLATFORMKIT_TESTDB_CHILD").is_none() {
        return;
    }
    let bouncer = PgBouncer::start(Server::shared(), 1);
    match &bouncer {
        Some(bouncer) => println!("{CHILD_MARKER} {} {}", bouncer.port(), std::process::id()),
        None => println!("{CHILD_MARKER} none"),
    }
    // Keep the bouncer alive: only the exit of the process may stop it.
    std::thread::sleep(Duration::from_secs(600));
    drop(bouncer);
}

#[test]
fn a_bouncer_does_not_outlive_its_process() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "bouncer_child_process_body",
            "--ignored",
            "--nocapture",
        ])
        .env("PLATFORMKIT_TESTDB_CHILD", "1")
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let line = stdout
        .lines()
        .map(Result::unwrap)
        .find(|line| line.starts_with(CHILD_MARKER))
        .expect("the child process did not report its bouncer");
    let fields: Vec<&str> = line[CHILD_MARKER.len()..].split_whitespace().collect();
    if fields == ["none"] {
        child.kill().unwrap();
        child.wait().unwrap();
        // Fails in CI, says so elsewhere.
        assert!(start_bouncer(1).is_none());
        return;
    }
    let port: u16 = fields[0].parse().unwrap();
    let pid: u32 = fields[1].parse().unwrap();
    assert_eq!(pid, child.id());
    assert!(TcpStream::connect(("127.0.0.1", port)).is_ok());

    // No destructor runs on SIGKILL.
    child.kill().unwrap();
    child.wait().unwrap();

    let base = std::env::temp_dir().join("platformkit-limit-pg");
    let leftovers = || -> Vec<PathBuf> {
        std::fs::read_dir(&base)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with(&format!("{pid}-"))
                    })
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let up = TcpStream::connect(("127.0.0.1", port)).is_ok();
        let dirs = leftovers();
        if !up && dirs.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "30 s after the process died: bouncer up: {up}, directories left: {dirs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
