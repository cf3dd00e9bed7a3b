//! The admin page, over HTTP against a real server, mounted as its docs
//! show: a limit's page lists exactly its refused keys, each shown as it
//! is typed and none like another; a lookup, a POST, shows a key's count;
//! Unlock with the page's token and same-origin header fields resets the
//! key (a digested one too) and answers 303; a cross-site POST
//! (`Sec-Fetch-Site`, a foreign `Origin` or scheme, a missing, wrong,
//! foreign or expired token) is a 403 that resets nothing; a hostile key
//! renders as text; the index answers with or without a trailing slash;
//! an unknown limit is a 404; a store that does not answer is a page that
//! says so; every answer carries the security header fields. Block and
//! Unblock refuse a key and end it for every limiter over the store; every
//! action is audited with the staff member `Admin::staff` names and the
//! reason typed, which is required; a token acts only as its own form's;
//! a cross-site block is a 403; the audit is shown, escaped.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The suite's database helpers, shared with the library's tests.
#[path = "../../tests/common/db.rs"]
#[allow(dead_code, reason = "the suite's helpers; these tests use a few")]
mod db;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use db::{fresh_db, nothing_listens};
use platformkit_limit::{
    AuditAction, ErrorKind, Key, Limit, Limiter, ManualClock, Memory, Postgres,
};
use platformkit_limit_admin as admin;
use tower::ServiceExt;

type PgLimiter = Limiter<Postgres<tokio_postgres::Config>>;

/// Where the tests mount the page, as a service would.
const MOUNT: &str = "/support/limits";
/// The host the requests are sent to.
const HOST: &str = "staff.example:8443";

fn limiter_on(config: tokio_postgres::Config) -> Arc<PgLimiter> {
    Arc::new(
        Limiter::builder(Postgres::new(config))
            .budget(PATIENT)
            .build()
            .unwrap(),
    )
}

/// The service: the admin router of `limits`, [`mounted`].
fn app(limiter: &Arc<PgLimiter>, limits: &[Limit]) -> Router {
    mounted(admin::router(limiter.clone(), limits.to_vec()).expect("an admin router"))
}

/// A service with `admin` under [`MOUNT`], as the crate's docs mount it.
fn mounted(admin: Router) -> Router {
    Router::new().nest_service(MOUNT, admin)
}

