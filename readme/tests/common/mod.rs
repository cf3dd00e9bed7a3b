//! What both tests of the README's example share: a fresh role, and a
//! login request.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, header};
use platformkit_limit_testdb::TestDb;
use sqlx::PgPool;
use tower::ServiceExt as _;

pub const GOOD: &str = "password=correct+horse+battery+staple";
pub const WRONG: &str = "password=guess";

/// A login role of its own on a fresh database, allowed what a service's
/// role usually is on its own database (to create a schema in it), and a
/// pool as that role: `postgres://<role>@…/<database>`.
pub async fn as_a_new_role(db: &TestDb) -> (String, PgPool) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let role = format!(
        "svc_{}_{nanos}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let admin = db.connect_admin().await;
    let password = db
        .admin_config()
        .get_password()
        .map(|p| {
            format!(
                " PASSWORD '{}'",
                String::from_utf8_lossy(p).replace('\'', "''")
            )
        })
        .unwrap_or_default();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN{password};\n\
             GRANT CREATE ON DATABASE \"{}\" TO {role};",
            db.name()
        ))
        .await
        .expect("the role");
    let url = db.url().replacen("limit_owner", &role, 1);
    let pool = PgPool::connect(&url).await.expect("a pool as the new role");
    (role, pool)
}

pub async fn post_login(
    app: &Router,
    account: Option<&str>,
    form: &'static str,
) -> axum::response::Response {
    let mut request =
        Request::post("/login").header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(account) = account {
        request = request.header("x-account", account);
    }
    let request = request.body(Body::from(form)).expect("a request");
    app.clone().oneshot(request).await.expect("an answer")
}

/// Five wrong passwords for `account`, each answered 401 by the handler;
/// then a sixth login with `form`, refused by the limit before the handler:
/// its answer.
pub async fn refused_after_five_wrong(
    app: &Router,
    account: &str,
    form: &'static str,
) -> axum::response::Response {
    for n in 1..=5 {
        let answer = post_login(app, Some(account), WRONG).await;
        assert_eq!(
            answer.status(),
            axum::http::StatusCode::UNAUTHORIZED,
            "wrong password {n}"
        );
    }
    let refused = post_login(app, Some(account), form).await;
    assert_eq!(refused.status(), axum::http::StatusCode::TOO_MANY_REQUESTS);
    refused
}
