//! The operator's tool, `platformkit-limit`, run as a
//! binary against a real server: `migrate` applies the schema and the
//! grants; `limits` lists the limits the service recorded, and `status`,
//! `reset` and `locked` read them, so nothing about a limit is typed;
//! `status` reads a key under every limit or one, `reset` unlocks it (the
//! key normalized as the service normalizes it), `locked` lists who is
//! refused, `purge` purges; a missing `DATABASE_URL`, a bad key, a limit
//! nobody recorded and nothing to reset are clear errors with their exit
//! codes.

use std::process::{Command, Output};
use std::time::Duration;

/// The suite's database helpers, shared with the library's tests.
#[path = "../../tests/common/db.rs"]
#[allow(dead_code, reason = "the suite's helpers; these tests use a few")]
mod db;

use db::fresh_db;
use platformkit_limit::{Key, Limiter, Postgres};
use platformkit_limit_testdb::{Server, TestDb};

/// Runs the tool with `args` on `db` (as its owner), or with no
/// `DATABASE_URL` at all.
fn tool(db: Option<&TestDb>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_platformkit-limit"));
    command.args(args).env_remove("DATABASE_URL");
    if let Some(db) = db {
        command.env("DATABASE_URL", db.url());
    }
    command.output().expect("running platformkit-limit")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[track_caller]
fn assert_exit(output: &Output, code: i32, what: &str) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "{what}: stdout {:?}, stderr {:?}",
        stdout(output),
        stderr(output)
    );
}

/// `migrate` applies the schema to an empty database (twice, safely) and
/// grants the roles given; the granted role can then be limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_applies_the_schema_and_the_grants() {
    let db = Server::shared().empty_database().await;
    let admin = db.connect_admin().await;
    let role = format!("{}_app", db.name());
    admin
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN; GRANT CONNECT ON DATABASE \"{}\" TO \"{role}\"",
            db.name()
        ))
        .await
        .unwrap();
    for _ in 0..2 {
        let out = tool(Some(&db), &["migrate", "--grant", &role]);
        assert_exit(&out, 0, "migrate");
        assert_eq!(stdout(&out), format!("schema applied\ngranted {role}\n"));
    }
    let mut as_role = db.config();
    as_role.user(&role);
    let limiter = Limiter::new(Postgres::new(as_role));
    let verdict = limiter
        .failed(&limit("login", 1), &Key::opaque("a"))
        .await
        .unwrap();
    assert!(verdict.is_refused() && !verdict.is_unreachable());

    let out = tool(Some(&db), &["migrate", "--grant"]);
    assert_exit(&out, 2, "--grant without a role");
}

/// `migrate --grant public` (any case) is refused before anything is
/// applied: PostgreSQL reads `public`, quoted or not, as PUBLIC, and a
/// login granted nothing would get the switch and every count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_to_grant_public_and_applies_nothing() {
    let db = Server::shared().empty_database().await;
    for public in ["public", "PUBLIC", "Public"] {
        let out = tool(Some(&db), &["migrate", "--grant", public]);
        assert_exit(&out, 2, public);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("PUBLIC"),
            "{out:?}"
        );
    }
    let stranger = platformkit_limit_testdb::connect(&db.stranger_config()).await;
    let applied: bool = stranger
        .query_one(
            "SELECT pg_catalog.to_regnamespace('platformkit') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!applied, "the schema was applied before the refusal");
}