/// An answer: its status, its header fields, its body.
struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn send(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    Answer {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

async fn get(app: &Router, path: &str) -> Answer {
    let request = Request::get(path)
        .header("host", HOST)
        .body(Body::empty())
        .unwrap();
    send(app, request).await
}

/// A POST of the urlencoded `form` with `fields`.
async fn post(app: &Router, path: &str, fields: &[(&str, &str)], form: &[(&str, &str)]) -> Answer {
    let mut request = Request::post(path)
        .header("host", HOST)
        .header("content-type", "application/x-www-form-urlencoded");
    for (name, value) in fields {
        request = request.header(*name, *value);
    }
    let body = form
        .iter()
        .map(|(name, value)| format!("{}={}", urlencode(name), urlencode(value)))
        .collect::<Vec<_>>()
        .join("&");
    send(app, request.body(Body::from(body)).unwrap()).await
}

/// Header fields or form fields, by name.
type Fields<'a> = &'a [(&'a str, &'a str)];

/// What a browser sends with a form posted from the page itself.
const SAME_ORIGIN: &[(&str, &str)] = &[
    ("sec-fetch-site", "same-origin"),
    ("origin", "https://staff.example:8443"),
];

/// The reason the tests' forms give.
const REASON: &str = "ticket 4121";

/// The header field the tests' staff login sets: who the request is from.
const STAFF: &str = "x-staff";

/// The service with the admin router of `limits`, whose `Admin::staff`
/// reads the staff member from the header field the service's login sets.
fn staffed_app(limiter: &Arc<PgLimiter>, limits: &[Limit]) -> Router {
    let staff = |request: &axum::http::request::Parts| {
        let name = request.headers.get(STAFF)?.to_str().ok()?;
        Some(name.to_owned())
    };
    mounted(
        admin::Admin::new(limiter.clone(), limits.to_vec())
            .staff(staff)
            .router()
            .expect("an admin router"),
    )
}

/// What a browser sends with a form posted from the page by staff member
/// `who`, behind the service's login.
fn as_staff(who: &str) -> [(&str, &str); 3] {
    [SAME_ORIGIN[0], SAME_ORIGIN[1], (STAFF, who)]
}

/// Where a 303 sends the browser.
fn location(answer: &Answer) -> &str {
    answer
        .headers
        .get("location")
        .expect("a location")
        .to_str()
        .unwrap()
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

/// What a browser makes of an attribute's character references.
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// Each Unlock form of a page: its action, key and token, as a browser
/// would post them.
fn unlock_forms(body: &str) -> Vec<(String, String, String)> {
    forms(body, "unlock")
}

/// Each form of a page that posts to a path ending in `/{what}` (`unlock`,
/// `block`, `unblock`): its action, key and token.
fn forms(body: &str, what: &str) -> Vec<(String, String, String)> {
    let attribute = |from: &str, name: &str| -> String {
        let start = from.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
        let end = start + from[start..].find('"').unwrap();
        unescape(&from[start..end])
    };
    body.split("<form method=\"post\"")
        .skip(1)
        .map(|form| &form[..form.find("</form>").unwrap()])
        // Not the lookup's, which has no token.
        .filter_map(|form| {
            let token_at = form.find("name=\"token\"")?;
            let key_at = form.find("name=\"key\"").unwrap();
            Some((
                attribute(form, "action"),
                attribute(&form[key_at..], "value"),
                attribute(&form[token_at..], "value"),
            ))
        })
        .filter(|(action, _, _)| action.ends_with(&format!("/{what}")))
        .collect()
}

/// The Unlock form of `stored_key` on the page.
fn unlock_form(body: &str, stored_key: &str) -> (String, String) {
    let (action, _, token) = unlock_forms(body)
        .into_iter()
        .find(|(_, key, _)| key == stored_key)
        .unwrap_or_else(|| panic!("no Unlock form for {stored_key:?} in {body}"));
    (action, token)
}

/// The listed keys of a page, in order.
fn listed(body: &str) -> Vec<String> {
    let section = &body[body.find("Refused now").expect("the refused keys' section")..];
    unlock_forms(section)
        .into_iter()
        .map(|(_, key, _)| key)
        .collect()
}

/// The rows of each audit table of a part of a page, newest first: each
/// cell's text.
fn audit_rows(part: &str) -> Vec<Vec<String>> {
    part.split("<tr class=\"entry\">")
        .skip(1)
        .map(|row| {
            row[..row.find("</tr>").unwrap()]
                .split("</td>")
                .filter(|cell| !cell.is_empty())
                .map(text)
                .collect()
        })
        .collect()
}

/// The keys a part of a page shows, as a browser shows them: the text of
/// each key's cell.
fn shown_keys(part: &str) -> Vec<String> {
    part.split("<td class=\"key\"")
        .skip(1)
        .map(|cell| {
            let text = &cell[cell.find('>').unwrap() + 1..];
            unescape(&text[..text.find("</td>").unwrap()])
        })
        .collect()
}

/// The answer to looking `typed` up on `limit`'s page, as the page's
/// lookup form sends it: a POST, the key in the body.
async fn look_up(app: &Router, limit: &str, typed: &str) -> Answer {
    post(app, &format!("{MOUNT}/{limit}"), &[], &[("key", typed)]).await
}

/// The part of a limit's page above the refused keys: the lookup and its
/// answer.
fn lookup_part(body: &str) -> &str {
    &body[..body.find("Refused now").expect("the refused keys' section")]
}

/// The answer to looking `typed` up under every limit, as the index's
/// lookup form sends it: a POST to the index, the key in the body.
async fn look_up_everywhere(app: &Router, typed: &str) -> Answer {
    post(app, MOUNT, &[], &[("key", typed)]).await
}

/// What a browser shows of a part of a page: its text, without markup.
fn text(part: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in part.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    unescape(&out)
}

/// The rows of a key's status under every limit: each cell's text, the
/// limit's name first.
fn every_limit_rows(body: &str) -> Vec<Vec<String>> {
    body.split("<td class=\"limit\">")
        .skip(1)
        .map(|row| {
            row[..row.find("</tr>").unwrap()]
                .split("</td>")
                .filter(|cell| !cell.is_empty())
                .map(text)
                .collect()
        })
        .collect()
}

/// The first three cells of each row of [`every_limit_rows`]: the limit,
/// the count of its max, whether it refuses the key.
fn every_limit_verdicts(body: &str) -> Vec<[String; 3]> {
    every_limit_rows(body)
        .into_iter()
        .map(|row| [row[0].clone(), row[1].clone(), row[2].clone()])
        .collect()
}

/// The key the index shows under every limit, as a browser shows it.
fn key_under_every_limit(body: &str) -> String {
    let start = body.find("<code class=\"key\">").expect("a key looked up") + 18;
    unescape(&body[start..start + body[start..].find("</code>").unwrap()])
}

/// The text of the page's notice of success.
fn notice(body: &str) -> String {
    let start = body.find("<p class=\"notice ok\">").expect("a notice");
    text(&body[start..start + body[start..].find("</p>").unwrap()])
}

#[track_caller]
fn assert_secured(answer: &Answer, what: &str) {
    let field = |name| answer.headers.get(name).and_then(|v| v.to_str().ok());
    assert_eq!(field("cache-control"), Some("no-store"), "{what}");
    assert_eq!(field("x-content-type-options"), Some("nosniff"), "{what}");
    assert_eq!(field("x-frame-options"), Some("DENY"), "{what}");
    // Not `no-referrer`, under which a browser posts the page's forms
    // with `Origin: null`, which the guard refuses.
    assert_eq!(field("referrer-policy"), Some("same-origin"), "{what}");
    let policy = field("content-security-policy").unwrap_or_default();
    for directive in [
        "default-src 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(policy.contains(directive), "{what}: {policy}");
    }
    assert!(!policy.contains("script-src"), "{what}: {policy}");
}

async fn fail(limiter: &PgLimiter, limit: &Limit, key: &Key, times: u32) {
    for _ in 0..times {
        limiter.failed(limit, key).await.unwrap();
    }
}

/// The index lists the limits given; a limit's page lists the keys it
/// refuses now, and none that it does not refuse, nor another limit's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limits_page_lists_exactly_its_refused_keys() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 2);
    let reset_password = limit("reset-password", 2);
    // A limit the page was not given, whose name starts like `login`'s.
    let login2 = limit("login2", 1);
    let app = app(&limiter, &[login.clone(), reset_password.clone()]);

    fail(&limiter, &login, &Key::email("Alice@Example.com"), 2).await;
    fail(&limiter, &login, &Key::username("bob"), 3).await;
    fail(&limiter, &login, &Key::email("carol@example.com"), 1).await;
    fail(
        &limiter,
        &reset_password,
        &Key::email("dave@example.com"),
        2,
    )
    .await;
    fail(&limiter, &login2, &Key::email("erin@example.com"), 1).await;

    let index = get(&app, MOUNT).await;
    assert_eq!(index.status, StatusCode::OK);
    assert_secured(&index, "the index");
    assert!(
        index
            .body
            .contains(r#"<a href="/support/limits/login">login</a>"#),
        "{}",
        index.body
    );
    assert!(
        index
            .body
            .contains(r#"<a href="/support/limits/reset-password">reset-password</a>"#)
    );
    assert!(index.body.contains("30 d"), "the window: {}", index.body);
    assert!(!index.body.contains("login2"));

    let page = get(&app, &format!("{MOUNT}/login")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_secured(&page, "a limit's page");
    assert_eq!(
        page.headers.get("content-type").unwrap(),
        "text/html; charset=utf-8"
    );
    // Newest first: one window, so the highest count first.
    assert_eq!(listed(&page.body), ["user|bob", "email|alice@example.com"]);
    assert!(page.body.contains("Refused now (2)"), "{}", page.body);
    assert!(page.body.contains("3 / 2") && page.body.contains("2 / 2"));
    for absent in ["carol", "dave", "erin"] {
        assert!(
            !page.body.contains(absent),
            "{absent} is not refused by login"
        );
    }

    let other = get(&app, &format!("{MOUNT}/reset-password")).await;
    assert_eq!(listed(&other.body), ["email|dave@example.com"]);
}

/// A key typed as `kind:value` shows its status, counted or not; a text
/// that is no key is said to be none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looking_up_a_key_shows_its_count() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 3);
    let app = app(&limiter, std::slice::from_ref(&login));
    fail(&limiter, &login, &Key::email("carol@example.com"), 1).await;
    fail(
        &limiter,
        &login,
        &Key::ip("203.0.113.7".parse().unwrap()),
        2,
    )
    .await;

    let carol = look_up(&app, "login", "email: Carol@Example.COM").await;
    assert_eq!(carol.status, StatusCode::OK);
    let lookup = &carol.body[..carol.body.find("Refused now").unwrap()];
    assert!(lookup.contains("email|carol@example.com"), "{}", carol.body);
    assert!(lookup.contains("1 / 3"), "{}", carol.body);
    assert_eq!(
        unlock_forms(lookup).len(),
        1,
        "a counted key can be cleared"
    );
    assert!(listed(&carol.body).is_empty(), "carol is not refused");

    let ip = look_up(&app, "login", "ip:203.0.113.7").await;
    let lookup = &ip.body[..ip.body.find("Refused now").unwrap()];
    assert!(
        lookup.contains("ip|203.0.113.7") && lookup.contains("2 / 3"),
        "{}",
        ip.body
    );

    let untouched = look_up(&app, "login", "user:nobody").await;
    let lookup = &untouched.body[..untouched.body.find("Refused now").unwrap()];
    assert!(
        lookup.contains("user|nobody") && lookup.contains("0 / 3"),
        "{}",
        untouched.body
    );
    assert!(unlock_forms(lookup).is_empty(), "nothing to clear");

    for nonsense in ["carol", "phone:123", "ip:not-an-address"] {
        let answer = look_up(&app, "login", nonsense).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{nonsense}");
        assert!(answer.body.contains("Not a key: "), "{}", answer.body);
    }
}

/// A lookup keeps the address out of the page's URL, so out of access
/// logs and the browser's history: the page's lookup form is a POST to the
/// limit's page, whose answer shows the key's status; a GET of the page
/// looks up no key, whatever its query says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_keeps_the_address_out_of_the_url() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 3);
    let app = app(&limiter, std::slice::from_ref(&login));
    let carol = Key::email("carol@example.com");
    fail(&limiter, &login, &carol, 1).await;

    let page = get(&app, &format!("{MOUNT}/login")).await;
    assert_eq!(page.status, StatusCode::OK);
    let form = &page.body[page.body.find("<h2>Look up a key</h2><form").unwrap()..];
    assert!(
        form.starts_with(&format!(
            r#"<h2>Look up a key</h2><form method="post" action="{MOUNT}/login">"#
        )),
        "{form}"
    );

    let answer = look_up(&app, "login", "carol@example.com").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert!(answer.headers.get("location").is_none());
    let found = lookup_part(&answer.body);
    assert_eq!(shown_keys(found), [carol.spelling()]);
    assert!(found.contains("1 / 3"), "{}", answer.body);

    let linked = get(&app, &format!("{MOUNT}/login?key=carol%40example.com")).await;
    assert_eq!(linked.status, StatusCode::OK);
    assert!(!linked.body.contains("carol"), "{}", linked.body);
}

/// A key is shown as it is typed: each listed key, whichever constructor
/// built it, is looked up by the text its row shows; an email address or
/// an IP address typed alone is the service's key of it; a text that is
/// none is told, in words, what to type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_looked_up_by_the_text_its_row_shows() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 2);
    let app = app(&limiter, std::slice::from_ref(&login));
    let keys = [
        Key::new(["account", "42", "203.0.113.7"]).unwrap(),
        Key::new(["alice@example.com"]).unwrap(),
        Key::opaque(&"session-".repeat(40)),
        Key::email("alice@example.com"),
        Key::ip("2001:db8:1:2::9".parse().unwrap()),
    ];
    for key in &keys {
        fail(&limiter, &login, key, 2).await;
    }

    let page = get(&app, &format!("{MOUNT}/login")).await;
    let refused = &page.body[page.body.find("Refused now").unwrap()..];
    let mut shown = shown_keys(refused);
    shown.sort();
    let mut spelled: Vec<String> = keys.iter().map(Key::spelling).collect();
    spelled.sort();
    assert_eq!(shown, spelled);
    for key in &keys {
        let typed = key.spelling();
        let answer = look_up(&app, "login", &typed).await;
        assert_eq!(answer.status, StatusCode::OK, "{typed}: {}", answer.body);
        let found = lookup_part(&answer.body);
        assert_eq!(shown_keys(found), [typed.as_str()], "{typed}");
        assert!(found.contains("2 / 2"), "{typed}: {}", answer.body);
        assert_eq!(unlock_forms(found)[0].1, key.as_str(), "{typed}");
    }

    for (typed, key) in [
        (" Alice@Example.COM ", &keys[3]),
        ("2001:db8:1:2::1", &keys[4]),
    ] {
        let answer = look_up(&app, "login", typed).await;
        let found = lookup_part(&answer.body);
        assert_eq!(
            shown_keys(found),
            [key.spelling()],
            "{typed}: {}",
            answer.body
        );
        assert!(found.contains("2 / 2"), "{typed}: {}", answer.body);
    }

    let answer = look_up(&app, "login", "alice").await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let said = lookup_part(&answer.body);
    for words in [
        "Not a key: type an email address",
        "an IP address",
        "email|alice@example.com",
    ] {
        assert!(said.contains(words), "{words:?}: {}", answer.body);
    }
    assert!(!said.contains("invalid key"), "{}", answer.body);
}

/// Keys that differ only by what shows as nothing (a zero-width space, a
/// right-to-left override, a space at the end, a second space) are shown
/// apart, each such character as a visible `\u{…}`, and each row unlocks
/// its own key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_look_alike_are_shown_apart() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 1);
    let app = app(&limiter, std::slice::from_ref(&login));
    let email = |text: &str| Key::new(["email", text]).unwrap();
    let keys = [
        Key::email("alice@example.com"),
        email("alice@example.com\u{200B}"),
        email("\u{202E}moc.elpmaxe@ecila"),
        email("alice@example.com "),
        email("alice  bob@example.com"),
        email("alice bob@example.com"),
    ];
    for key in &keys {
        fail(&limiter, &login, key, 1).await;
    }

    let page = get(&app, &format!("{MOUNT}/login")).await;
    let refused = &page.body[page.body.find("Refused now").unwrap()..];
    let rows: Vec<(String, String)> = shown_keys(refused)
        .into_iter()
        .zip(listed(&page.body))
        .collect();
    assert_eq!(rows.len(), keys.len());
    for key in &keys {
        let (shown, _) = rows
            .iter()
            .find(|(_, stored)| stored == key.as_str())
            .unwrap_or_else(|| panic!("no row for {:?} in {}", key.spelling(), page.body));
        assert_eq!(*shown, key.spelling(), "each row shows its own key");
        assert!(!shown.contains(['\u{200B}', '\u{202E}']), "{shown:?}");
    }
    let mut shown: Vec<&str> = rows.iter().map(|(shown, _)| shown.as_str()).collect();
    shown.sort_unstable();
    shown.dedup();
    assert_eq!(shown.len(), keys.len(), "no two rows look alike: {shown:?}");
    assert!(
        shown.contains(&"email|alice@example.com\\u{200b}"),
        "{shown:?}"
    );
    assert!(
        shown.contains(&"email|\\u{202e}moc.elpmaxe@ecila"),
        "{shown:?}"
    );
    // A run of spaces shows as it is, not as one.
    assert!(
        page.body.contains("td.key{white-space:pre-wrap;"),
        "{}",
        page.body
    );
}

/// Unlock, posted from the page with its token, resets exactly the listed
/// key (the next check allows it), a digested one too, and answers 303
/// back to the page, which says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_from_the_page_resets_the_key_and_answers_303() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 2);
    let app = app(&limiter, std::slice::from_ref(&login));
    let alice = Key::email("alice@example.com");
    let bob = Key::username("bob");
    let long = Key::opaque(&"a|~\\".repeat(100));
    assert!(long.is_digested());
    for key in [&alice, &bob, &long] {
        fail(&limiter, &login, key, 2).await;
    }

    let page = get(&app, &format!("{MOUNT}/login")).await;
    for key in [&alice, &long] {
        let (action, token) = unlock_form(&page.body, key.as_str());
        assert_eq!(action, "/support/limits/login/unlock");
        assert!(limiter.check(&login, key).await.unwrap().is_refused());
        let answer = post(
            &app,
            &action,
            SAME_ORIGIN,
            &[("key", key.as_str()), ("token", &token), ("reason", REASON)],
        )
        .await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
        assert_secured(&answer, "the redirect");
        let back = answer.headers.get("location").unwrap().to_str().unwrap();
        assert_eq!(back, "/support/limits/login?unlocked");
        assert!(limiter.check(&login, key).await.unwrap().is_allowed());
        assert_eq!(limiter.status(&login, key).await.unwrap().count(), 0);

        let after = get(&app, back).await;
        assert!(after.body.contains("Unlocked"), "{}", after.body);
        assert!(!listed(&after.body).contains(&key.as_str().to_owned()));
    }
    assert!(
        limiter.check(&login, &bob).await.unwrap().is_refused(),
        "only those keys"
    );

    // A browser that sends neither field (an older one): the token decides.
    let (action, token) = unlock_form(&page.body, bob.as_str());
    let answer = post(
        &app,
        &action,
        &[],
        &[("key", bob.as_str()), ("token", &token), ("reason", REASON)],
    )
    .await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    assert!(limiter.check(&login, &bob).await.unwrap().is_allowed());
}

