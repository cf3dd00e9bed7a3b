//! Tests of the test harness itself, against real servers.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use platformkit_limit_testdb::{Options, Server, connect};
use tokio_postgres::Config;
use tokio_postgres::error::SqlState;

const SCHEMA: &str = "
    CREATE TABLE buckets (
        key text PRIMARY KEY,
        tokens bigint NOT NULL
    );
    CREATE TABLE audit (id bigint PRIMARY KEY, note text);
";

#[tokio::test]
async fn shared_server_answers() {
    let server = Server::shared();
    assert!(server.port() > 0);
    let client = connect(&server.admin_config()).await;
    let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    if server.is_owned() {
        assert_eq!(server.host(), "127.0.0.1");
        assert!(server.bin_dir().unwrap().join("postgres").is_file());
        let fsync: String = client.query_one("SHOW fsync", &[]).await.unwrap().get(0);
        assert_eq!(fsync, "off");
        let max: String = client
            .query_one("SHOW max_connections", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(max, "300");
    }
}

#[test]
fn shared_server_is_usable_outside_a_runtime() {
    let first = Server::shared();
    let second = Server::shared();
    assert!(std::ptr::eq(first, second));
    assert!(first.port() > 0);
}

#[tokio::test]
async fn schema_objects_belong_to_an_ordinary_owner() {
    let db = Server::shared().database(SCHEMA).await;
    let owner = db.connect().await;

    let user: String = owner
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(user, "limit_owner");

    let rows = owner
        .query(
            "SELECT tablename::text, tableowner::text FROM pg_tables \
             WHERE schemaname = 'public' ORDER BY tablename",
            &[],
        )
        .await
        .unwrap();
    let tables: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        tables,
        [
            ("audit".to_owned(), "limit_owner".to_owned()),
            ("buckets".to_owned(), "limit_owner".to_owned()),
        ]
    );

    let db_owner: String = owner
        .query_one(
            "SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(db_owner, "limit_owner");

    for role in ["limit_owner", "limit_tenant"] {
        let row = owner
            .query_one(
                "SELECT rolsuper, rolbypassrls, rolcreatedb, rolcreaterole, rolcanlogin \
                 FROM pg_roles WHERE rolname = $1",
                &[&role],
            )
            .await
            .unwrap();
        let flags: (bool, bool, bool, bool, bool) =
            (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        assert_eq!(
            flags,
            (false, false, false, false, true),
            "attributes of {role}"
        );
    }
}

#[tokio::test]
async fn tenant_reads_and_writes_but_does_not_own() {
    let db = Server::shared().database(SCHEMA).await;
    let tenant = db.connect_tenant().await;

    let user: String = tenant
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(user, "limit_tenant");

    tenant
        .execute("INSERT INTO buckets VALUES ('a', 5)", &[])
        .await
        .unwrap();
    tenant
        .execute(
            "UPDATE buckets SET tokens = tokens - 1 WHERE key = 'a'",
            &[],
        )
        .await
        .unwrap();
    let tokens: i64 = tenant
        .query_one("SELECT tokens FROM buckets WHERE key = 'a'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tokens, 4);
    tenant.execute("DELETE FROM buckets", &[]).await.unwrap();
    tenant
        .execute("INSERT INTO audit VALUES (1, 'x')", &[])
        .await
        .unwrap();

    let error = tenant
        .batch_execute("DROP TABLE buckets")
        .await
        .expect_err("the tenant must not be able to drop the owner's table");
    assert_eq!(error.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
    let error = tenant
        .batch_execute("CREATE TABLE mine (x int)")
        .await
        .expect_err("the tenant must not be able to create tables");
    assert_eq!(error.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
}

#[tokio::test]
async fn empty_database_grants_later_tables_to_the_tenant() {
    let db = Server::shared().empty_database().await;
    let owner = db.connect().await;
    let count: i64 = owner
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 0);
    owner
        .batch_execute("CREATE TABLE later (x int)")
        .await
        .unwrap();

    let tenant = db.connect_tenant().await;
    tenant
        .execute("INSERT INTO later VALUES (1)", &[])
        .await
        .unwrap();
}

#[tokio::test]
async fn databases_are_distinct_and_reachable_by_url() {
    let server = Server::shared();
    let first = server.empty_database().await;
    let second = server.empty_database().await;
    assert_ne!(first.name(), second.name());

    let config = Config::from_str(&first.url()).unwrap();
    assert_eq!(config.get_user(), Some("limit_owner"));
    let client = connect(&config).await;
    let name: String = client
        .query_one("SELECT current_database()::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(name, first.name());

    let admin = first.connect_admin().await;
    let is_super: bool = admin
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(is_super);
}

/// A test that lists its database's backends finds only its own: the
/// session that applied the schema has ended.
#[tokio::test]
async fn a_fresh_database_has_no_session_left_from_its_set_up() {
    let server = Server::shared();
    let admin = connect(&server.admin_config()).await;
    for _ in 0..20 {
        let db = server.database(SCHEMA).await;
        let left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE datname = $1",
                &[&db.name()],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(left, 0, "sessions left in {}", db.name());
    }
}

#[tokio::test]
#[should_panic(expected = "applying the schema")]
async fn a_broken_schema_is_reported() {
    Server::shared().database("CREATE TABLE (").await;
}

#[tokio::test]
async fn own_server_restarts_and_stops_on_drop() {
    let server = Server::start(Options::default());
    assert!(server.is_owned());
    let port = server.port();
    let db = server.database(SCHEMA).await;
    let owner = db.connect().await;
    owner
        .execute("INSERT INTO buckets VALUES ('kept', 1)", &[])
        .await
        .unwrap();

    server.pg_ctl(&["restart", "-m", "fast", "-w"]);
    assert_eq!(server.port(), port);
    // The restart terminated the old connection.
    assert!(owner.query_one("SELECT 1", &[]).await.is_err());

    let owner = db.connect().await;
    let tokens: i64 = owner
        .query_one("SELECT tokens FROM buckets WHERE key = 'kept'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tokens, 1);
    let admin = connect(&server.admin_config()).await;
    let (max_connections, fsync): (String, String) = {
        let a = admin.query_one("SHOW max_connections", &[]).await.unwrap();
        let b = admin.query_one("SHOW fsync", &[]).await.unwrap();
        (a.get(0), b.get(0))
    };
    assert_eq!((max_connections.as_str(), fsync.as_str()), ("300", "off"));

    server.pg_ctl(&["stop", "-m", "immediate"]);
    assert!(db.config().connect(tokio_postgres::NoTls).await.is_err());
    server.pg_ctl(&["start", "-w"]);
    db.connect().await;

    drop(server);
    assert!(db.config().connect(tokio_postgres::NoTls).await.is_err());
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[tokio::test]
async fn durable_server_keeps_fsync_on() {
    let server = Server::start(Options { durable: true });
    let admin = connect(&server.admin_config()).await;
    for setting in ["fsync", "synchronous_commit", "full_page_writes"] {
        let value: String = admin
            .query_one(&format!("SHOW {setting}"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(value, "on", "{setting}");
    }
}

#[test]
fn server_can_be_started_and_dropped_outside_a_runtime() {
    let server = Server::start(Options::default());
    let port = server.port();
    assert!(TcpStream::connect(("127.0.0.1", port)).is_ok());
    drop(server);
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_replays_its_primary_and_takes_over_when_promoted() {
    let primary = tokio::task::block_in_place(|| Server::start(Options::default()));
    assert_eq!(primary.standby_name(), None);
    // Created before the base backup: the standby starts with it.
    let db = primary.database(SCHEMA).await;
    let owner = db.connect().await;
    owner
        .execute("INSERT INTO buckets VALUES ('before', 1)", &[])
        .await
        .unwrap();

    let standby = tokio::task::block_in_place(|| primary.standby(Options::default()));
    assert!(standby.is_owned());
    assert_ne!(standby.port(), primary.port());
    let name = standby
        .standby_name()
        .expect("a standby has a name")
        .to_owned();

    // Written after the base backup: streamed.
    owner
        .execute("INSERT INTO buckets VALUES ('after', 2)", &[])
        .await
        .unwrap();
    primary.wait_for_standby(&standby).await;

    let on_standby = db.on(&standby);
    assert_eq!(on_standby.name(), db.name());
    let reader = on_standby.connect().await;
    let rows = reader
        .query("SELECT key, tokens FROM buckets ORDER BY key", &[])
        .await
        .unwrap();
    let rows: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(rows, [("after".to_owned(), 2), ("before".to_owned(), 1)]);
    let error = reader
        .execute("INSERT INTO buckets VALUES ('refused', 3)", &[])
        .await
        .expect_err("a hot standby refuses writes");
    assert_eq!(error.code(), Some(&SqlState::READ_ONLY_SQL_TRANSACTION));

    // The primary knows it under its name, as an asynchronous standby.
    let admin = connect(&primary.admin_config()).await;
    let state: String = admin
        .query_one(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "async");

    tokio::task::block_in_place(|| {
        primary.pg_ctl(&["stop", "-m", "immediate"]);
        standby.promote();
    });
    let writer = on_standby.connect().await;
    let in_recovery: bool = writer
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!in_recovery);
    writer
        .execute("INSERT INTO buckets VALUES ('promoted', 3)", &[])
        .await
        .unwrap();

    let port = standby.port();
    drop((reader, writer));
    tokio::task::block_in_place(|| drop((standby, primary)));
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_has_every_acknowledged_commit() {
    let primary = tokio::task::block_in_place(|| Server::start(Options { durable: true }));
    let db = primary.database(SCHEMA).await;
    let standby = tokio::task::block_in_place(|| primary.standby(Options::default()));
    primary.make_synchronous(&standby).await;

    let owner = db.connect().await;
    for i in 0..20_i64 {
        owner
            .execute(
                "INSERT INTO buckets VALUES ($1, $2)",
                &[&format!("k{i}"), &i],
            )
            .await
            .unwrap();
    }
    // Cut off, the standby acknowledges nothing more: a commit waits for it.
    standby.stop_streaming().await;
    let waiting = tokio::spawn(async move {
        owner
            .execute("INSERT INTO buckets VALUES ('unacknowledged', 0)", &[])
            .await
    });
    let admin = connect(&primary.admin_config()).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let waits: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waits == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the commit did not wait for the standby"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // No wait for the standby: the acknowledgements were its.
    tokio::task::block_in_place(|| {
        primary.pg_ctl(&["stop", "-m", "immediate"]);
        standby.promote();
    });
    assert!(
        waiting.await.unwrap().is_err(),
        "the commit the standby never had was not acknowledged"
    );
    let promoted = db.on(&standby).connect().await;
    let kept: i64 = promoted
        .query_one("SELECT count(*) FROM buckets", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "synchronous_commit = off")]
async fn a_standby_cannot_be_made_synchronous_where_commits_do_not_wait() {
    let primary = tokio::task::block_in_place(|| Server::start(Options::default()));
    let standby = tokio::task::block_in_place(|| primary.standby(Options::default()));
    primary.make_synchronous(&standby).await;
}

/// Marker the child process prints its ports and pid after.
const CHILD_MARKER: &str = "testdb-child:";

/// Run by `servers_do_not_outlive_their_process` in a child process: starts the shared
/// server, a restarted own server (whose postmaster is then not our child) and a standby
/// of it, reports them, and waits to be killed.
#[test]
#[ignore = "run in a child process by servers_do_not_outlive_their_process"]
fn child_process_body() {
    if std::env::var_os("PLATFORMKIT_TESTDB_CHILD").is_none() {
        return;
    }
    let shared = Server::shared();
    let own = Server::start(Options::default());
    own.pg_ctl(&["restart", "-m", "fast", "-w"]);
    let standby = own.standby(Options::default());
    println!(
        "{CHILD_MARKER} {} {} {} {}",
        shared.port(),
        own.port(),
        standby.port(),
        std::process::id()
    );
    // Keep `own` and `standby` alive: only the exit of the process may clean them up.
    std::thread::sleep(Duration::from_secs(600));
    drop((standby, own));
}

#[test]
fn servers_do_not_outlive_their_process() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_body", "--ignored", "--nocapture"])
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
        .expect("the child process did not report its servers");
    let fields: Vec<u32> = line[CHILD_MARKER.len()..]
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    let (shared_port, own_port, standby_port, pid) = (
        fields[0] as u16,
        fields[1] as u16,
        fields[2] as u16,
        fields[3],
    );
    assert_eq!(pid, child.id());
    assert!(TcpStream::connect(("127.0.0.1", shared_port)).is_ok());
    assert!(TcpStream::connect(("127.0.0.1", own_port)).is_ok());
    assert!(TcpStream::connect(("127.0.0.1", standby_port)).is_ok());

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
        let shared_up = TcpStream::connect(("127.0.0.1", shared_port)).is_ok();
        let own_up = TcpStream::connect(("127.0.0.1", own_port)).is_ok();
        let standby_up = TcpStream::connect(("127.0.0.1", standby_port)).is_ok();
        let dirs = leftovers();
        if !shared_up && !own_up && !standby_up && dirs.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "30 s after the process died: shared server up: {shared_up}, own server up: \
             {own_up}, standby up: {standby_up}, directories left: {dirs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
