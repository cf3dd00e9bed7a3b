//! The admin page in a real browser: headless Chromium, against the
//! router served on 127.0.0.1 (a random port) over a throwaway PostgreSQL.
//!
//! Beside the router, on the same origin, the server has a route of its
//! own, `/harness`: a plain page (not an admin page, so its script runs)
//! that drives a flow as staff would, from the browser: it fetches the
//! admin pages, reads the tokens from their forms, adopts a form into
//! itself, fills it and submits it, and writes what the admin answered
//! into its own DOM as `<output>` elements. Chromium is run as
//!
//! ```text
//! chromium --headless=new --no-sandbox --disable-gpu --dump-dom \
//!     --virtual-time-budget=10000 --user-data-dir=<fresh> URL
//! ```
//!
//! and the tests read the DOM it dumps, then the database through the
//! library. Most forms are posted with `fetch` (`credentials:
//! 'same-origin'`, the form's fields as the browser encodes them), whose
//! answer the harness writes down; the block is a real submission
//! (`requestSubmit`), and the dump is the admin page the browser was sent
//! to. A submission after the harness has loaded leaves `--dump-dom`
//! waiting for good (most runs), so the block's is made while the page is
//! still loading, its lookup a synchronous `XMLHttpRequest`. A cross-site post is a page served by a second listener (another
//! port, another origin) that submits a form to the admin's routes: the
//! browser's own `Origin` and `Sec-Fetch-Site` must get a 403, and a log
//! of the server's requests shows what the browser sent.
//!
//! Chromium is `$CHROMIUM`, else the first of `chromium`,
//! `chromium-browser`, `google-chrome` on `PATH`. Without one, each test
//! prints why and passes (skipped, not failed), but under CI, where
//! `.ci/run` installs Chromium, it fails.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The suite's database helpers, shared with the library's tests.
#[path = "../../tests/common/db.rs"]
#[allow(dead_code, reason = "the suite's helpers; these tests use a few")]
mod db;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{Next, from_fn_with_state, map_request};
use axum::response::{Html, Response};
use axum::routing::get;
use db::fresh_db;
use platformkit_limit::{AuditAction, Key, Limit, Limiter, Postgres};
use platformkit_limit_admin as admin;
use tokio::net::TcpListener;
use tower::ServiceExt;

type PgLimiter = Limiter<Postgres<tokio_postgres::Config>>;

/// Where the service mounts the page.
const MOUNT: &str = "/support/limits";

/// Who the service's staff login says each request is from.
const STAFF: &str = "browser staff";

/// One browser at a time: the machine's cores are few.
static BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The staff member a request is from, as the service's login marks it.
#[derive(Clone)]
struct StaffMember(String);

/// The service's staff login, as these tests have it: every request is
/// from [`STAFF`] (a cross-site one too, as a session cookie would make it).
async fn signed_in(mut request: Request) -> Request {
    request
        .extensions_mut()
        .insert(StaffMember(STAFF.to_owned()));
    request
}

/// A request the server answered: what the browser sent, and the status.
#[derive(Clone, Debug)]
struct Logged {
    method: String,
    target: String,
    origin: String,
    site: String,
    status: u16,
}

type Log = Arc<Mutex<Vec<Logged>>>;

async fn record(State(log): State<Log>, request: Request, next: Next) -> Response {
    let (origin, site) = {
        let header = |name: &str| {
            let value = request.headers().get(name).and_then(|v| v.to_str().ok());
            value.unwrap_or_default().to_owned()
        };
        (header("origin"), header("sec-fetch-site"))
    };
    let (method, target) = (request.method().to_string(), request.uri().to_string());
    let response = next.run(request).await;
    let status = response.status().as_u16();
    log.lock().unwrap().push(Logged {
        method,
        target,
        origin,
        site,
        status,
    });
    response
}

