//! `check` and `failed` through [`Prepared`](platformkit_limit::driver::Prepared)
//! (feature `deadpool`): each worker's limiter lends a held deadpool
//! `ClientWrapper` of its own, as the tokio-postgres limiters lend a held
//! `Client`, random keys, merging and the refusal cache off. Each is
//! measured in the same rounds as the same call sent as one unnamed
//! statement, right after it, and compared to it. Every connection has
//! prepared its statements before the run. Without the feature the rows are
//! left out and the report says so.

use crate::WIDE;
use crate::measure::Summary;
use crate::operations::{Keys, What};
use crate::report::{Results, show_ratio};

/// `check` and `failed` through `Prepared`, each over [`WIDE`] held
/// connections (the first alone at 1 caller).
#[cfg(feature = "deadpool")]
pub(crate) async fn ops(
    config: &tokio_postgres::Config,
    limit: &platformkit_limit::Limit,
) -> Vec<(What, crate::operations::Op)> {
    use std::convert::Infallible;
    use std::sync::Arc;

    use deadpool_postgres::ClientWrapper;
    use platformkit_limit::driver::Prepared;
    use platformkit_limit::{Key, Postgres};
    use tokio::sync::Mutex;

    use crate::operations::{limiter, limiter_op};

    let mut limiters = Vec::with_capacity(WIDE);
    for _ in 0..WIDE {
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("a connection for Prepared: {e}"));
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        let held = Arc::new(Mutex::new(ClientWrapper::new(client, task)));
        let limiter = limiter(Postgres::new(move || {
            let held = Arc::clone(&held);
            async move { Ok::<_, Infallible>(Prepared(held.lock_owned().await)) }
        }));
        // Prepare both statements now, not during a measurement.
        let warm = Key::opaque("prepared-warm-up");
        limiter.check(limit, &warm).await.expect("a check");
        limiter.failed(limit, &warm).await.expect("a failed");
        limiters.push(limiter);
    }
    let limiters = Arc::new(limiters);
    [What::PreparedCheck, What::PreparedFailed]
        .into_iter()
        .map(|what| (what, limiter_op(Arc::clone(&limiters), limit.clone(), what)))
        .collect()
}

/// Whether the calls through `Prepared` were measured.
pub(crate) fn measured(results: &Results) -> bool {
    !results
        .row(What::PreparedCheck, Some(Keys::Random), 1)
        .samples
        .is_empty()
}

/// Per round, at `conns`: `what` through `Prepared` over the same call as
/// one unnamed statement, p50 and ops/s.
fn over_one_message(results: &Results, what: What, conns: usize) -> (Summary, Summary) {
    let prepared = results.row(what, Some(Keys::Random), conns);
    let unnamed = results.row(
        what.floor().expect("compared to the one-message call"),
        Some(Keys::Random),
        conns,
    );
    let rounds = || prepared.samples.iter().zip(&unnamed.samples);
    (
        Summary::of(rounds().map(|(p, u)| p.p50_us / u.p50_us)),
        Summary::of(rounds().map(|(p, u)| p.ops_per_sec / u.ops_per_sec)),
    )
}

pub(crate) fn print(results: &Results) {
    if !measured(results) {
        println!("through Prepared: not measured (build with --features deadpool)");
        return;
    }
    println!(
        "through Prepared (each statement prepared once per connection) / one unnamed \
         statement per call, random keys, the same rounds; median [range] of per-round ratios:"
    );
    for what in [What::PreparedCheck, What::PreparedFailed] {
        for conns in [1, WIDE] {
            let (p50, ops) = over_one_message(results, what, conns);
            println!(
                "  {:<6} {conns:>2} connection{}: p50 {}, ops/s {}",
                if what == What::PreparedCheck {
                    "check"
                } else {
                    "failed"
                },
                if conns == 1 { " " } else { "s" },
                show_ratio(&p50),
                show_ratio(&ops)
            );
        }
    }
}
