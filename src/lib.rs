//! A rate limiter whose state is a row in PostgreSQL: one limit shared by
//! every replica, outliving every deploy.
//!
//! A [`Limiter`] answers "may this attempt go ahead?" with a [`Verdict`] and
//! counts what you tell it to. Its store is [`Postgres`], where each key's
//! count in each window is a row of `platformkit.platformkit_limits` (apply
//! [`SCHEMA`] in your migrations, then [`grants`]), or [`Memory`], the same
//! limiter in a map for your unit tests. Each call to `Postgres` borrows one
//! connection from your [`LimitConn`] (a pool, an async closure, a config)
//! and sends one statement. When the database cannot be reached within the
//! budget, the limit's [`WhenUnreachable`] decides and the verdict says so;
//! every other failure is an [`Error`]. [`Postgres::migrate`] applies the
//! schema at start-up.
//!
//! ```
//! use platformkit_limit::{Key, Limit, Limiter, Memory};
//! use std::time::Duration;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! // In production: Limiter::new(Postgres::new(pool)).
//! let limiter = Limiter::new(Memory::new());
//! let login = Limit::new("login", 3, Duration::from_secs(15 * 60))?;
//! let alice = Key::email("alice@example.com");
//!
//! for _ in 0..3 {
//!     // Before the password work:
//!     assert!(limiter.check(&login, &alice).await?.is_allowed());
//!     // After a wrong password:
//!     limiter.failed(&login, &alice).await?;
//! }
//! let verdict = limiter.check(&login, &alice).await?;
//! assert!(verdict.is_refused());
//! assert!(verdict.retry_after().is_some()); // for a 429's Retry-After
//! # Ok::<(), platformkit_limit::Error>(())
//! # }).unwrap();
//! ```
//!
//! How a call works, and why (the procedures, the refusal cache, merging,
//! windows, fail-open), is in the [`guide`]. Start from [`Limiter`]
//! (`check`, `failed`, `hit`, [`reserve`](Limiter::reserve), `reset`, and
//! an [`Ask`]'s cost for an ask of several units),
//! [`Limit`] and [`Key`]; then [`Postgres`], [`purge`] and the [`metric`]s.
//!
//! # Features
//!
//! - `deadpool`: [`LimitConn`] for `deadpool_postgres::Pool`, and
//!   `driver::Prepared` to prepare each statement once per connection;
//! - `bb8`: [`LimitConn`] for `bb8::Pool` of
//!   `bb8_postgres::PostgresConnectionManager`;
//! - `sqlx` (sqlx 0.8) and `sqlx-09` (sqlx 0.9): [`LimitConn`] for
//!   `sqlx::PgPool`, and `driver::SqlxConn` to lend any sqlx PostgreSQL
//!   connection ([what sqlx cannot do](guide#what-sqlx-cannot-do-cancel));
//! - `tracing` (on by default): a warning on every fail-open, shed call
//!   and failed purge, an error when the layer answers 500, info on a purge
//!   (never the key);
//! - `tower`: `layer::LimitLayer`, a tower layer that limits requests by
//!   keys read from the request head, in front of any `http` service (axum,
//!   tonic, hyper); the [guide](guide#behind-a-tower-layer) says what it does;
//! - `axum`: `tower`, and `layer::client_ip` also reads axum's
//!   `ConnectInfo<SocketAddr>`.
//!
//! The admin page for support staff and the operator's tool are crates of
//! their own over this one's public API: `platformkit-limit-admin` and
//! `platformkit-limit-cli`.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]

mod cache;
mod call;
#[cfg(feature = "internal-checks")]
mod checks;
mod clock;
mod decide;
pub mod driver;
mod error;
pub mod guide;
mod headers;
mod key;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod layer;
mod limit;
mod limiter;
mod merge;
pub mod metric;
mod operation;
mod purging;
mod status;
mod store;
mod trace;
mod verdict;

pub use crate::clock::ManualClock;
pub use crate::driver::LimitConn;
pub use crate::error::{BoxError, Error, ErrorKind};
pub use crate::key::Key;
pub use crate::limit::{Limit, LimitBuilder, OnSuccess, Strategy, WhenUnreachable};
pub use crate::limiter::{
    Ask, Limiter, LimiterBuilder, Permit, Permits, Reservation, Reservations,
};
pub use crate::purging::{PurgeTask, purge};
pub use crate::status::KeyStatus;
pub use crate::store::Store;
pub use crate::store::memory::Memory;
pub use crate::store::postgres::Postgres;
pub use crate::store::sql::grants;
pub use crate::verdict::{Verdict, Verdicts};

/// The schema `platformkit`: the table `platformkit_limits` under row-level
/// security, and the limiter's routines. A script that is safe to apply
/// twice, for your own migrations; then run [`grants`] for the limiter's
/// role. PostgreSQL 14 or newer. The [guide](crate::guide#the-schema) says
/// what each part is for.
pub const SCHEMA: &str = store::sql::SCHEMA;

/// The version of [`SCHEMA`]: `SELECT platformkit.platformkit_schema_version()`
/// returns it in a database [`SCHEMA`] was applied to (the limiter's role may
/// run it once [`grants`] are given). It is raised by one whenever a release
/// changes the schema, so a database that returns less, or lacks the
/// function, needs [`SCHEMA`] applied again.
pub const SCHEMA_VERSION: u32 = store::sql::SCHEMA_VERSION;

/// Internals exposed for the fuzz targets and property tests (feature
/// `internal-checks`, which release builds leave off); not part of the
/// public API and not covered by semver.
#[cfg(feature = "internal-checks")]
#[doc(hidden)]
pub mod internal {
    pub use crate::key::{decode, is_default_ignorable, normalize_identity};

    /// The properties the fuzz targets check, runnable on stable.
    pub mod checks {
        pub use crate::checks::*;
    }
}