/// The service on 127.0.0.1: the admin router of `limits`, with
/// `Admin::staff` reading the login's mark, and the harness.
struct Served {
    /// `http://127.0.0.1:port`.
    origin: String,
    /// The same service, to ask without the browser (a token for the
    /// attacker's page).
    app: Router,
    log: Log,
}

async fn serve(limiter: &Arc<PgLimiter>, limits: &[Limit]) -> Served {
    let support = admin::Admin::new(limiter.clone(), limits.to_vec())
        .staff(|request| request.extensions.get::<StaffMember>().map(|s| s.0.clone()))
        .router()
        .expect("an admin router");
    let log = Log::default();
    let app = Router::new()
        .nest_service(MOUNT, support)
        .route("/harness", get(|| async { Html(HARNESS) }))
        .layer(map_request(signed_in))
        .layer(from_fn_with_state(log.clone(), record));
    let origin = listen(app.clone()).await;
    Served { origin, app, log }
}

/// Serves `app` on 127.0.0.1, a random port: its origin.
async fn listen(app: Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

/// The Chromium to run, if there is one.
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CHROMIUM") {
        return Some(path.into());
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// The Chromium to run, or `None` after saying the test is skipped; under
/// CI (`CI` set, as `.ci/run` sets it after installing Chromium) a missing
/// Chromium fails the test.
fn chromium_or_skip(test: &str) -> Option<PathBuf> {
    let found = chromium();
    assert!(
        found.is_some() || std::env::var_os("CI").is_none(),
        "{test}: no Chromium found, and CI must run the browser's tests"
    );
    if found.is_none() {
        println!(
            "{test}: skipped, no Chromium found (none of chromium, chromium-browser, \
             google-chrome on PATH, and CHROMIUM is not set)"
        );
    }
    found
}

/// A profile directory of its own for one run, removed after it.
struct Profile(PathBuf);

impl Profile {
    fn new() -> Profile {
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "platformkit-limit-admin-browser-{}-{run}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Profile(dir)
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The DOM of `url` once Chromium has run its scripts and followed its
/// navigations, as it dumps it.
async fn dump_dom(chromium: &Path, url: &str) -> String {
    let _one_at_a_time = BROWSER.lock().await;
    let profile = Profile::new();
    let output = tokio::process::Command::new(chromium)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            // No calls out of a closed network, none at start-up either.
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--dump-dom",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.0.display()))
        .arg(url)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output)
        .await
        .unwrap_or_else(|_| panic!("Chromium did not finish with {url}"))
        .expect("Chromium runs");
    let dom = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success() && !dom.is_empty(),
        "Chromium with {url}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    dom
}

/// What a browser shows of serialized text: its character references
/// resolved.
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

/// What the harness wrote as `name`, each time: its tab-separated fields.
fn said(dom: &str, name: &str) -> Vec<Vec<String>> {
    let open = format!("<output class=\"{name}\">");
    dom.split(&open)
        .skip(1)
        .map(|rest| {
            let text = unescape(&rest[..rest.find("</output>").unwrap()]);
            text.split('\t').map(str::to_owned).collect()
        })
        .collect()
}

/// The harness ran to its end: no script error.
#[track_caller]
fn assert_harness_done(dom: &str) {
    assert!(said(dom, "error").is_empty(), "the harness failed: {dom}");
    assert_eq!(said(dom, "done"), [["yes"]], "{dom}");
}

/// The text of each key cell of a page's refused keys, as the browser
/// parsed the page.
fn key_cells(dom: &str) -> Vec<String> {
    dom.split("<td class=\"key\">")
        .skip(1)
        .map(|cell| unescape(&cell[..cell.find("</td>").unwrap()]))
        .collect()
}

/// The address of the harness running `scenario` on `served`, with `query`.
fn harness(served: &Served, scenario: &str, query: &[(&str, &str)]) -> String {
    let mut url = format!("{}/harness?scenario={scenario}", served.origin);
    for (name, value) in query {
        url.push_str(&format!("&{}={}", urlencode(name), urlencode(value)));
    }
    url
}

fn urlencode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(byte));
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// Escaped for an HTML attribute.
fn attribute(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

async fn fail(limiter: &PgLimiter, limit: &Limit, key: &Key, times: u32) {
    for _ in 0..times {
        limiter.failed(limit, key).await.unwrap();
    }
}

fn limiter_on(config: tokio_postgres::Config) -> Arc<PgLimiter> {
    Arc::new(
        Limiter::builder(Postgres::new(config))
            .budget(Duration::from_secs(10))
            .build()
            .unwrap(),
    )
}

/// A limit over a window no test straddles.
fn limit(name: &str, max: u32) -> Limit {
    Limit::new(name, max, Duration::from_secs(30 * 24 * 60 * 60)).expect("a valid limit")
}

/// The browser renders a limit's page with each key as its row shows it
/// and no two alike (a zero-width space, a right-to-left override, a
/// trailing space written out), a key that holds markup as text, no
/// script; typed as the page shows it, each key is found with its count,
/// and an address typed alone is the service's key of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_browser_shows_keys_apart_and_finds_them_as_typed() {
    let Some(chromium) = chromium_or_skip("the_browser_shows_keys_apart_and_finds_them_as_typed")
    else {
        return;
    };
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 2);
    let email = |text: &str| Key::new(["email", text]).unwrap();
    let keys = [
        Key::email("alice@example.com"),
        email("alice@example.com\u{200B}"),
        email("\u{202E}moc.elpmaxe@ecila"),
        email("alice@example.com "),
        Key::username("<script>alert(1)</script>"),
        Key::ip("203.0.113.7".parse().unwrap()),
        Key::ip("2001:db8:1:2::9".parse().unwrap()),
    ];
    for key in &keys {
        fail(&limiter, &login, key, 2).await;
    }
    let served = serve(&limiter, std::slice::from_ref(&login)).await;

    // The admin page itself, as the browser parsed it.
    let page = dump_dom(&chromium, &format!("{}{MOUNT}/login", served.origin)).await;
    assert!(page.contains("Refused now (7)"), "{page}");
    assert!(!page.contains("<script"), "no script: {page}");
    let mut shown = key_cells(&page);
    shown.sort();
    let mut spelled: Vec<String> = keys.iter().map(Key::spelling).collect();
    spelled.sort();
    assert_eq!(shown, spelled, "each key as its row shows it");
    shown.dedup();
    assert_eq!(shown.len(), keys.len(), "no two alike: {shown:?}");
    for written in [
        "email|alice@example.com\\u{200b}",
        "email|\\u{202e}moc.elpmaxe@ecila",
        "user|<script>alert(1)</script>",
    ] {
        assert!(
            shown.iter().any(|key| key == written),
            "{written}: {shown:?}"
        );
    }

    // The harness types each key as the page shows it, then addresses
    // alone.
    let url = harness(
        &served,
        "spelling",
        &[
            ("limit", "login"),
            ("typed", "203.0.113.7"),
            ("typed", "2001:db8:1:2::9"),
            ("typed", " Alice@Example.COM "),
        ],
    );
    let dom = dump_dom(&chromium, &url).await;
    assert_harness_done(&dom);
    let mut listed: Vec<String> = said(&dom, "shown").into_iter().flatten().collect();
    listed.sort();
    assert_eq!(listed, spelled, "the harness read the same rows");
    let found = said(&dom, "found");
    assert_eq!(found.len(), keys.len() + 3, "{dom}");
    for row in &found[..keys.len()] {
        let [typed, status, shown, count] = &row[..] else {
            panic!("{row:?}")
        };
        assert_eq!(
            (status.as_str(), shown, count.as_str()),
            ("200", typed, "2 / 2"),
            "typed as shown: {row:?}"
        );
    }
    for (row, key) in found[keys.len()..]
        .iter()
        .zip([&keys[5], &keys[6], &keys[0]])
    {
        assert_eq!(
            row[1..],
            ["200".to_owned(), key.spelling(), "2 / 2".to_owned()],
            "typed alone: {row:?}"
        );
    }
}