/// A cross-site POST is a 403 that says why and resets nothing: a
/// `Sec-Fetch-Site` other than same-origin, a foreign or null `Origin`, no
/// token, another key's token, another limit's, another router's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_unlock_is_403_and_resets_nothing() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 2);
    let reset_password = limit("reset-password", 2);
    let limits = [login.clone(), reset_password.clone()];
    let app = app(&limiter, &limits);
    let another_router = self::app(&limiter, &limits);
    let alice = Key::email("alice@example.com");
    let bob = Key::email("bob@example.com");
    fail(&limiter, &login, &alice, 2).await;
    fail(&limiter, &login, &bob, 2).await;
    fail(&limiter, &reset_password, &alice, 2).await;

    let page = get(&app, &format!("{MOUNT}/login")).await;
    let (action, token) = unlock_form(&page.body, alice.as_str());
    let (_, bobs_token) = unlock_form(&page.body, bob.as_str());
    let other_limit = get(&app, &format!("{MOUNT}/reset-password")).await;
    let (_, other_limits_token) = unlock_form(&other_limit.body, alice.as_str());
    let other_page = get(&another_router, &format!("{MOUNT}/login")).await;
    let (_, other_routers_token) = unlock_form(&other_page.body, alice.as_str());
    assert_ne!(
        other_routers_token, token,
        "each router has a secret of its own"
    );

    let key = alice.as_str();
    // What, the header fields, the form, what the 403 page says.
    let cases: &[(&str, Fields, Fields, &str)] = &[
        (
            "Sec-Fetch-Site: cross-site",
            &[
                ("sec-fetch-site", "cross-site"),
                ("origin", "https://staff.example:8443"),
            ],
            &[("key", key), ("token", &token), ("reason", REASON)],
            "another site",
        ),
        (
            "Sec-Fetch-Site: same-site",
            &[("sec-fetch-site", "same-site")],
            &[("key", key), ("token", &token), ("reason", REASON)],
            "another site",
        ),
        (
            "a foreign Origin",
            &[("origin", "https://evil.example")],
            &[("key", key), ("token", &token), ("reason", REASON)],
            "Origin",
        ),
        (
            "Origin: null",
            &[("origin", "null")],
            &[("key", key), ("token", &token), ("reason", REASON)],
            "Origin",
        ),
        ("no token", SAME_ORIGIN, &[("key", key)], "token"),
        (
            "an empty token",
            SAME_ORIGIN,
            &[("key", key), ("token", ""), ("reason", REASON)],
            "token",
        ),
        (
            "another key's token",
            SAME_ORIGIN,
            &[("key", key), ("token", &bobs_token), ("reason", REASON)],
            "token",
        ),
        (
            "another limit's token",
            SAME_ORIGIN,
            &[
                ("key", key),
                ("token", &other_limits_token),
                ("reason", REASON),
            ],
            "token",
        ),
        (
            "another router's token",
            SAME_ORIGIN,
            &[
                ("key", key),
                ("token", &other_routers_token),
                ("reason", REASON),
            ],
            "token",
        ),
    ];
    for (what, fields, form, says) in cases {
        let answer = post(&app, &action, fields, form).await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{what}: {}",
            answer.body
        );
        assert_secured(&answer, what);
        assert!(
            answer.body.contains("Nothing was unlocked"),
            "{what}: {}",
            answer.body
        );
        assert!(answer.body.contains(says), "{what}: {}", answer.body);
    }
    for (limit, key) in [(&login, &alice), (&login, &bob), (&reset_password, &alice)] {
        let status = limiter.status(limit, key).await.unwrap();
        assert_eq!(status.count(), 2, "nothing was reset");
        assert!(status.is_refused());
    }
}

