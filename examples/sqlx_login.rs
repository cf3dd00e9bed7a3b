//! A login limited over the service's own sqlx `PgPool`: no second pool.
//!
//! ```text
//! cargo run --example sqlx_login --features sqlx
//! ```
//!
//! `Attempt` and `Logins` are all a service writes for the limiter, beside
//! `platformkit-limit = { version = "0.1", features = ["sqlx"] }` in its
//! Cargo.toml: 29 lines, around its own password check, and no second pool.
//! The limiter borrows a connection from the service's `PgPool` for each
//! call and gives it back idle, as the service's own queries do.
//!
//! `main` starts a throwaway PostgreSQL (or uses `DATABASE_URL`, a superuser
//! URL) and applies `schema.sql`; a real service runs `SCHEMA` in its
//! migrations and connects with its own URL.

use std::time::Duration;

use platformkit_limit::{Key, Limit, Limiter, Postgres};
use sqlx::PgPool;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

// What a service writes: from here to `password_is_right`, which stands in
// for its own check.

/// How a login attempt ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Attempt {
    SignedIn,
    WrongPassword,
    /// Answer 429 with `Retry-After`, rounded up to whole seconds.
    Refused(Duration),
}

/// The service's logins: one limiter over the service's own pool.
pub struct Logins {
    limiter: Limiter<Postgres<PgPool>>,
    login: Limit,
}

impl Logins {
    pub fn new(pool: PgPool) -> Result<Self, platformkit_limit::Error> {
        let limiter = Limiter::new(Postgres::new(pool));
        let login = Limit::new("login", 3, Duration::from_secs(15 * 60))?;
        Ok(Logins { limiter, login })
    }

    pub async fn attempt(&self, email: &str, password: &str) -> Result<Attempt, BoxError> {
        let account = Key::email(email);
        let verdict = self.limiter.check(&self.login, &account).await?;
        if verdict.is_refused() {
            return Ok(Attempt::Refused(verdict.retry_after().unwrap_or_default()));
        }
        // The service's own password check, on the pool the limiter uses.
        if password_is_right(self.limiter.store().conns(), email, password).await? {
            return Ok(Attempt::SignedIn);
        }
        self.limiter.failed(&self.login, &account).await?;
        Ok(Attempt::WrongPassword)
    }
}

/// Stands in for the service's own password check (which stores a hash, not
/// this), on the same pool.
async fn password_is_right(pool: &PgPool, email: &str, password: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT FROM accounts WHERE email = $1 AND password = $2)")
        .bind(email)
        .bind(password)
        .fetch_one(pool)
        .await
}

/// The demo: an account, a good password, three wrong ones, and a good one
/// refused because the window is closed. What each attempt got, in order.
pub async fn demo(pool: PgPool) -> Result<Vec<Attempt>, BoxError> {
    // Stands in for the service's users table.
    sqlx::raw_sql(
        "CREATE TABLE accounts (email text PRIMARY KEY, password text NOT NULL);
         INSERT INTO accounts VALUES ('alice@example.com', 'correct horse');",
    )
    .execute(&pool)
    .await?;
    let logins = Logins::new(pool)?;
    let mut attempts = Vec::new();
    for password in ["correct horse", "guess", "guess", "guess", "correct horse"] {
        let attempt = logins.attempt("alice@example.com", password).await?;
        println!("{password:>14}: {attempt:?}");
        attempts.push(attempt);
    }
    Ok(attempts)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    println!("starting a throwaway PostgreSQL (or using DATABASE_URL) ...");
    let server = tokio::task::spawn_blocking(platformkit_limit_testdb::Server::shared).await?;
    let db = server.database(platformkit_limit::SCHEMA).await;
    let pool = PgPool::connect(&db.url()).await?;
    demo(pool).await?;
    Ok(())
}
