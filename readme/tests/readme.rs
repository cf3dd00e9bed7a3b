//! The README's example, exactly as README.md writes it (the build script
//! takes it out of the file), run against a real PostgreSQL: on a fresh
//! database, as a role of a name nobody chose for the example.

mod common;

use axum::body::Body;
use axum::http::{Request, header};
use common::{GOOD, WRONG, as_a_new_role, post_login, refused_after_five_wrong};
use platformkit_limit_testdb::Server;
use tower::ServiceExt as _;

include!(concat!(env!("OUT_DIR"), "/readme_example.rs"));

#[tokio::test(flavor = "multi_thread")]
async fn the_readmes_example_runs_as_written_on_a_fresh_database_as_any_role() {
    let server = tokio::task::spawn_blocking(Server::shared)
        .await
        .expect("a server");
    let db = server.empty_database().await;
    let (role, pool) = as_a_new_role(&db).await;

    let service = app(pool.clone()).await.expect("the README's app starts");

    // Five wrong passwords are answered by the handler; the sixth attempt
    // is refused before it, with a Retry-After.
    let alice = Some("alice@example.com");
    let refused = refused_after_five_wrong(&service, "alice@example.com", WRONG).await;
    assert!(
        refused.headers().contains_key(header::RETRY_AFTER),
        "{:?}",
        refused.headers()
    );
    // Even the right password waits out the window: the guesser cannot
    // learn it from the answer.
    let right = post_login(&service, alice, GOOD).await;
    assert_eq!(right.status(), StatusCode::TOO_MANY_REQUESTS);
    // Another account is its own count, and a good login counts nothing.
    for _ in 0..8 {
        let answer = post_login(&service, Some("bob@example.com"), GOOD).await;
        assert_eq!(answer.status(), StatusCode::OK);
    }

    // A login that names no account is the layer's 400, and counts nothing.
    let anonymous = post_login(&service, None, WRONG).await;
    assert_eq!(anonymous.status(), StatusCode::BAD_REQUEST);

    // The API counts every request and says so in the RateLimit fields.
    let request = Request::get("/api/items")
        .header("x-api-key", "demo")
        .body(Body::empty())
        .expect("a request");
    let answer = service.clone().oneshot(request).await.expect("an answer");
    assert_eq!(answer.status(), StatusCode::OK);
    let fields = answer.headers();
    assert!(fields.contains_key("ratelimit-policy"), "{fields:?}");
    assert!(fields.contains_key("ratelimit"), "{fields:?}");

    // A restart runs the same start-up again over the same database.
    let again = app(pool).await.expect("the README's app starts again");
    let still = post_login(&again, alice, WRONG).await;
    assert_eq!(
        still.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the count outlived the restart"
    );

    // The role the example ran as owns what it created: nothing else had to
    // exist beforehand, and no grant named a role.
    let admin = db.connect_admin().await;
    let owner: String = admin
        .query_one(
            "SELECT tableowner::text FROM pg_tables WHERE schemaname = 'platformkit' \
             AND tablename = 'platformkit_limits'",
            &[],
        )
        .await
        .expect("the table")
        .get(0);
    assert_eq!(owner, role);
}