/// In the browser, staff look an address up under every limit (typed
/// alone, on the index), unlock it under every limit from the index's
/// form, and unlock a key under one limit from its lookup's form: each
/// with a reason typed, each a real unlock in the database, audited with
/// the staff member the service's login names and the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_browser_looks_a_key_up_across_limits_and_unlocks_it() {
    let Some(chromium) =
        chromium_or_skip("the_browser_looks_a_key_up_across_limits_and_unlocks_it")
    else {
        return;
    };
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 5);
    let per_address = limit("login-per-address", 2);
    let limits = [login.clone(), per_address.clone()];
    let address = Key::ip("203.0.113.7".parse().unwrap());
    let alice = Key::email("alice@example.com");
    fail(&limiter, &login, &address, 1).await;
    fail(&limiter, &per_address, &address, 2).await;
    fail(&limiter, &login, &alice, 5).await;
    let served = serve(&limiter, &limits).await;

    let url = harness(
        &served,
        "support",
        &[
            ("address", "203.0.113.7"),
            ("reason-all", "shared office address, ticket 88"),
            ("limit", "login"),
            ("key", &alice.spelling()),
            ("reason-one", "verified by phone"),
        ],
    );
    let dom = dump_dom(&chromium, &url).await;
    assert_harness_done(&dom);
    assert_eq!(said(&dom, "across-status"), [["200"]]);
    assert_eq!(
        said(&dom, "across"),
        [
            ["login", "1 / 5", "allowed"],
            ["login-per-address", "2 / 2", "refused"]
        ],
        "{dom}"
    );
    assert_eq!(
        said(&dom, "unlock-all"),
        [[
            "200",
            "Unlocked under every limit: login: 1 window; login-per-address: 1 window."
        ]],
        "{dom}"
    );
    let one = said(&dom, "unlock-one");
    assert_eq!(one.len(), 1, "{dom}");
    assert_eq!(one[0][0], "200", "{dom}");
    assert_eq!(
        one[0][1],
        format!("{}{MOUNT}/login?unlocked", served.origin),
        "followed the 303"
    );
    assert!(one[0][2].starts_with("Unlocked"), "{one:?}");

    for limit in &limits {
        assert!(limiter.check(limit, &address).await.unwrap().is_allowed());
    }
    assert!(limiter.check(&login, &alice).await.unwrap().is_allowed());
    let mut audit: Vec<(String, String, String, String)> = limiter
        .audit(None, 10)
        .await
        .unwrap()
        .into_iter()
        .inspect(|entry| assert_eq!(entry.action(), AuditAction::Unlock))
        .map(|e| {
            let (by, limit, key) = (e.by().to_owned(), e.limit().to_owned(), e.key().to_owned());
            (limit, key, by, e.reason().to_owned())
        })
        .collect();
    audit.sort();
    let entry = |limit: &Limit, key: &Key, why: &str| {
        let (limit, key) = (limit.name().to_owned(), key.as_str().to_owned());
        (limit, key, STAFF.to_owned(), why.to_owned())
    };
    let everywhere = "shared office address, ticket 88";
    assert_eq!(
        audit,
        [
            entry(&login, &alice, "verified by phone"),
            entry(&login, &address, everywhere),
            entry(&per_address, &address, everywhere),
        ]
    );

    // The browser's own requests: same-origin, and each answered.
    let log = served.log.lock().unwrap().clone();
    let posts: Vec<(&str, &str, &str, u16)> = log
        .iter()
        .filter(|r| r.method == "POST" && r.target.ends_with("/unlock"))
        .map(|r| {
            (
                r.target.as_str(),
                r.origin.as_str(),
                r.site.as_str(),
                r.status,
            )
        })
        .collect();
    let origin = served.origin.as_str();
    assert_eq!(
        posts,
        [
            ("/support/limits/~all/unlock", origin, "same-origin", 200),
            ("/support/limits/login/unlock", origin, "same-origin", 303),
        ]
    );
}

