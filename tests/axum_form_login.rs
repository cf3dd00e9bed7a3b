//! The form-login example service (the account in the body, limited in the
//! handler; the client address from a trusted proxy, limited by the layer)
//! on a loopback port, driven over real HTTP against real PostgreSQL: wrong
//! passwords refused with 429 after the limit's max, a good login not
//! counted, a form without an account answered 400, and `X-Forwarded-For`
//! believed only from the trusted proxy.

#[path = "../examples/axum_form_login.rs"]
#[allow(dead_code, reason = "the example's main is not used here")]
mod example;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use platformkit_limit::{Key, Limit, Limiter, Postgres, SCHEMA};
use platformkit_limit_testdb::{Server, TestDb};

use crate::common::http::send;
use example::{Limits, Proxies, router};

const WRONG: &str = "email=Alice%40Example.com&password=guess";
const RIGHT: &str = "email=alice%40example.com&password=correct+horse+battery+staple";
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The service over `db`, trusting `proxies`, on a loopback port.
async fn start(db: &TestDb, proxies: &[IpAddr]) -> SocketAddr {
    let limiter = Arc::new(Limiter::new(Postgres::new(db.config())));
    let app = router(
        limiter,
        Limits::new().expect("limits"),
        Proxies(proxies.into()),
    );
    crate::common::http::serve(app, true).await
}

/// The count of `key` under `limit`, read from the database by a limiter
/// of the test's own.
async fn count(db: &TestDb, limit: &Limit, key: &Key) -> u64 {
    let reader = Limiter::new(Postgres::new(db.config()));
    let verdict = reader.check(limit, key).await.expect("a check");
    verdict.count().expect("the store answered")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_login_counts_wrong_passwords_per_account_and_refuses_after_the_max() {
    let db = Server::shared().database(SCHEMA).await;
    let service = start(&db, &[]).await;
    let limits = Limits::new().expect("limits");
    let alice = Key::email("alice@example.com");

    // A good login is taken back: it never counts.
    for _ in 0..2 {
        let welcome = send(service, "POST", "/login", &[], RIGHT).await;
        assert_eq!(welcome.status, 200, "{}", welcome.body);
    }
    assert_eq!(count(&db, &limits.account, &alice).await, 0);

    // A form without an account: 400, and nothing counted anywhere.
    for _ in 0..5 {
        let anonymous = send(service, "POST", "/login", &[], "password=guess").await;
        assert_eq!(anonymous.status, 400, "{}", anonymous.body);
    }
    let blank = send(service, "POST", "/login", &[], "email=+&password=guess").await;
    assert_eq!(blank.status, 400, "{}", blank.body);
    assert_eq!(count(&db, &limits.account, &Key::email("")).await, 0);

    // Three wrong passwords (the max), then even the right one is refused.
    for attempt in 1..=3 {
        let wrong = send(service, "POST", "/login", &[], WRONG).await;
        assert_eq!(wrong.status, 401, "attempt {attempt}: {}", wrong.body);
    }
    assert_eq!(count(&db, &limits.account, &alice).await, 3);
    let refused = send(service, "POST", "/login", &[], RIGHT).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(
        refused.body, "too many requests\n",
        "the layer's own answer"
    );
    let wait = refused.retry_after().expect("a Retry-After header");
    assert!((1..=15 * 60).contains(&wait), "Retry-After {wait}");
    // Another account is apart.
    let bob = "email=bob%40example.com&password=guess";
    assert_eq!(send(service, "POST", "/login", &[], bob).await.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_forwarded_for_changes_the_key_only_from_a_trusted_proxy() {
    let db = Server::shared().database(SCHEMA).await;
    let limits = Limits::new().expect("limits");
    let spoofed: IpAddr = "203.0.113.9".parse().expect("an address");
    let forwarded = [("X-Forwarded-For", "198.51.100.1, 203.0.113.9")];

    // The test connects from 127.0.0.1, which this service does not trust:
    // the header is ignored and the peer is counted.
    let direct = start(&db, &["10.0.0.2".parse().expect("an address")]).await;
    let wrong = send(direct, "POST", "/login", &forwarded, WRONG).await;
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert_eq!(count(&db, &limits.address, &Key::ip(LOOPBACK)).await, 1);
    assert_eq!(count(&db, &limits.address, &Key::ip(spoofed)).await, 0);

    // This one trusts 127.0.0.1 as its proxy: the last entry is counted.
    let behind_proxy = start(&db, &[LOOPBACK]).await;
    let wrong = send(behind_proxy, "POST", "/login", &forwarded, WRONG).await;
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert_eq!(count(&db, &limits.address, &Key::ip(spoofed)).await, 1);
    assert_eq!(count(&db, &limits.address, &Key::ip(LOOPBACK)).await, 1);
    // Without the header, the proxy's own address.
    let wrong = send(behind_proxy, "POST", "/login", &[], WRONG).await;
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert_eq!(count(&db, &limits.address, &Key::ip(LOOPBACK)).await, 2);
}