/// `status`, `locked` and `reset` on a key the service locked out, typed
/// as the operator types it, each reading the limit as the service
/// defined it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_locked_and_reset_of_a_locked_out_key() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = limit("login", 2);
    limiter.record([&login]).await.unwrap();
    let alice = Key::email("alice@example.com");
    for _ in 0..2 {
        limiter.failed(&login, &alice).await.unwrap();
    }
    limiter.failed(&login, &Key::username("bob")).await.unwrap();

    let typed = "email: Alice@Example.COM ";
    let out = tool(Some(&db), &["status", "login", typed]);
    assert_exit(&out, 0, "status");
    let text = stdout(&out);
    assert!(
        text.starts_with("limit: login\nkey: email|alice@example.com\n"),
        "{text}"
    );
    assert!(text.contains("count: 2 of 2\n"), "{text}");
    assert!(text.contains("refused: yes\n"), "{text}");
    assert!(text.contains("reopens: "), "{text}");

    let out = tool(Some(&db), &["locked", "login"]);
    assert_exit(&out, 0, "locked");
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with("email|alice@example.com count 2 of 2 reopens "),
        "{text}"
    );

    // A wrong case in the limit's name: no such limit, and the ones there
    // are named. Another kind of key: nothing unlocked, said, and not 0.
    let out = tool(
        Some(&db),
        &[
            "reset", "Login", typed, "--reason", "ticket 1", "--by", "ann",
        ],
    );
    assert_exit(&out, 1, "a limit nobody recorded");
    assert!(
        stderr(&out).contains(
            "invalid limit \"Login\": no limit of this name is recorded; the limits recorded: login"
        ),
        "{out:?}"
    );
    let out = tool(
        Some(&db),
        &[
            "reset",
            "login",
            "user:alice@example.com",
            "--reason",
            "ticket 1",
            "--by",
            "ann",
        ],
    );
    assert_exit(&out, 1, "a reset of nothing");
    assert!(stderr(&out).contains("nothing to reset"), "{out:?}");
    assert!(limiter.check(&login, &alice).await.unwrap().is_refused());

    let out = tool(
        Some(&db),
        &[
            "reset", "login", typed, "--reason", "ticket 1", "--by", "ann",
        ],
    );
    assert_exit(&out, 0, "reset");
    assert!(stdout(&out).ends_with(": 1 windows\n"), "{out:?}");
    assert!(
        !limiter.check(&login, &alice).await.unwrap().is_refused(),
        "unlocked"
    );
    let out = tool(Some(&db), &["locked", "login", "--at-most", "5"]);
    assert_exit(&out, 0, "locked after the reset");
    assert_eq!(stdout(&out), "no key of login is refused\n");
    let out = tool(Some(&db), &["status", "login", "user:BOB"]);
    assert!(
        stdout(&out).contains("count: 1 of 2\nrefused: no\n"),
        "{out:?}"
    );
}

/// The limits as the service recorded them, with no option typed: a
/// 15-minute login limit with a lockout locks an account out, a per-address
/// limit refuses another; `limits` lists both, `status KEY` shows the
/// account under every limit with a count (the lockout included, which a
/// guessed window would miss), and `reset --every-limit` unlocks it
/// everywhere, once: again is nothing to reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_reads_the_limits_the_service_recorded() {
    let db = fresh_db().await;
    // Sixteen minutes ago: that 15-minute window has closed since.
    let ago = std::time::SystemTime::now() - Duration::from_secs(16 * 60);
    let earlier = Limiter::new(
        Postgres::new(db.config()).with_clock(platformkit_limit::ManualClock::new(ago)),
    );
    let limiter = Limiter::new(Postgres::new(db.config()));
    let out = tool(Some(&db), &["limits"]);
    assert_exit(&out, 0, "limits before any call");
    assert!(
        stdout(&out).starts_with("no limit is recorded yet"),
        "{out:?}"
    );

    let login = platformkit_limit::Limit::builder("login", 3, Duration::from_secs(15 * 60))
        .lockout(Duration::from_secs(3600))
        .build()
        .unwrap();
    let per_ip = limit("login-ip", 50);
    limiter.record([&login, &per_ip]).await.unwrap();
    let alice = Key::email("alice@example.com");
    for _ in 0..3 {
        earlier.failed(&login, &alice).await.unwrap();
        earlier
            .failed(&per_ip, &Key::ip("203.0.113.7".parse().unwrap()))
            .await
            .unwrap();
    }
    // Its window has closed; the lockout runs on.
    assert!(limiter.check(&login, &alice).await.unwrap().is_refused());

    let out = tool(Some(&db), &["limits"]);
    assert_exit(&out, 0, "limits");
    assert_eq!(
        stdout(&out),
        "login: max 3 per 15m 0s, lockout 1h 0m\nlogin-ip: max 50 per 30d 0h\n"
    );

    let out = tool(Some(&db), &["status", "alice@example.com"]);
    assert_exit(&out, 0, "status across limits");
    let text = stdout(&out);
    assert!(
        text.starts_with("limit: login\nkey: email|alice@example.com\n"),
        "{text}"
    );
    assert!(text.contains("refused: yes\n"), "{text}");
    assert!(text.contains("locked until: "), "{text}");
    assert!(!text.contains("login-ip"), "{text}");

    let out = tool(
        Some(&db),
        &[
            "reset",
            "--every-limit",
            "alice@example.com",
            "--reason",
            "ticket 1",
            "--by",
            "ann",
        ],
    );
    assert_exit(&out, 0, "reset everywhere");
    assert_eq!(
        stdout(&out),
        "reset login email|alice@example.com: 1 windows\n"
    );
    assert!(limiter.check(&login, &alice).await.unwrap().is_allowed());
    let out = tool(
        Some(&db),
        &[
            "reset",
            "--every-limit",
            "alice@example.com",
            "--reason",
            "ticket 1",
            "--by",
            "ann",
        ],
    );
    assert_exit(&out, 1, "nothing left to reset");
    assert!(stderr(&out).contains("nothing to reset"), "{out:?}");
    let out = tool(Some(&db), &["status", "alice@example.com"]);
    assert_eq!(
        stdout(&out),
        "no limit has a count for email|alice@example.com\n"
    );
}