/// In the browser, staff block a key from its lookup on a limit's page:
/// the harness adopts the page's Block form, chooses a day, types a
/// reason and submits it; the browser follows the 303 to the limit's
/// page, which says the key is blocked and shows the audit entry. The
/// service refuses the key (a limiter of its own over the same database
/// too) for a day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_browser_blocks_a_key_from_the_page() {
    let Some(chromium) = chromium_or_skip("the_browser_blocks_a_key_from_the_page") else {
        return;
    };
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let replica = limiter_on(db.config());
    let login = limit("login", 5);
    let mallory = Key::email("mallory@example.com");
    let served = serve(&limiter, std::slice::from_ref(&login)).await;

    let before = SystemTime::now();
    let why = "credential stuffing from <this> & that";
    let url = harness(
        &served,
        "block",
        &[
            ("limit", "login"),
            ("key", "Mallory@Example.com"),
            ("for", "86400"),
            ("reason", why),
        ],
    );
    let dom = dump_dom(&chromium, &url).await;
    assert!(said(&dom, "error").is_empty(), "{dom}");
    assert!(dom.contains("<title>login · rate limits</title>"), "{dom}");
    assert!(
        dom.contains("<p class=\"notice ok\">Blocked: the limit refuses the key"),
        "{dom}"
    );
    let audit = &dom[dom.find("<h2>Audit</h2>").expect("the audit")..];
    for shown in [
        STAFF,
        "block",
        &mallory.spelling(),
        "credential stuffing from &lt;this&gt; &amp; that",
    ] {
        assert!(audit.contains(shown), "{shown}: {audit}");
    }

    for limiter in [&limiter, &replica] {
        assert!(limiter.check(&login, &mallory).await.unwrap().is_refused());
    }
    let until = replica
        .status(&login, &mallory)
        .await
        .unwrap()
        .locked_until()
        .expect("blocked");
    let lasts = until.duration_since(before).unwrap().as_secs();
    assert!((86_390..=86_410).contains(&lasts), "a day: {lasts} s");
    let entries = limiter.audit(Some(&login), 10).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(
        (
            entries[0].action(),
            entries[0].by(),
            entries[0].key(),
            entries[0].reason()
        ),
        (AuditAction::Block, STAFF, mallory.as_str(), why)
    );

    // A form submission: the browser navigated, with its own headers.
    let log = served.log.lock().unwrap().clone();
    let post = log
        .iter()
        .find(|r| r.method == "POST" && r.target == format!("{MOUNT}/login/block"))
        .unwrap_or_else(|| panic!("no block posted: {log:?}"));
    assert_eq!(
        (post.origin.as_str(), post.site.as_str(), post.status),
        (served.origin.as_str(), "same-origin", 303)
    );
    assert!(
        log.iter()
            .any(|r| r.method == "GET" && r.target == format!("{MOUNT}/login?blocked")),
        "{log:?}"
    );
}

