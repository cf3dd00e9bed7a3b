//! The integration tests, one binary: each file under `tests/` is a module
//! here and keeps its path (`tests/floods.rs` is `floods`, its tests are
//! `floods::NAME`), and [`common`] is compiled once for all of them. One
//! binary links once, where one per file linked every dependency again for
//! each file.
//!
//! Run one file's tests with `cargo test --all-features --test suite floods::`.
//! A file that needs features is declared only with them, as the files that
//! were binaries of their own required them.
//!
//! Binaries of their own, because they set process-wide state that the tests
//! here would share: `tests/axum_login.rs` and `tests/axum_sqlx.rs` (each
//! installs its example's global Prometheus recorder, and reads exact counts
//! from it) and `tests/tracing_events.rs` (tracing's per-callsite interest
//! cache races across tests in one process).

mod common;

mod agreement;
mod attempts;
mod axum_form_login;
mod budget;
mod bursts;
mod callers_transaction;
mod configuration;
mod dashboards;
#[cfg(all(feature = "sqlx", feature = "deadpool", feature = "bb8"))]
mod down_or_up;
#[cfg(all(feature = "sqlx", feature = "deadpool"))]
mod drivers;
mod failover;
#[cfg(feature = "deadpool")]
mod floods;
#[cfg(feature = "internal-checks")]
mod fuzz_corpus;
mod grpc;
mod hostile_keys;
mod hostile_sessions;
#[cfg(feature = "internal-checks")]
mod keys;
mod layer;
mod login_without_grants;
mod lost_updates;
mod merging;
mod metrics;
mod misconfiguration;
mod module_graph;
mod operations;
mod pgbouncer;
#[cfg(all(feature = "deadpool", feature = "bb8"))]
mod pools;
mod purge;
mod refusal_cache;
mod row_level_security;
mod schema;
mod several_limits;
mod shared_count;
#[cfg(feature = "sqlx")]
mod sqlx_login;
mod status;
mod unreachable;
