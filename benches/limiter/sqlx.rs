//! `failed` over sqlx (feature `sqlx`): a limiter over an sqlx `PgPool` of
//! as many connections as callers (1 and [`WIDE`]), random keys, merging
//! and the refusal cache off, one statement per call, measured in the same
//! rounds as `failed` over tokio-postgres, right after it and right after
//! the same floor (the prepared lone upsert). The pool has
//! `test_before_acquire(false)`: by default sqlx pings a connection before
//! lending it, a round trip of the pool's that is not the limiter's (the
//! guide's "Drivers" says so). Without the feature the row is left out and
//! the report says so.

use crate::WIDE;
use crate::measure::{Sample, Summary};
use crate::operations::{Keys, What};
use crate::report::{Results, show_ratio};

/// `failed` over an sqlx pool for 1 and for [`WIDE`] callers: a pool of
/// that many connections, all open before the run, with one limiter per
/// caller over it (each with neither merging nor the refusal cache, as the
/// tokio-postgres limiters); and with the defaults, through one limiter
/// over the pool that its callers share, a fresh one each measurement.
#[cfg(feature = "sqlx")]
pub(crate) async fn ops(
    url: &str,
    limit: &platformkit_limit::Limit,
) -> Vec<(usize, crate::operations::Op, crate::operations::MakeOp)> {
    use std::sync::Arc;

    use platformkit_limit::Postgres;
    use sqlx::postgres::PgPoolOptions;

    use crate::operations::{defaults_limiter, limiter, limiter_op, shared_failed_op};

    let mut ops = Vec::new();
    for conns in [1, WIDE] {
        let size = u32::try_from(conns).expect("a few connections");
        let pool = PgPoolOptions::new()
            .max_connections(size)
            .min_connections(size)
            .test_before_acquire(false)
            .connect(url)
            .await
            .unwrap_or_else(|e| panic!("an sqlx pool: {e}"));
        // Open every connection now, not during a measurement.
        let held = futures::future::try_join_all((0..conns).map(|_| pool.acquire()))
            .await
            .unwrap_or_else(|e| panic!("the sqlx pool's connections: {e}"));
        drop(held);
        let limiters = Arc::new(
            (0..conns)
                .map(|_| limiter(Postgres::new(pool.clone())))
                .collect::<Vec<_>>(),
        );
        // A fresh limiter for each measurement, as over tokio-postgres.
        let (shared_pool, shared_limit) = (pool.clone(), Arc::new(limit.clone()));
        let defaults: crate::operations::MakeOp = Arc::new(move || {
            shared_failed_op(
                Arc::new(defaults_limiter(Postgres::new(shared_pool.clone()))),
                Arc::clone(&shared_limit),
            )
        });
        ops.push((
            conns,
            limiter_op(limiters, limit.clone(), What::SqlxFailed),
            defaults,
        ));
    }
    ops
}

/// Whether `failed` over sqlx was measured.
pub(crate) fn measured(results: &Results) -> bool {
    !results
        .row(What::SqlxFailed, Some(Keys::Random), 1)
        .samples
        .is_empty()
}

/// Per round, at `conns`: `failed` over sqlx over `failed` over
/// tokio-postgres, p50 and ops/s.
pub(crate) fn over_tokio_postgres(results: &Results, conns: usize) -> (Summary, Summary) {
    let sqlx = results.row(What::SqlxFailed, Some(Keys::Random), conns);
    let tokio_postgres = results.row(What::Failed, Some(Keys::Random), conns);
    ratios(&sqlx.samples, &tokio_postgres.samples)
}

/// Per round, at `conns`: `failed` with the defaults over sqlx over the
/// same over tokio-postgres, p50 and ops/s.
pub(crate) fn defaults_over_tokio_postgres(results: &Results, conns: usize) -> (Summary, Summary) {
    let sqlx = results.row(What::SqlxDefaults, Some(Keys::Random), conns);
    let tokio_postgres = results.row(What::DefaultsFailed, Some(Keys::Random), conns);
    ratios(&sqlx.samples, &tokio_postgres.samples)
}

fn ratios(sqlx: &[Sample], tokio_postgres: &[Sample]) -> (Summary, Summary) {
    let rounds = || sqlx.iter().zip(tokio_postgres);
    (
        Summary::of(rounds().map(|(s, t)| s.p50_us / t.p50_us)),
        Summary::of(rounds().map(|(s, t)| s.ops_per_sec / t.ops_per_sec)),
    )
}

pub(crate) fn print(results: &Results) {
    if !measured(results) {
        println!("failed over sqlx: not measured (build with --features sqlx)");
        return;
    }
    println!(
        "failed over sqlx (PgPool, test_before_acquire off) / failed over tokio-postgres, random \
         keys, the same rounds; median [range] of per-round ratios:"
    );
    for (what, over) in [
        (
            "one statement per call",
            over_tokio_postgres as fn(&Results, usize) -> _,
        ),
        ("the defaults, one limiter", defaults_over_tokio_postgres),
    ] {
        for conns in [1, WIDE] {
            let (p50, ops) = over(results, conns);
            println!(
                "  {what}, {conns:>2} connection{}: p50 {}, ops/s {}",
                if conns == 1 { " " } else { "s" },
                show_ratio(&p50),
                show_ratio(&ops)
            );
        }
    }
}