/// A page of another origin that makes the staff member's browser post
/// the admin's Block form (a cross-site page: `localhost`, not
/// `127.0.0.1`) or Unlock form (the same host, another port), with a
/// token that is good: the browser's own `Origin` and `Sec-Fetch-Site`
/// get a 403 page, and nothing is blocked or unlocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_form_post_is_refused_in_the_browser() {
    let Some(chromium) = chromium_or_skip("a_cross_site_form_post_is_refused_in_the_browser")
    else {
        return;
    };
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 2);
    let alice = Key::email("alice@example.com");
    let mallory = Key::email("mallory@example.com");
    fail(&limiter, &login, &alice, 2).await;
    let served = serve(&limiter, std::slice::from_ref(&login)).await;

    for (what, key, host, done) in [
        ("block", &mallory, "localhost", "blocked"),
        ("unlock", &alice, "127.0.0.1", "unlocked"),
    ] {
        // A token the admin issued: only the headers can refuse the post.
        let (action, token) = token_of(&served.app, &served.origin, key, what).await;
        let target = format!("{}{action}", served.origin);
        let page = format!(
            "<!doctype html><html><body><h1>A prize</h1>\
             <form method=\"post\" action=\"{target}\">\
             <input type=\"hidden\" name=\"key\" value=\"{key}\">\
             <input type=\"hidden\" name=\"token\" value=\"{token}\">\
             <input type=\"hidden\" name=\"for\" value=\"2592000\">\
             <input type=\"hidden\" name=\"reason\" value=\"prize\">\
             </form><script>document.forms[0].submit()</script></body></html>",
            target = attribute(&target),
            key = attribute(key.as_str()),
            token = attribute(&token),
        );
        let attacker = Router::new().route(
            "/",
            get(move || {
                let page = page.clone();
                async move { Html(page) }
            }),
        );
        let attacker = listen(attacker).await.replace("127.0.0.1", host);
        let dom = dump_dom(&chromium, &format!("{attacker}/")).await;
        assert!(
            dom.contains(&format!("Forbidden: not {done}")),
            "{what}: {dom}"
        );
        assert!(
            dom.contains(&format!("Nothing was {done}")),
            "{what}: {dom}"
        );

        let log = served.log.lock().unwrap().clone();
        let post = log
            .iter()
            .find(|r| r.method == "POST" && r.target == action)
            .unwrap_or_else(|| panic!("{what}: the browser posted nothing: {log:?}"));
        let site = if host == "localhost" {
            "cross-site"
        } else {
            "same-site"
        };
        assert_eq!(
            (post.origin.as_str(), post.site.as_str(), post.status),
            (attacker.as_str(), site, 403),
            "{what}"
        );
    }
    let alices = limiter.status(&login, &alice).await.unwrap();
    assert_eq!(alices.count(), 2, "not unlocked");
    assert!(limiter.check(&login, &alice).await.unwrap().is_refused());
    assert!(limiter.check(&login, &mallory).await.unwrap().is_allowed());
    assert!(
        limiter.audit(None, 10).await.unwrap().is_empty(),
        "nothing done"
    );
}