/// One key under every limit, on the index: a key refused under the
/// per-address limit and not under the account limit shows as refused
/// under the first, by name, and allowed under the second, one row a limit
/// in the router's order, each with its count of its max; a limit that has
/// not counted the key shows 0. The lookup is a POST, reads and counts
/// nothing; a text that is no key is said to be none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_shown_under_every_limit() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 5);
    let per_address = limit("login-per-address", 2);
    let reset_password = limit("reset-password", 3);
    let limits = [login.clone(), per_address.clone(), reset_password.clone()];
    let app = app(&limiter, &limits);
    let address = Key::ip("203.0.113.7".parse().unwrap());
    fail(&limiter, &login, &address, 1).await;
    fail(&limiter, &per_address, &address, 2).await;

    // The account limit's own page shows the key counted, not refused.
    let own_page = look_up(&app, "login", "203.0.113.7").await;
    let found = lookup_part(&own_page.body);
    assert!(found.contains("1 / 5"), "{}", own_page.body);
    assert!(!found.contains("<span class=\"refused\">"), "{found}");

    let index = get(&app, MOUNT).await;
    assert!(
        index
            .body
            .contains(r#"<form method="post" action="/support/limits">"#),
        "{}",
        index.body
    );

    let answer = look_up_everywhere(&app, "203.0.113.7").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_secured(&answer, "a lookup under every limit");
    assert!(answer.headers.get("location").is_none());
    assert_eq!(key_under_every_limit(&answer.body), address.spelling());
    assert_eq!(
        every_limit_verdicts(&answer.body),
        [
            ["login", "1 / 5", "allowed"],
            ["login-per-address", "2 / 2", "refused"],
            ["reset-password", "0 / 3", "allowed"],
        ]
        .map(|row| row.map(str::to_owned)),
        "{}",
        answer.body
    );
    let rows = every_limit_rows(&answer.body);
    assert_eq!(rows[0][3], "open now");
    assert!(rows[1][3].contains("in "), "reopens: {:?}", rows[1]);
    assert!(
        answer.body.contains(
            r#"<a href="/support/limits/login-per-address">login-per-address</a></td><td class="num"><span class="refused">2 / 2</span>"#
        ),
        "{}",
        answer.body
    );
    for (limit, count) in [(&login, 1), (&per_address, 2), (&reset_password, 0)] {
        let status = limiter.status(limit, &address).await.unwrap();
        assert_eq!(status.count(), count, "{}: nothing counted", limit.name());
    }

    let untouched = look_up_everywhere(&app, " Alice@Example.COM ").await;
    assert_eq!(untouched.status, StatusCode::OK, "{}", untouched.body);
    assert_eq!(
        key_under_every_limit(&untouched.body),
        Key::email("alice@example.com").spelling()
    );
    let counts: Vec<String> = every_limit_verdicts(&untouched.body)
        .into_iter()
        .map(|[limit, count, now]| format!("{limit} {count} {now}"))
        .collect();
    assert_eq!(
        counts,
        [
            "login 0 / 5 allowed",
            "login-per-address 0 / 2 allowed",
            "reset-password 0 / 3 allowed"
        ]
    );
    assert!(unlock_forms(&untouched.body).is_empty(), "nothing to clear");

    let nonsense = look_up_everywhere(&app, "alice").await;
    assert_eq!(nonsense.status, StatusCode::BAD_REQUEST);
    assert!(
        nonsense.body.contains("Not a key: type an email address"),
        "{}",
        nonsense.body
    );
    assert!(every_limit_rows(&nonsense.body).is_empty());
}

/// Unlock under every limit, posted from the index with its token, resets
/// the key under each limit (the next check allows it everywhere) and no
/// other key, and says how many windows went under which limit; posted
/// again, it says there was nothing to reset. Its token is bound to the key
/// and to every limit: replayed for another key, or as one limit's unlock,
/// it is a 403; nor does one limit's token unlock under every limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_under_every_limit_resets_the_key_under_each() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 5);
    let per_address = limit("login-per-address", 2);
    let reset_password = limit("reset-password", 3);
    let limits = [login.clone(), per_address.clone(), reset_password.clone()];
    let app = app(&limiter, &limits);
    let alice = Key::email("alice@example.com");
    let bob = Key::email("bob@example.com");
    fail(&limiter, &login, &alice, 1).await;
    fail(&limiter, &per_address, &alice, 2).await;
    fail(&limiter, &per_address, &bob, 2).await;

    let found = look_up_everywhere(&app, "alice@example.com").await;
    let forms = unlock_forms(&found.body);
    assert_eq!(forms.len(), 1, "{}", found.body);
    let (action, key, token) = forms[0].clone();
    assert_eq!(action, "/support/limits/~all/unlock");
    assert_eq!(key, alice.as_str());
    let page = get(&app, &format!("{MOUNT}/login-per-address")).await;
    let (single_action, single_token) = unlock_form(&page.body, alice.as_str());

    // What, where, the form.
    let replays: &[(&str, &str, Fields)] = &[
        (
            "for another key",
            &action,
            &[("key", bob.as_str()), ("token", &token), ("reason", REASON)],
        ),
        (
            "as one limit's unlock",
            &single_action,
            &[("key", &key), ("token", &token), ("reason", REASON)],
        ),
        (
            "one limit's token under every limit",
            &action,
            &[("key", &key), ("token", &single_token), ("reason", REASON)],
        ),
    ];
    for (what, path, form) in replays {
        let answer = post(&app, path, SAME_ORIGIN, form).await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{what}: {}",
            answer.body
        );
        assert!(
            answer.body.contains("not valid for this key"),
            "{what}: {}",
            answer.body
        );
    }
    for (limit, key, count) in [
        (&login, &alice, 1),
        (&per_address, &alice, 2),
        (&per_address, &bob, 2),
    ] {
        assert_eq!(
            limiter.status(limit, key).await.unwrap().count(),
            count,
            "nothing was reset"
        );
    }

    let form = [
        ("key", key.as_str()),
        ("token", token.as_str()),
        ("reason", REASON),
    ];
    let answer = post(&app, &action, SAME_ORIGIN, &form).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_secured(&answer, "an unlock under every limit");
    assert_eq!(
        notice(&answer.body),
        "Unlocked under every limit: login: 1 window; login-per-address: 1 window."
    );
    assert_eq!(key_under_every_limit(&answer.body), alice.spelling());
    assert!(
        every_limit_verdicts(&answer.body)
            .iter()
            .all(|[_, count, now]| count.starts_with("0 / ") && now == "allowed"),
        "{}",
        answer.body
    );
    for limit in &limits {
        assert_eq!(limiter.status(limit, &alice).await.unwrap().count(), 0);
        assert!(limiter.check(limit, &alice).await.unwrap().is_allowed());
    }
    assert!(
        limiter
            .check(&per_address, &bob)
            .await
            .unwrap()
            .is_refused(),
        "only that key"
    );

    let again = post(&app, &action, SAME_ORIGIN, &form).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert!(
        notice(&again.body).starts_with("Nothing to reset"),
        "{}",
        again.body
    );
}

