//! The admin page for support staff, over a throwaway PostgreSQL with a
//! few keys refused already.
//!
//! ```text
//! cargo run -p platformkit-limit-admin --example admin   # on 127.0.0.1:3000
//! open http://127.0.0.1:3000/support/limits/login
//! ```
//!
//! A real service mounts the router behind its own staff authentication:
//! the admin router has none, and anyone who reaches it can unlock or block
//! any key of its limits. This example listens on the loopback address
//! only; its stand-in for a staff login names everyone "example staff", as
//! the audit shows.
//!
//! It starts a throwaway PostgreSQL (or uses `DATABASE_URL`, a superuser
//! URL) and applies `schema.sql`; a real service runs `SCHEMA` in its
//! migrations.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::middleware::map_request;
use axum::response::Redirect;
use axum::routing::get;
use platformkit_limit::{Key, Limit, Limiter, Postgres};
use platformkit_limit_admin as admin;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = platformkit_limit_testdb::Server::shared();
    let db = server.database(platformkit_limit::SCHEMA).await;
    let limiter = Arc::new(Limiter::new(Postgres::new(db.config())));
    let login = Limit::builder("login", 5, Duration::from_secs(15 * 60))
        .lockout(Duration::from_secs(60 * 60))
        .build()?;
    let reset_password = Limit::new("reset-password", 3, Duration::from_secs(60 * 60))?;

    // Who is refused: a few accounts, an address, a key that holds markup,
    // one too long to store whole; and one that is counting, not refused.
    let seeds = [
        (&login, Key::email("alice@example.com"), 5),
        (&login, Key::username("bob"), 7),
        (&login, Key::ip("203.0.113.7".parse()?), 6),
        (&login, Key::username("<script>alert(1)</script>"), 5),
        (&login, Key::opaque(&"session-".repeat(40)), 5),
        (&login, Key::email("carol@example.com"), 2),
        (&reset_password, Key::email("dave@example.com"), 3),
    ];
    for (limit, key, failures) in &seeds {
        for _ in 0..*failures {
            limiter.failed(limit, key).await?;
        }
    }

    // Who each unlock and block is by: what the service's staff login put
    // in the request.
    let support = admin::Admin::new(limiter.clone(), [login, reset_password])
        .staff(|request| request.extensions.get::<StaffMember>().map(|s| s.0.clone()))
        .router()?;
    let app = Router::new()
        .route("/", get(|| async { Redirect::to("/support/limits") }))
        .nest_service("/support/limits", support)
        .layer(map_request(signed_in));
    let address = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!(
        "listening on http://{}/support/limits",
        listener.local_addr()?
    );
    axum::serve(listener, app).await?;
    Ok(())
}

/// The staff member a request is from, as a staff login would mark it.
#[derive(Clone)]
struct StaffMember(String);

/// A stand-in for the service's staff login: every request is from one
/// member.
async fn signed_in(mut request: Request) -> Request {
    let member = StaffMember("example staff".to_owned());
    request.extensions_mut().insert(member);
    request
}