/// A key is typed as the tool shows it: each key `locked` lists, whichever
/// constructor built it, is the key `status` and `reset` find by that
/// text; an email address typed alone is the service's key of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_typed_as_the_tool_shows_it() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = limit("login", 2);
    limiter.record([&login]).await.unwrap();
    let keys = [
        Key::new(["account", "42", "203.0.113.7"]).unwrap(),
        Key::new(["alice@example.com"]).unwrap(),
        Key::opaque("alice\u{200B}"),
        Key::email("carol@example.com"),
    ];
    for key in &keys {
        for _ in 0..2 {
            limiter.failed(&login, key).await.unwrap();
        }
    }

    let out = tool(Some(&db), &["locked", "login"]);
    assert_exit(&out, 0, "locked");
    let mut shown: Vec<String> = stdout(&out)
        .lines()
        .map(|line| line[..line.find(" count ").unwrap()].to_owned())
        .collect();
    shown.sort();
    let mut spelled: Vec<String> = keys.iter().map(Key::spelling).collect();
    spelled.sort();
    assert_eq!(shown, spelled);

    for typed in &shown {
        let out = tool(Some(&db), &["status", "login", typed]);
        assert_exit(&out, 0, typed);
        let text = stdout(&out);
        assert!(
            text.starts_with(&format!("limit: login\nkey: {typed}\ncount: 2 of 2\n")),
            "{text}"
        );
    }
    for (typed, key) in [(" Carol@Example.com", &keys[3]), (&shown[0], &keys[0])] {
        let out = tool(
            Some(&db),
            &[
                "reset", "login", typed, "--reason", "ticket 1", "--by", "ann",
            ],
        );
        assert_exit(&out, 0, typed);
        assert!(
            limiter.check(&login, key).await.unwrap().is_allowed(),
            "{typed}"
        );
    }
}

/// Support staff block an account with a reason: the service refuses it
/// though it has no count, `status` and `locked` show the block's end; an
/// unblock ends it, once; `audit` lists every action, newest first, with
/// who and why. A block without a reason is a usage error and blocks
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_unblock_and_the_audit_trail() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = limit("login", 5);
    limiter.record([&login]).await.unwrap();
    let mallory = Key::email("mallory@example.com");
    let typed = "mallory@example.com";

    let out = tool(Some(&db), &["block", "login", typed, "--for", "1h"]);
    assert_exit(&out, 2, "a block without a reason");
    assert!(limiter.check(&login, &mallory).await.unwrap().is_allowed());

    let why = "ticket 7: credential stuffing";
    let block = [
        "block", "login", typed, "--for", "1h", "--reason", why, "--by", "ann",
    ];
    let out = tool(Some(&db), &block);
    assert_exit(&out, 0, "block");
    assert!(
        stdout(&out).starts_with("blocked login email|mallory@example.com until "),
        "{out:?}"
    );
    let verdict = limiter.check(&login, &mallory).await.unwrap();
    assert!(verdict.is_refused(), "{verdict:?}");
    let retry = verdict.retry_after().expect("a block reopens");
    assert!(
        retry > Duration::from_secs(3590) && retry <= Duration::from_secs(3602),
        "{retry:?}"
    );
    let text = stdout(&tool(Some(&db), &["status", typed]));
    assert!(text.contains("count: 0 of 5\nrefused: yes\n"), "{text}");
    assert!(text.contains("locked until: "), "{text}");
    let text = stdout(&tool(Some(&db), &["locked", "login"]));
    assert!(
        text.starts_with("email|mallory@example.com count 0 of 5 reopens "),
        "{text}"
    );

    let unblock = [
        "unblock",
        "login",
        typed,
        "--reason",
        "owner verified",
        "--by",
        "bob",
    ];
    assert_exit(&tool(Some(&db), &unblock), 0, "unblock");
    assert!(limiter.check(&login, &mallory).await.unwrap().is_allowed());
    let out = tool(Some(&db), &unblock);
    assert_exit(&out, 1, "nothing to unblock");
    assert!(stderr(&out).contains("nothing to unblock"), "{out:?}");

    for _ in 0..5 {
        limiter.failed(&login, &mallory).await.unwrap();
    }
    let unlock = [
        "reset",
        "login",
        typed,
        "--reason",
        "locked out at the desk",
        "--by",
        "carol",
    ];
    assert_exit(&tool(Some(&db), &unlock), 0, "reset");

    let out = tool(Some(&db), &["audit"]);
    assert_exit(&out, 0, "audit");
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    for (line, said) in lines.iter().zip([
        "carol unlock login email|mallory@example.com (1 windows): locked out at the desk",
        "bob unblock login email|mallory@example.com (0 windows): owner verified",
        "bob unblock login email|mallory@example.com (1 windows): owner verified",
        "ann block login email|mallory@example.com until ",
    ]) {
        assert!(line.contains(said), "{line:?} lacks {said:?}");
    }
    assert!(lines[3].ends_with(why), "{text}");
    let out = tool(Some(&db), &["audit", "login", "--at-most", "1"]);
    assert_eq!(stdout(&out).lines().count(), 1, "{out:?}");
}