/// A cross-site POST of the unlock under every limit is a 403 that says
/// why and resets nothing, as one limit's unlock is: a `Sec-Fetch-Site`
/// other than same-origin, a foreign or null `Origin`, no token, another
/// router's token. The same form from the page's own origin unlocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_unlock_under_every_limit_is_403_and_resets_nothing() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 2);
    let per_address = limit("login-per-address", 2);
    let limits = [login.clone(), per_address.clone()];
    let app = app(&limiter, &limits);
    let another_router = self::app(&limiter, &limits);
    let alice = Key::email("alice@example.com");
    fail(&limiter, &login, &alice, 2).await;
    fail(&limiter, &per_address, &alice, 2).await;

    let found = look_up_everywhere(&app, "alice@example.com").await;
    let (action, _, token) = unlock_forms(&found.body)
        .pop()
        .unwrap_or_else(|| panic!("no unlock under every limit in {}", found.body));
    let elsewhere = look_up_everywhere(&another_router, "alice@example.com").await;
    let (_, _, other_routers_token) = unlock_forms(&elsewhere.body).pop().unwrap();
    assert_ne!(other_routers_token, token);

    let key = alice.as_str();
    // What, the header fields, the form, what the 403 page says.
    let cases: &[(&str, Fields, Fields, &str)] = &[
        (
            "Sec-Fetch-Site: cross-site",
            &[
                ("sec-fetch-site", "cross-site"),
                ("origin", "https://staff.example:8443"),
            ],
            &[("key", key), ("token", &token), ("reason", REASON)],
            "another site",
        ),
        (
            "a foreign Origin",
            &[("origin", "https://evil.example")],
            &[("key", key), ("token", &token), ("reason", REASON)],
            "Origin",
        ),
        (
            "Origin: null",
            &[("origin", "null")],
            &[("key", key), ("token", &token), ("reason", REASON)],
            "Origin",
        ),
        ("no token", SAME_ORIGIN, &[("key", key)], "token"),
        (
            "another router's token",
            SAME_ORIGIN,
            &[
                ("key", key),
                ("token", &other_routers_token),
                ("reason", REASON),
            ],
            "token",
        ),
    ];
    for (what, fields, form, says) in cases {
        let answer = post(&app, &action, fields, form).await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{what}: {}",
            answer.body
        );
        assert_secured(&answer, what);
        assert!(
            answer.body.contains("Nothing was unlocked") && answer.body.contains(says),
            "{what}: {}",
            answer.body
        );
    }
    for limit in &limits {
        let status = limiter.status(limit, &alice).await.unwrap();
        assert_eq!(status.count(), 2, "nothing was reset");
        assert!(status.is_refused());
    }

    let answer = post(
        &app,
        &action,
        SAME_ORIGIN,
        &[("key", key), ("token", &token), ("reason", REASON)],
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    for limit in &limits {
        assert!(limiter.check(limit, &alice).await.unwrap().is_allowed());
    }
}

/// An unlock whose `Origin` names another scheme than the page's is a 403
/// that resets nothing: the page's scheme is its configured origin's, or
/// the request's own when its URI is absolute (HTTP/2); the page's own
/// scheme unlocks. An origin that is none is refused when the router is
/// built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_of_another_scheme_is_403() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 1);
    let configured = mounted(
        admin::Admin::new(limiter.clone(), [login.clone()])
            .origin("https://staff.example:8443")
            .router()
            .unwrap(),
    );
    let plain = app(&limiter, std::slice::from_ref(&login));
    let (alice, bob) = (
        Key::email("alice@example.com"),
        Key::email("bob@example.com"),
    );
    fail(&limiter, &login, &alice, 1).await;
    fail(&limiter, &login, &bob, 1).await;

    let absolute = format!("https://{HOST}{MOUNT}/login/unlock");
    for (app, action, key) in [
        (&configured, format!("{MOUNT}/login/unlock"), &alice),
        (&plain, absolute, &bob),
    ] {
        let page = get(app, &format!("{MOUNT}/login")).await;
        let (_, token) = unlock_form(&page.body, key.as_str());
        let form = [
            ("key", key.as_str()),
            ("token", token.as_str()),
            ("reason", REASON),
        ];
        for origin in ["http://staff.example:8443", "ftp://staff.example:8443"] {
            let answer = post(app, &action, &[("origin", origin)], &form).await;
            assert_eq!(answer.status, StatusCode::FORBIDDEN, "{origin} to {action}");
            assert!(answer.body.contains("Origin"), "{}", answer.body);
            assert!(limiter.check(&login, key).await.unwrap().is_refused());
        }
        let own = [("origin", "https://staff.example:8443")];
        let answer = post(app, &action, &own, &form).await;
        assert_eq!(
            answer.status,
            StatusCode::SEE_OTHER,
            "{action}: {}",
            answer.body
        );
        assert!(limiter.check(&login, key).await.unwrap().is_allowed());
    }

    for origin in [
        "staff.example",
        "ftp://staff.example",
        "https://staff.example/support",
    ] {
        let built = admin::Admin::new(limiter.clone(), [login.clone()])
            .origin(origin)
            .router();
        assert_eq!(
            built.unwrap_err().kind(),
            ErrorKind::InvalidOption,
            "{origin:?}"
        );
    }
}

/// An unlock token is bound to its limit, its key and the time its page
/// was loaded: replayed for another key it is a 403; older than
/// `Admin::UNLOCK_TOKEN_LIFETIME` it is a 403 page that says the page
/// expired and to reload it; until then, and from a reloaded page, it
/// unlocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_token_expires_and_unlocks_only_its_key() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 1);
    let clock = ManualClock::new(SystemTime::now());
    let app = mounted(
        admin::Admin::new(limiter.clone(), [login.clone()])
            .clock(clock.clone())
            .router()
            .unwrap(),
    );
    let keys = ["alice", "bob", "carol"].map(|name| Key::email(&format!("{name}@example.com")));
    for key in &keys {
        fail(&limiter, &login, key, 1).await;
    }
    let [alice, bob, carol] = &keys;
    let page = get(&app, &format!("{MOUNT}/login")).await;
    let (action, alices) = unlock_form(&page.body, alice.as_str());
    let (_, bobs) = unlock_form(&page.body, bob.as_str());

    let replayed = post(
        &app,
        &action,
        SAME_ORIGIN,
        &[
            ("key", carol.as_str()),
            ("token", &alices),
            ("reason", REASON),
        ],
    )
    .await;
    assert_eq!(replayed.status, StatusCode::FORBIDDEN, "{}", replayed.body);
    assert!(
        replayed.body.contains("not valid for this key"),
        "{}",
        replayed.body
    );
    assert!(limiter.check(&login, carol).await.unwrap().is_refused());

    clock.advance(UNLOCK_TOKEN_LIFETIME);
    let in_time = post(
        &app,
        &action,
        SAME_ORIGIN,
        &[("key", bob.as_str()), ("token", &bobs), ("reason", REASON)],
    )
    .await;
    assert_eq!(in_time.status, StatusCode::SEE_OTHER, "{}", in_time.body);

    clock.advance(Duration::from_secs(1));
    let expired = post(
        &app,
        &action,
        SAME_ORIGIN,
        &[
            ("key", alice.as_str()),
            ("token", &alices),
            ("reason", REASON),
        ],
    )
    .await;
    assert_eq!(expired.status, StatusCode::FORBIDDEN, "{}", expired.body);
    let said = unescape(&expired.body);
    for words in ["expired", "Nothing was unlocked", "reload the limit's page"] {
        assert!(said.contains(words), "{words:?}: {said}");
    }
    assert!(limiter.check(&login, alice).await.unwrap().is_refused());

    let reloaded = get(&app, &format!("{MOUNT}/login")).await;
    let (_, fresh) = unlock_form(&reloaded.body, alice.as_str());
    let answer = post(
        &app,
        &action,
        SAME_ORIGIN,
        &[
            ("key", alice.as_str()),
            ("token", &fresh),
            ("reason", REASON),
        ],
    )
    .await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    assert!(limiter.check(&login, alice).await.unwrap().is_allowed());
}

/// How long an unlock token unlocks.
const UNLOCK_TOKEN_LIFETIME: Duration =
    admin::Admin::<Postgres<tokio_postgres::Config>>::UNLOCK_TOKEN_LIFETIME;

/// A key that holds markup renders as text, in the list, in the hidden
/// field and in the lookup's echo, and still unlocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_key_renders_as_text() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 1);
    let app = app(&limiter, std::slice::from_ref(&login));
    let script = Key::username("<script>alert(1)</script>");
    let attribute = Key::opaque("\"><img src=x onerror=alert(1)>'&");
    fail(&limiter, &login, &script, 1).await;
    fail(&limiter, &login, &attribute, 1).await;

    let page = look_up(&app, "login", "user:<script>alert(2)</script>").await;
    assert_eq!(page.status, StatusCode::OK);
    for raw in ["<script", "<img", "\"><img", "alert(2)</"] {
        assert!(!page.body.contains(raw), "{raw:?} in {}", page.body);
    }
    assert!(
        page.body
            .contains("user|&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("id|&quot;&gt;&lt;img src=x onerror=alert(1)&gt;&#39;&amp;")
    );
    assert!(
        page.body
            .contains("value=\"user:&lt;script&gt;alert(2)&lt;/script&gt;\"")
    );

    let mut listed = listed(&page.body);
    listed.sort();
    assert_eq!(listed, [attribute.as_str(), script.as_str()]);
    for key in [&script, &attribute] {
        let (action, token) = unlock_form(&page.body, key.as_str());
        let answer = post(
            &app,
            &action,
            SAME_ORIGIN,
            &[("key", key.as_str()), ("token", &token), ("reason", REASON)],
        )
        .await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
        assert!(limiter.check(&login, key).await.unwrap().is_allowed());
    }
}

