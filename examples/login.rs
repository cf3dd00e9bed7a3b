//! The demo: the README's path (a pool, `migrate`, the layer on a login
//! route) run by two replicas that share one limit, then a replica whose
//! database cannot be reached.
//!
//! ```text
//! cargo run --example login --features sqlx
//! cargo run --example login --features sqlx -- --metrics   # and the Prometheus text
//! ```
//!
//! It starts a throwaway PostgreSQL (or uses `DATABASE_URL`, which must then
//! name a superuser: the demo creates a database and roles).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::Form;
use axum::http::{Request, StatusCode, header, request::Parts, response};
use axum::routing::post;
use metrics_exporter_prometheus::PrometheusBuilder;
use platformkit_limit::{Key, Limit, Limiter, Postgres};
use platformkit_limit_testdb::Server;
use platformkit_limit_tower::LimitLayer;
use sqlx::PgPool;
use tower::ServiceExt as _;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const WINDOW: Duration = Duration::from_secs(15 * 60);

/// One replica of the service: its own pool, its own limiter, the login
/// route behind the layer, as in the README.
async fn replica(pool: PgPool) -> Result<Router, BoxError> {
    let store = Postgres::new(pool);
    store.migrate().await?;
    let limiter = Arc::new(Limiter::new(store));
    let login = Limit::new("login", 3, WINDOW)?;
    limiter.record([&login]).await?;
    let account = |head: &Parts| {
        let account = head.headers.get("x-account")?.to_str().ok()?;
        Some(Key::email(account))
    };
    let ok = |r: &response::Parts| r.status.is_success();
    let logins = LimitLayer::attempt(limiter, ok).limit(&login, account);
    Ok(Router::new().route("/login", post(sign_in).layer(logins)))
}

async fn sign_in(Form(form): Form<HashMap<String, String>>) -> StatusCode {
    match form.get("password").map(String::as_str) {
        Some("correct horse battery staple") => StatusCode::OK,
        _ => StatusCode::UNAUTHORIZED,
    }
}

/// A wrong password for alice, through `replica`; what came back.
async fn guess(replica: &Router) -> Result<(StatusCode, Option<u64>), BoxError> {
    let request = Request::post("/login")
        .header("x-account", "alice@example.com")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from("password=guess"))?;
    let answer = replica.clone().oneshot(request).await?;
    let retry_after = answer
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    Ok((answer.status(), retry_after))
}

/// `HH:MM:SS` UTC.
fn clock(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) % 86_400;
    format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let metrics = std::env::args()
        .any(|a| a == "--metrics")
        .then(|| PrometheusBuilder::new().install_recorder())
        .transpose()?;

    println!("starting a throwaway PostgreSQL (or using DATABASE_URL) ...");
    let server = tokio::task::spawn_blocking(Server::shared).await?;
    let db = server.empty_database().await;
    let a = replica(PgPool::connect(&db.url()).await?).await?;
    let b = replica(PgPool::connect(&db.url()).await?).await?;
    println!("two replicas, A and B, each with its own pool; the schema applied by both\n");
    println!("limit \"login\": 3 wrong passwords per account in a window of 15 minutes");

    for (n, (name, replica)) in [("A", &a), ("B", &b), ("A", &a)].into_iter().enumerate() {
        let (status, _) = guess(replica).await?;
        println!(
            "attempt {} on {name}: {status}, the handler ran: a failure, counted in the row both share",
            n + 1
        );
    }
    for (name, replica) in [("B", &b), ("A", &a)] {
        let (status, retry_after) = guess(replica).await?;
        assert_eq!(
            status,
            StatusCode::TOO_MANY_REQUESTS,
            "the 4th attempt is refused"
        );
        let secs = retry_after.unwrap_or_default();
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        let closes = UNIX_EPOCH + WINDOW * u32::try_from(now / WINDOW.as_secs() + 1)?;
        println!("attempt 4 on {name}: {status}, Retry-After: {secs}, the handler never ran");
        println!(
            "  why {secs} s: windows are aligned to the clock (:00, :15, :30, :45 UTC); \
             this one closes at {}, and then the count starts again",
            clock(closes)
        );
    }

    // A replica whose database cannot be reached: nothing listens on the
    // port. The limit allows the attempt (its default) and the handler runs.
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let unreachable = format!("postgres://limit_owner@127.0.0.1:{nowhere}/none");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy(&unreachable)?;
    let limiter = Arc::new(Limiter::new(Postgres::new(pool)));
    let login = Limit::new("login", 3, WINDOW)?;
    let verdict = limiter
        .check(&login, &Key::email("alice@example.com"))
        .await?;
    println!(
        "\nreplica C, database unreachable: allowed = {}, unreachable = {}",
        verdict.is_allowed(),
        verdict.is_unreachable()
    );
    println!(
        "  fail-open, loudly: the verdict says so, the metric counts outcome=\"unreachable\", \
         and a tracing warning names the limit (WhenUnreachable::Refuse would answer 503)"
    );
    assert!(verdict.is_allowed() && verdict.is_unreachable());

    match metrics {
        Some(metrics) => println!("\n# Prometheus exposition\n{}", metrics.render()),
        None => println!("\n(run with -- --metrics for the Prometheus exposition)"),
    }
    Ok(())
}
