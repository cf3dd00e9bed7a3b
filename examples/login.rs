//! The demo: two replicas share one login limit, and an unreachable database
//! lets the attempt through and says so.
//!
//! ```text
//! cargo run --example login
//! ```
//!
//! It starts a throwaway PostgreSQL (or uses `DATABASE_URL`, which must then
//! name a superuser: the demo creates a database and roles), applies
//! `schema.sql`, and prints the Prometheus text exposition at the end.

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use platformkit_limit::{Key, Limit, Limiter, Postgres, SCHEMA, Verdict};
use platformkit_limit_testdb::Server;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let metrics = PrometheusBuilder::new().install_recorder()?;

    println!("starting a throwaway PostgreSQL (or using DATABASE_URL) ...");
    let server = Server::shared();
    let db = server.database(SCHEMA).await;
    println!(
        "database {} on {}:{}, schema.sql applied\n",
        db.name(),
        server.host(),
        server.port()
    );

    // Two replicas of one service: each has its own connections (here a
    // connection per call), and they share nothing but the database.
    let replica_a = Limiter::new(Postgres::new(db.config()));
    let replica_b = Limiter::new(Postgres::new(db.config()));
    let login = Limit::new("login", 3, Duration::from_secs(15 * 60))?;
    let alice = Key::new(["email", "alice@example.com"])?;

    println!(
        "limit {:?}: {} failures per {:?}",
        login.name(),
        login.max(),
        login.window()
    );
    for (attempt, (replica, limiter)) in [("A", &replica_a), ("B", &replica_b), ("A", &replica_a)]
        .into_iter()
        .enumerate()
    {
        let before = limiter.check(&login, &alice).await?;
        let after = limiter.failed(&login, &alice).await?;
        println!(
            "attempt {} on replica {replica}: check {}, wrong password, failures now {}",
            attempt + 1,
            show(&before),
            after.count().unwrap_or_default(),
        );
    }
    for (replica, limiter) in [("A", &replica_a), ("B", &replica_b)] {
        let verdict = limiter.check(&login, &alice).await?;
        println!("attempt 4 on replica {replica}: {}", show(&verdict));
        assert!(verdict.is_refused(), "the 4th attempt must be refused");
    }

    // A replica whose database cannot be reached: nothing listens on the
    // port. The attempt is allowed, and the verdict says why.
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    // A fresh config: adding a port to one that has one would be
    // a configuration error, not an unreachable server.
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(nowhere).user("limit_owner");
    let cut_off = Limiter::builder(Postgres::new(config))
        .budget(Duration::from_millis(500))
        .build()?;
    let verdict = cut_off.check(&login, &alice).await?;
    println!("\nreplica C, database unreachable: {}", show(&verdict));
    assert!(verdict.is_allowed() && verdict.is_unreachable());

    println!("\n# Prometheus exposition\n{}", metrics.render());
    Ok(())
}

fn show(verdict: &Verdict) -> String {
    if let Some(cause) = verdict.unreachable() {
        return format!("ALLOWED because the store is unreachable ({cause})");
    }
    match (verdict.is_allowed(), verdict.retry_after()) {
        (true, _) => format!("allowed, {} left", verdict.remaining().unwrap_or_default()),
        (false, Some(wait)) => format!(
            "REFUSED ({} failures), retry after {}s",
            verdict.count().unwrap_or_default(),
            wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
        ),
        (false, None) => "REFUSED".to_owned(),
    }
}