/// The index answers under the path the router is nested at, with or
/// without a trailing slash, and links to the limits' pages under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_answers_with_or_without_a_trailing_slash() {
    let limiter = Arc::new(Limiter::new(Memory::new()));
    let app = mounted(admin::router(limiter, [limit("login", 1)]).unwrap());
    for path in [MOUNT.to_owned(), format!("{MOUNT}/")] {
        let index = get(&app, &path).await;
        assert_eq!(index.status, StatusCode::OK, "{path}: {}", index.body);
        assert_secured(&index, &path);
        assert!(
            index
                .body
                .contains(r#"<a href="/support/limits/login">login</a>"#),
            "{path}: {}",
            index.body
        );
    }
}

/// A limit the router was not given has no page and no unlock, even when
/// the store has its keys; nor has any other path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_limit_is_404() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 1);
    let signup = limit("signup", 1);
    let app = app(&limiter, std::slice::from_ref(&login));
    let alice = Key::email("alice@example.com");
    fail(&limiter, &signup, &alice, 1).await;

    for path in [
        "/support/limits/signup",
        "/support/limits/nope",
        "/support/limits/login/more",
    ] {
        let answer = get(&app, path).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{path}");
        assert_secured(&answer, path);
    }
    let answer = get(&app, "/support/limits/%3Cb%3Ex").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert!(answer.body.contains("&lt;b&gt;x") && !answer.body.contains("<b>x"));

    let answer = post(
        &app,
        "/support/limits/signup/unlock",
        SAME_ORIGIN,
        &[
            ("key", alice.as_str()),
            ("token", &"0".repeat(64)),
            ("reason", REASON),
        ],
    )
    .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert!(limiter.check(&signup, &alice).await.unwrap().is_refused());
}

/// A store that does not answer is a page that says so, 503, never a
/// panic: the list, the lookup and the unlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_is_a_page_that_says_so() {
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(nothing_listens()))
            .budget(Duration::from_millis(500))
            .build()
            .unwrap(),
    );
    let login = limit("login", 1);
    let router = admin::Admin::new(limiter, [login])
        .secret(&[7; 32])
        .router()
        .unwrap();
    let app = mounted(router);
    for (what, answer) in [
        ("the page", get(&app, &format!("{MOUNT}/login")).await),
        ("a lookup", look_up(&app, "login", "id:a").await),
        (
            "a lookup under every limit",
            look_up_everywhere(&app, "id:a").await,
        ),
    ] {
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{what}");
        assert!(answer.body.contains("did not answer"), "{}", answer.body);
        assert_secured(&answer, what);
    }
    // A page of a replica that answers, with the same secret: its token
    // is good here too, and the unlock says the store did not answer.
    let replica = Arc::new(Limiter::new(Memory::new()));
    let alice = Key::email("alice@example.com");
    replica.failed(&limit("login", 1), &alice).await.unwrap();
    let replica = mounted(
        admin::Admin::new(replica, [limit("login", 1)])
            .secret(&[7; 32])
            .router()
            .unwrap(),
    );
    let page = get(&replica, &format!("{MOUNT}/login")).await;
    let (action, token) = unlock_form(&page.body, alice.as_str());
    let answer = post(
        &app,
        &action,
        SAME_ORIGIN,
        &[
            ("key", alice.as_str()),
            ("token", &token),
            ("reason", REASON),
        ],
    )
    .await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.body
    );
    assert!(answer.body.contains("did not answer"), "{}", answer.body);
    let found = look_up_everywhere(&replica, alice.as_str()).await;
    let (action, _, token) = unlock_forms(&found.body).pop().unwrap();
    let answer = post(
        &app,
        &action,
        SAME_ORIGIN,
        &[
            ("key", alice.as_str()),
            ("token", &token),
            ("reason", REASON),
        ],
    )
    .await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.body
    );
    assert!(answer.body.contains("did not answer"), "{}", answer.body);

    let index = get(&app, MOUNT).await;
    assert_eq!(index.status, StatusCode::OK, "the index needs no store");
}

/// Block, posted from a looked-up key's form with its token, a duration
/// from the page's list and a reason, refuses the key for the service
/// (a check is refused, by this limiter and by another over the same
/// database) until the block ends, and answers 303 back to the page, which
/// says so; the key then shows its Unblock form, which ends the block for
/// every limiter. Both land in the audit with the staff member and the
/// reason, and the page shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_from_the_page_refuses_the_key_and_unblock_ends_it() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    // Another replica of the service: a limiter of its own, one database.
    let replica = limiter_on(db.config());
    let login = limit("login", 5);
    let app = staffed_app(&limiter, std::slice::from_ref(&login));
    let mallory = Key::email("mallory@example.com");
    fail(&limiter, &login, &mallory, 1).await;

    let found = look_up(&app, "login", "Mallory@Example.com").await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.body);
    let part = lookup_part(&found.body);
    assert!(forms(part, "unblock").is_empty(), "not blocked: {part}");
    let (action, key, token) = forms(part, "block")
        .pop()
        .unwrap_or_else(|| panic!("no Block form in {part}"));
    assert_eq!(action, "/support/limits/login/block");
    assert_eq!(key, mallory.as_str());
    for secs in ["900", "3600", "86400", "604800", "2592000"] {
        assert!(
            part.contains(&format!("<option value=\"{secs}\">")),
            "{secs}: {part}"
        );
    }

    let why = "ticket 4121: credential stuffing";
    let before = SystemTime::now();
    let form = [
        ("key", key.as_str()),
        ("token", token.as_str()),
        ("for", "3600"),
        ("reason", why),
    ];
    let answer = post(&app, &action, &as_staff("ann"), &form).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    assert_secured(&answer, "a block");
    assert_eq!(location(&answer), "/support/limits/login?blocked");
    for (which, limiter) in [("this limiter", &limiter), ("another", &replica)] {
        let verdict = limiter.check(&login, &mallory).await.unwrap();
        assert!(verdict.is_refused(), "{which}: {verdict:?}");
    }
    let until = replica
        .status(&login, &mallory)
        .await
        .unwrap()
        .locked_until()
        .expect("blocked");
    let lasts = until.duration_since(before).unwrap();
    assert!(
        (3590..=3610).contains(&lasts.as_secs()),
        "blocked for an hour: {lasts:?}"
    );

    let after = get(&app, location(&answer)).await;
    assert!(notice(&after.body).starts_with("Blocked"), "{}", after.body);
    let limit_audit = audit_rows(&after.body[after.body.find("<h2>Audit</h2>").unwrap()..]);
    assert_eq!(limit_audit.len(), 1, "{}", after.body);
    let entry = &limit_audit[0];
    assert_eq!(
        [&entry[1], &entry[2], &entry[3], &entry[5]],
        ["ann", "block", &mallory.spelling(), why],
        "who, what, key, why: {entry:?}"
    );
    assert!(entry[4].ends_with("UTC"), "until: {entry:?}");

    let found = look_up(&app, "login", "mallory@example.com").await;
    let part = lookup_part(&found.body);
    assert!(part.contains("<span class=\"refused\">"), "{part}");
    let (action, key, token) = forms(part, "unblock")
        .pop()
        .unwrap_or_else(|| panic!("no Unblock form in {part}"));
    assert_eq!(action, "/support/limits/login/unblock");
    let form = [
        ("key", key.as_str()),
        ("token", token.as_str()),
        ("reason", "cleared by security"),
    ];
    let answer = post(&app, &action, &as_staff("bob"), &form).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    assert_eq!(location(&answer), "/support/limits/login?unblocked");
    for (which, limiter) in [("this limiter", &limiter), ("another", &replica)] {
        let verdict = limiter.check(&login, &mallory).await.unwrap();
        assert!(verdict.is_allowed(), "{which}: {verdict:?}");
    }

    let audit = limiter.audit(Some(&login), 10).await.unwrap();
    let seen: Vec<_> = audit
        .iter()
        .map(|e| (e.action(), e.by(), e.key(), e.reason()))
        .collect();
    assert_eq!(
        seen,
        [
            (
                AuditAction::Unblock,
                "bob",
                mallory.as_str(),
                "cleared by security"
            ),
            (AuditAction::Block, "ann", mallory.as_str(), why),
        ]
    );
    assert!(audit[1].until().is_some());

    // The key's audit, under its lookup: newest first.
    let found = look_up(&app, "login", "mallory@example.com").await;
    let rows = audit_rows(lookup_part(&found.body));
    let who_what_why: Vec<[&str; 3]> = rows
        .iter()
        .map(|row| [row[1].as_str(), &row[2], &row[4]])
        .collect();
    assert_eq!(
        who_what_why,
        [
            ["bob", "unblock 1 cleared", "cleared by security"],
            ["ann", "block", why]
        ],
        "{}",
        found.body
    );
}