/// `purge` runs until done and says how many rows went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_says_how_many_rows_went() {
    let db = fresh_db().await;
    let mut system = db.connect().await;
    db::old_rows(&mut system, 7).await;
    let out = tool(Some(&db), &["purge"]);
    assert_exit(&out, 0, "purge");
    assert_eq!(stdout(&out), "purged 7 rows\n");
}

/// A missing `DATABASE_URL`, a key of no known kind, a bad address, a limit
/// nobody recorded and a bad bound: each a clear error on stderr, 1 for an
/// error and 2 for a usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_clear_with_their_exit_codes() {
    let db = fresh_db().await;
    let out = tool(None, &["purge"]);
    assert_exit(&out, 1, "no DATABASE_URL");
    assert!(stderr(&out).contains("DATABASE_URL is not set"), "{out:?}");

    let out = tool(
        Some(&db),
        &[
            "reset", "login", "alice", "--reason", "ticket 1", "--by", "ann",
        ],
    );
    assert_exit(&out, 1, "a text in no form of key");
    for words in [
        "invalid key: type an email address",
        "an IP address",
        "user:bob",
    ] {
        assert!(stderr(&out).contains(words), "{words:?}: {out:?}");
    }

    let out = tool(
        Some(&db),
        &[
            "reset",
            "login",
            "ip:300.1.2.3",
            "--reason",
            "ticket 1",
            "--by",
            "ann",
        ],
    );
    assert_exit(&out, 1, "a bad address");
    assert!(stderr(&out).contains("IPv4 or IPv6 address"), "{out:?}");

    let out = tool(Some(&db), &["status", "login", "id:a"]);
    assert_exit(&out, 1, "no limit recorded");
    assert!(
        stderr(&out).contains("invalid limit \"login\": no limit of this name is recorded"),
        "{out:?}"
    );

    let limiter = Limiter::new(Postgres::new(db.config()));
    limiter.record([&limit("login", 1)]).await.unwrap();
    let out = tool(Some(&db), &["locked", "login", "--at-most", "0"]);
    assert_exit(&out, 1, "at most 0");
    assert!(stderr(&out).contains("invalid option at_most"), "{out:?}");

    for usage in [
        &["reset", "login", "id:a", "--reason", " ", "--by", "ann"][..],
        &["reset", "login", "id:a", "--reason", "x", "--by", ""],
        &[
            "reset", "login", "id:a", "--reason", "x", "--reason", "y", "--by", "ann",
        ],
        &["status", "login", "id:a", "--max", "1"],
        &["locked", "login", "--window", "1m"],
        &["reset", "--every-limit"],
        &["status"],
        &["locked"],
        &["frobnicate"],
        &[],
    ] {
        let out = tool(Some(&db), usage);
        assert_exit(&out, 2, &format!("{usage:?}"));
        assert!(stderr(&out).contains("usage: platformkit-limit"), "{out:?}");
    }
    let out = tool(None, &["--help"]);
    assert_exit(&out, 0, "--help");
    assert!(stdout(&out).contains("email:alice@example.com"));
    assert!(stdout(&out).contains("quote it for the shell"));
}

/// A window no test straddles (the suite's `LONG_WINDOW`).
const LONG_WINDOW: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// A limit over [`LONG_WINDOW`].
fn limit(name: &str, max: u32) -> platformkit_limit::Limit {
    platformkit_limit::Limit::new(name, max, LONG_WINDOW).expect("a valid limit")
}