/// The action and token of `key`'s `what` form (`block`, `unlock`) under
/// `login`, as the admin renders its lookup for `origin`.
async fn token_of(app: &Router, origin: &str, key: &Key, what: &str) -> (String, String) {
    let request = axum::http::Request::post(format!("{MOUNT}/login"))
        .header("host", origin.trim_start_matches("http://"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from(format!("key={}", urlencode(&key.spelling()))))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let body = String::from_utf8(body.to_vec()).unwrap();
    let action = format!("{MOUNT}/login/{what}");
    let form = &body[body
        .find(&format!("action=\"{action}\""))
        .unwrap_or_else(|| panic!("no {what} form: {body}"))..];
    let start = form.find("name=\"token\" value=\"").unwrap() + 20;
    let token = &form[start..start + form[start..].find('"').unwrap()];
    (action, token.to_owned())
}

/// The harness: a plain page of the service's own origin, whose script
/// drives one scenario (`?scenario=`) against the admin pages and writes
/// what they answered into `<output class="…">` elements, fields split by
/// tabs, then `done` (or `error`).
const HARNESS: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>admin harness</title></head>
<body><h1>admin harness</h1>
<script>
const MOUNT = '/support/limits';
const params = new URLSearchParams(location.search);

function say(name, ...fields) {
  const out = document.createElement('output');
  out.className = name;
  out.textContent = fields.join('\t');
  document.body.append(out, document.createElement('br'));
}

const parse = (text) => new DOMParser().parseFromString(text, 'text/html');

async function answer(response) {
  return { status: response.status, url: response.url, doc: parse(await response.text()) };
}

const get = async (path) => answer(await fetch(path, { credentials: 'same-origin' }));

// A POST of urlencoded fields, as a form sends them; a 303 followed.
const post = async (path, fields) => answer(await fetch(path, {
  method: 'POST',
  body: new URLSearchParams(fields),
  credentials: 'same-origin',
}));

// An admin page's form, adopted into this page, its fields filled in.
function adopt(form, fields) {
  const own = document.importNode(form, true);
  document.body.append(own);
  for (const [name, value] of Object.entries(fields)) {
    own.elements[name].value = value;
  }
  return own;
}

// A form posted as the browser encodes it (its token read from it).
const send = (form) => post(form.action, new FormData(form));

const notice = (doc) => (doc.querySelector('p.notice') || {}).textContent || '';
const cells = (row) => [...row.querySelectorAll('td')].map((td) => td.textContent);
const keyCells = (doc) => [...doc.querySelectorAll('td.key:not(.audited)')];

// Each key of a limit's page typed as its row shows it, then the texts
// typed alone: what each lookup finds (the lookup's row comes first).
async function spelling() {
  const limit = params.get('limit');
  const page = await get(`${MOUNT}/${limit}`);
  const shown = keyCells(page.doc).map((td) => td.textContent);
  say('shown', ...shown);
  for (const typed of shown.concat(params.getAll('typed'))) {
    const looked = await post(`${MOUNT}/${limit}`, { key: typed });
    const row = keyCells(looked.doc)[0];
    say('found', typed, looked.status, ...cells(row.parentElement).slice(0, 2));
  }
}

// A lookup across limits, the unlock under every limit, one limit's
// unlock of a key typed as its row shows it.
async function support() {
  const across = await post(MOUNT, { key: params.get('address') });
  say('across-status', across.status);
  for (const cell of across.doc.querySelectorAll('td.limit')) {
    say('across', ...cells(cell.parentElement).slice(0, 3));
  }
  const everywhere = across.doc.querySelector('form[action$="/~all/unlock"]');
  const unlocked = await send(adopt(everywhere, { reason: params.get('reason-all') }));
  say('unlock-all', unlocked.status, notice(unlocked.doc));

  const limit = params.get('limit');
  const page = await get(`${MOUNT}/${limit}`);
  const row = keyCells(page.doc).find((td) => td.textContent === params.get('key'));
  const looked = await post(`${MOUNT}/${limit}`, { key: row.textContent });
  const form = looked.doc.querySelector('form[action$="/unlock"]');
  const done = await send(adopt(form, { reason: params.get('reason-one') }));
  say('unlock-one', done.status, done.url, notice(done.doc));
}

// A POST as `post` sends it, answered before the page goes on loading.
function postNow(path, fields) {
  const request = new XMLHttpRequest();
  request.open('POST', path, false);
  request.send(new URLSearchParams(fields));
  return { status: request.status, doc: parse(request.responseText) };
}

// A block, submitted as a form: the browser goes to the answer. While the
// page is still loading (a navigation after it has loaded leaves
// Chromium's --dump-dom waiting for good), so the lookup is synchronous.
function block() {
  const limit = params.get('limit');
  const looked = postNow(`${MOUNT}/${limit}`, { key: params.get('key') });
  const form = adopt(looked.doc.querySelector('form[action$="/block"]'), {
    for: params.get('for'),
    reason: params.get('reason'),
  });
  form.requestSubmit();
  return Promise.resolve();
}

const scenarios = { spelling, support, block };
scenarios[params.get('scenario')]().then(
  () => say('done', 'yes'),
  (e) => say('error', String((e && e.stack) || e)),
);
</script>
</body></html>
"#;