/// Every unlock from the page, one limit's and under every limit, is the
/// library's audited unlock: the staff member `Admin::staff` reads from
/// the request and the reason typed land in the audit; without
/// `Admin::staff`, or when it names nobody, the audit says "admin page".
/// The index shows the key's audit under every limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlocks_are_audited_with_the_staff_member_and_the_reason() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 2);
    let per_address = limit("login-per-address", 2);
    let limits = [login.clone(), per_address.clone()];
    let app = staffed_app(&limiter, &limits);
    let unnamed = self::app(&limiter, &limits);
    let [alice, bob, carol] =
        ["alice", "bob", "carol"].map(|name| Key::email(&format!("{name}@example.com")));
    fail(&limiter, &login, &alice, 2).await;
    fail(&limiter, &login, &bob, 2).await;
    fail(&limiter, &login, &carol, 2).await;
    fail(&limiter, &per_address, &carol, 1).await;

    let page = get(&app, &format!("{MOUNT}/login")).await;
    let (action, token) = unlock_form(&page.body, alice.as_str());
    let why = "locked out; verified by phone";
    let form = [("key", alice.as_str()), ("token", &token), ("reason", why)];
    let answer = post(&app, &action, &as_staff("ann"), &form).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    assert!(limiter.check(&login, &alice).await.unwrap().is_allowed());

    let page = get(&unnamed, &format!("{MOUNT}/login")).await;
    let (action, token) = unlock_form(&page.body, bob.as_str());
    let form = [("key", bob.as_str()), ("token", &token), ("reason", REASON)];
    let answer = post(&unnamed, &action, &as_staff("ann"), &form).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);

    // Under every limit, from a request the staff login named nobody in.
    let found = look_up_everywhere(&app, "carol@example.com").await;
    let (action, key, token) = unlock_forms(&found.body).pop().unwrap();
    let form = [("key", key.as_str()), ("token", &token), ("reason", REASON)];
    let answer = post(&app, &action, SAME_ORIGIN, &form).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    for limit in &limits {
        assert!(limiter.check(limit, &carol).await.unwrap().is_allowed());
    }

    let mut audit: Vec<_> = limiter
        .audit(None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            let action = e.action();
            let (by, limit, key) = (e.by().to_owned(), e.limit().to_owned(), e.key().to_owned());
            (action, by, limit, key, e.reason().to_owned(), e.windows())
        })
        .collect();
    audit.sort_by(|a, b| (&a.3, &a.2).cmp(&(&b.3, &b.2)));
    let unlock = |by: &str, limit: &Limit, key: &Key, why: &str| {
        let windows = Some(1);
        let (by, limit, key) = (
            by.to_owned(),
            limit.name().to_owned(),
            key.as_str().to_owned(),
        );
        (AuditAction::Unlock, by, limit, key, why.to_owned(), windows)
    };
    assert_eq!(
        audit,
        [
            unlock("ann", &login, &alice, why),
            unlock("admin page", &login, &bob, REASON),
            unlock("admin page", &login, &carol, REASON),
            unlock("admin page", &per_address, &carol, REASON),
        ]
    );
    assert_eq!(
        admin::Admin::<Postgres<tokio_postgres::Config>>::UNNAMED_STAFF,
        "admin page"
    );

    // The index after the unlock shows the key's audit under every limit.
    let rows = audit_rows(&answer.body);
    let mut limit_who_why: Vec<[&str; 3]> = rows
        .iter()
        .map(|row| [row[3].as_str(), &row[1], &row[5]])
        .collect();
    limit_who_why.sort_unstable();
    assert_eq!(
        limit_who_why,
        [
            ["login", "admin page", REASON],
            ["login-per-address", "admin page", REASON]
        ],
        "{}",
        answer.body
    );
}

/// An unlock, one limit's or under every limit, a block or an unblock
/// whose reason is missing, empty or blank is a 400 that says a reason is
/// required, and changes nothing: no count cleared, no block begun or
/// ended, nothing audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_without_a_reason_is_400_and_changes_nothing() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 2);
    let app = staffed_app(&limiter, std::slice::from_ref(&login));
    let alice = Key::email("alice@example.com");
    let mallory = Key::email("mallory@example.com");
    fail(&limiter, &login, &alice, 2).await;
    let hour = Duration::from_secs(3600);
    let until = limiter
        .block(&login, &mallory, hour, "setup", "setup")
        .await
        .unwrap();

    let alices = look_up(&app, "login", "alice@example.com").await;
    let alices = lookup_part(&alices.body);
    let (unlock, _, unlock_token) = unlock_forms(alices).pop().unwrap();
    let (block, _, block_token) = forms(alices, "block").pop().unwrap();
    let mallorys = look_up(&app, "login", "mallory@example.com").await;
    let (unblock, _, unblock_token) = forms(lookup_part(&mallorys.body), "unblock").pop().unwrap();
    let everywhere = look_up_everywhere(&app, "alice@example.com").await;
    let (every_limit, _, every_limit_token) = unlock_forms(&everywhere.body).pop().unwrap();

    let (alice_key, mallory_key) = (alice.as_str(), mallory.as_str());
    // What, where, the form but its reason, what it did not do.
    let cases: &[(&str, &str, Fields, &str)] = &[
        (
            "an unlock",
            &unlock,
            &[("key", alice_key), ("token", &unlock_token)],
            "unlocked",
        ),
        (
            "an unlock under every limit",
            &every_limit,
            &[("key", alice_key), ("token", &every_limit_token)],
            "unlocked",
        ),
        (
            "a block",
            &block,
            &[("key", alice_key), ("token", &block_token), ("for", "3600")],
            "blocked",
        ),
        (
            "an unblock",
            &unblock,
            &[("key", mallory_key), ("token", &unblock_token)],
            "unblocked",
        ),
    ];
    for (what, path, form, not_done) in cases {
        for reason in [None, Some(""), Some(" \t ")] {
            let mut form = form.to_vec();
            form.extend(reason.map(|reason| ("reason", reason)));
            let answer = post(&app, path, &as_staff("ann"), &form).await;
            assert_eq!(
                answer.status,
                StatusCode::BAD_REQUEST,
                "{what} {reason:?}: {}",
                answer.body
            );
            assert_secured(&answer, what);
            let said = unescape(&answer.body);
            for words in ["a reason is required", &format!("Nothing was {not_done}")] {
                assert!(said.contains(words), "{what} {reason:?}: {said}");
            }
        }
    }
    let status = limiter.status(&login, &alice).await.unwrap();
    assert_eq!(status.count(), 2, "not unlocked");
    assert!(
        status.is_refused() && status.locked_until().is_none(),
        "not blocked"
    );
    let status = limiter.status(&login, &mallory).await.unwrap();
    assert_eq!(status.locked_until(), Some(until), "still blocked");
    assert_eq!(
        limiter.audit(None, 10).await.unwrap().len(),
        1,
        "only the setup"
    );
}

/// Each token is bound to its action as well as its limit and key: a
/// Block token replayed as an Unlock, an Unblock or an unlock under every
/// limit is a 403, and so is an Unlock or Unblock token replayed as a
/// Block, or as each other; none changes anything. Each at its own route
/// acts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_acts_only_as_its_own_forms() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 2);
    let app = staffed_app(&limiter, std::slice::from_ref(&login));
    let alice = Key::email("alice@example.com");
    fail(&limiter, &login, &alice, 2).await;
    let hour = Duration::from_secs(3600);
    let until = limiter
        .block(&login, &alice, hour, "setup", "setup")
        .await
        .unwrap();

    let found = look_up(&app, "login", "alice@example.com").await;
    let part = lookup_part(&found.body);
    let (unlock, _, unlock_token) = unlock_forms(part).pop().unwrap();
    let (block, _, block_token) = forms(part, "block").pop().unwrap();
    let (unblock, _, unblock_token) = forms(part, "unblock").pop().unwrap();
    let everywhere = look_up_everywhere(&app, "alice@example.com").await;
    let (every_limit, _, every_limit_token) = unlock_forms(&everywhere.body).pop().unwrap();

    let form = |token: &str| -> Vec<(String, String)> {
        [
            ("key", alice.as_str()),
            ("token", token),
            ("for", "900"),
            ("reason", REASON),
        ]
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .to_vec()
    };
    let replays = [
        ("a Block token as an Unlock", &unlock, &block_token),
        ("a Block token as an Unblock", &unblock, &block_token),
        (
            "a Block token under every limit",
            &every_limit,
            &block_token,
        ),
        ("an Unlock token as a Block", &block, &unlock_token),
        ("an Unlock token as an Unblock", &unblock, &unlock_token),
        ("an Unblock token as a Block", &block, &unblock_token),
        ("an Unblock token as an Unlock", &unlock, &unblock_token),
        (
            "every limit's Unlock token as a Block",
            &block,
            &every_limit_token,
        ),
    ];
    for (what, path, token) in replays {
        let form = form(token);
        let form: Vec<(&str, &str)> = form.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let answer = post(&app, path, &as_staff("ann"), &form).await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{what}: {}",
            answer.body
        );
        assert!(
            answer.body.contains("not valid for this key"),
            "{what}: {}",
            answer.body
        );
    }
    let status = limiter.status(&login, &alice).await.unwrap();
    assert_eq!(
        (status.count(), status.locked_until()),
        (2, Some(until)),
        "nothing changed"
    );
    assert_eq!(
        limiter.audit(None, 10).await.unwrap().len(),
        1,
        "only the setup"
    );

    for (path, token, done) in [
        (&block, &block_token, "blocked"),
        (&unblock, &unblock_token, "unblocked"),
        (&unlock, &unlock_token, "unlocked"),
    ] {
        let form = form(token);
        let form: Vec<(&str, &str)> = form.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let answer = post(&app, path, &as_staff("ann"), &form).await;
        assert_eq!(
            answer.status,
            StatusCode::SEE_OTHER,
            "{path}: {}",
            answer.body
        );
        assert!(location(&answer).ends_with(&format!("?{done}")), "{path}");
    }
    assert!(limiter.check(&login, &alice).await.unwrap().is_allowed());
}

/// A cross-site Block is a 403 that says why and blocks nothing, as a
/// cross-site unlock is: a `Sec-Fetch-Site` other than same-origin, a
/// foreign or null `Origin`, no token, another router's token; so is a
/// cross-site Unblock, which ends no block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_block_is_403_and_blocks_nothing() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 5);
    let limits = [login.clone()];
    let app = staffed_app(&limiter, &limits);
    let another_router = staffed_app(&limiter, &limits);
    let mallory = Key::email("mallory@example.com");

    let found = look_up(&app, "login", "mallory@example.com").await;
    let (action, key, token) = forms(lookup_part(&found.body), "block").pop().unwrap();
    let elsewhere = look_up(&another_router, "login", "mallory@example.com").await;
    let (_, _, other_routers_token) = forms(lookup_part(&elsewhere.body), "block").pop().unwrap();
    assert_ne!(other_routers_token, token);

    let key = key.as_str();
    let block = |token| {
        [
            ("key", key),
            ("token", token),
            ("for", "3600"),
            ("reason", REASON),
        ]
    };
    let cases: &[(&str, Fields, Fields, &str)] = &[
        (
            "Sec-Fetch-Site: cross-site",
            &[
                ("sec-fetch-site", "cross-site"),
                ("origin", "https://staff.example:8443"),
            ],
            &block(&token),
            "another site",
        ),
        (
            "Sec-Fetch-Site: same-site",
            &[("sec-fetch-site", "same-site")],
            &block(&token),
            "another site",
        ),
        (
            "a foreign Origin",
            &[("origin", "https://evil.example")],
            &block(&token),
            "Origin",
        ),
        (
            "Origin: null",
            &[("origin", "null")],
            &block(&token),
            "Origin",
        ),
        (
            "no token",
            SAME_ORIGIN,
            &[("key", key), ("for", "3600"), ("reason", REASON)],
            "token",
        ),
        (
            "another router's token",
            SAME_ORIGIN,
            &block(&other_routers_token),
            "token",
        ),
    ];
    for (what, fields, form, says) in cases {
        let answer = post(&app, &action, fields, form).await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{what}: {}",
            answer.body
        );
        assert_secured(&answer, what);
        for words in ["Forbidden: not blocked", "Nothing was blocked", says] {
            assert!(answer.body.contains(words), "{what}: {}", answer.body);
        }
    }
    assert!(limiter.check(&login, &mallory).await.unwrap().is_allowed());
    let status = limiter.status(&login, &mallory).await.unwrap();
    assert!(status.locked_until().is_none(), "not blocked");
    assert!(limiter.audit(None, 10).await.unwrap().is_empty());

    let hour = Duration::from_secs(3600);
    limiter
        .block(&login, &mallory, hour, "setup", "setup")
        .await
        .unwrap();
    let found = look_up(&app, "login", "mallory@example.com").await;
    let (action, _, token) = forms(lookup_part(&found.body), "unblock").pop().unwrap();
    let cross_site = [
        ("sec-fetch-site", "cross-site"),
        ("origin", "https://evil.example"),
    ];
    let form = [("key", key), ("token", &token), ("reason", REASON)];
    let answer = post(&app, &action, &cross_site, &form).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
    assert!(
        answer.body.contains("Nothing was unblocked"),
        "{}",
        answer.body
    );
    assert!(limiter.check(&login, &mallory).await.unwrap().is_refused());
    assert_eq!(limiter.audit(None, 10).await.unwrap().len(), 1);
}

/// A limit's page shows its newest audit entries, at most
/// `Admin::AUDIT_ENTRIES`, newest first, and only its own: who and why as
/// text (whatever was typed), the key as a row shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limits_page_shows_its_newest_audit_entries() {
    let db = fresh_db().await;
    let limiter = limiter_on(db.config());
    let login = limit("login", 5);
    let reset_password = limit("reset-password", 5);
    let app = app(&limiter, &[login.clone(), reset_password.clone()]);
    for i in 0..25 {
        let key = Key::email(&format!("user{i}@example.com"));
        let why = format!("reason {i}");
        limiter.unlock(&login, &key, "ann", &why).await.unwrap();
    }
    let look_alike = Key::new(["email", "alice@example.com\u{200B}"]).unwrap();
    let hour = Duration::from_secs(3600);
    let (who, why) = ("<b>eve</b>", "<script>alert(1)</script> & \"more\"");
    limiter
        .block(&login, &look_alike, hour, who, why)
        .await
        .unwrap();
    let other = Key::email("other@example.com");
    limiter
        .unlock(&reset_password, &other, "ann", REASON)
        .await
        .unwrap();

    let page = get(&app, &format!("{MOUNT}/login")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let audit = &page.body[page.body.find("<h2>Audit</h2>").unwrap()..];
    let rows = audit_rows(audit);
    let entries = admin::Admin::<Postgres<tokio_postgres::Config>>::AUDIT_ENTRIES;
    assert_eq!(rows.len(), entries, "{audit}");
    assert_eq!(
        [&rows[0][1], &rows[0][2], &rows[0][3], &rows[0][5]],
        [who, "block", "email|alice@example.com\\u{200b}", why],
        "{audit}"
    );
    let reasons: Vec<&str> = rows[1..].iter().map(|row| row[5].as_str()).collect();
    let newest: Vec<String> = (6..25).rev().map(|i| format!("reason {i}")).collect();
    assert_eq!(reasons, newest);
    assert!(!page.body.contains("other@example.com"), "another limit's");
    for raw in ["<script", "<b>eve"] {
        assert!(!page.body.contains(raw), "{raw:?} in {audit}");
    }
}

/// The budget of calls that must be counted (the suite's `PATIENT`).
const PATIENT: Duration = Duration::from_secs(10);

/// A limit over a window no test straddles.
fn limit(name: &str, max: u32) -> Limit {
    Limit::new(name, max, Duration::from_secs(30 * 24 * 60 * 60)).expect("a valid limit")
}
