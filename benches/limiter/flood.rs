//! The flood of a login: per account and per address, one limiter with
//! every default (the 2 s budget too) over 8 of the bench's connections. [`FLOODERS`] tasks keep
//! calling `reserve_all` from one address already at its limit, each call
//! with a fresh account, while an ordinary user (a fresh address and
//! account each call) logs in [`ORDINARY`] times. Measured per round: the
//! flood's attempts let through (a check: none), and the ordinary user's
//! p99 under the flood over its p99 alone, measured right before it on the
//! same limiter.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use platformkit_limit::{Key, Limit, Limiter, Postgres, Reservations};
use serde::Serialize;

use crate::measure::{median, sample};
use crate::operations::{Held, Pool};

/// How many tasks flood at once.
pub(crate) const FLOODERS: usize = 3_000;

/// How many logins the ordinary user makes, alone and under the flood.
const ORDINARY: usize = 300;

/// The connections the login's limiter has.
const CONNS: usize = 8;

/// One round's figures, and each round's.
#[derive(Default, Serialize)]
pub(crate) struct FloodResults {
    /// Attempts of the flood let through, per round.
    pub(crate) allowed: Vec<f64>,
    /// Attempts the flood made, per round.
    pub(crate) attempts: Vec<f64>,
    /// The ordinary user's p99 under the flood over its p99 alone, per
    /// round.
    pub(crate) p99_ratios: Vec<f64>,
    /// The ordinary user's p99, alone and under the flood, in µs, per
    /// round.
    pub(crate) p99_alone_us: Vec<f64>,
    pub(crate) p99_flood_us: Vec<f64>,
    /// The ordinary user's logins shed under the flood (its budget ran out
    /// while the server was busy), per round.
    pub(crate) ordinary_shed: Vec<f64>,
}

fn address(a: u8, b: u8, c: u8, d: u8) -> Key {
    Key::ip(IpAddr::V4(Ipv4Addr::new(a, b, c, d)))
}

/// The ordinary user's `ORDINARY` logins, one after another: each one's
/// time, and how many were shed. A login refused by a count is a bug of
/// the limiter, and ends the run.
async fn ordinary(
    limiter: &Limiter<Postgres<Pool>>,
    (per_account, per_address): (&Limit, &Limit),
    round: usize,
    part: u8,
) -> (Vec<Duration>, u64) {
    let mut shed = 0;
    let mut took = Vec::with_capacity(ORDINARY);
    for n in 0..ORDINARY {
        let account = Key::email(&format!("user{round}-{part}-{n}@example.com"));
        let from = address(198, part, (n / 256) as u8, (n % 256) as u8);
        let pairs = [(per_account, &account), (per_address, &from)];
        let started = Instant::now();
        let reserved = limiter.reserve_all(&pairs).await.expect("verdicts");
        took.push(started.elapsed());
        if let Reservations::Refused(verdicts) = &reserved {
            assert!(
                verdicts.iter().all(|v| v.is_allowed() || v.is_shed()),
                "an ordinary user was refused by a count under the flood: {verdicts:?}"
            );
            shed += 1;
        }
    }
    (took, shed)
}

/// One round of the flood, into `results`. The limits' windows are the
/// longest there is ([`Limit::MAX_WINDOW`]), so that no round crosses into
/// a new window midway (which would open the address again, as a fixed
/// window does: a 15-minute window let 50 through in a round that crossed
/// its edge).
pub(crate) async fn round(conns: &Arc<Vec<Held>>, round: usize, results: &mut FloodResults) {
    let pool = Pool::new(Arc::new(conns.iter().take(CONNS).cloned().collect()));
    // Every default, the budget's included: the flood's answers and the
    // user's must come within it.
    let limiter = Arc::new(Limiter::new(Postgres::new(pool)));
    let per_account =
        Limit::new(&format!("flood{round}-account"), 3, Limit::MAX_WINDOW).expect("a limit");
    let per_address =
        Limit::new(&format!("flood{round}-address"), 50, Limit::MAX_WINDOW).expect("a limit");
    let flooder = address(192, 0, 2, 7);
    for _ in 0..per_address.max() {
        limiter
            .hit(&per_address, &flooder)
            .await
            .expect("a verdict");
    }

    let (alone, _) = ordinary(&limiter, (&per_account, &per_address), round, 1).await;

    let done = Arc::new(AtomicBool::new(false));
    let allowed = Arc::new(AtomicU64::new(0));
    let attempts = Arc::new(AtomicU64::new(0));
    let flood: Vec<_> = (0..FLOODERS)
        .map(|task| {
            let (limiter, done, allowed, attempts) = (
                limiter.clone(),
                done.clone(),
                allowed.clone(),
                attempts.clone(),
            );
            let (per_account, per_address, flooder) =
                (per_account.clone(), per_address.clone(), flooder.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !done.load(Ordering::Relaxed) {
                    let account = Key::email(&format!("victim{round}-{task}-{n}@example.com"));
                    n += 1;
                    let pairs = [(&per_account, &account), (&per_address, &flooder)];
                    attempts.fetch_add(1, Ordering::Relaxed);
                    if let Ok(Reservations::Granted(_)) = limiter.reserve_all(&pairs).await {
                        allowed.fetch_add(1, Ordering::Relaxed);
                    }
                    // A client's next request comes over the network.
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let (under, shed) = ordinary(&limiter, (&per_account, &per_address), round, 2).await;
    done.store(true, Ordering::Relaxed);
    for task in flood {
        task.await.expect("a flooder");
    }

    let p99 = |took: Vec<Duration>| sample(took, Duration::from_secs(1), ORDINARY as u64).p99_us;
    let (alone, under) = (p99(alone), p99(under));
    results.allowed.push(allowed.load(Ordering::Relaxed) as f64);
    results
        .attempts
        .push(attempts.load(Ordering::Relaxed) as f64);
    results.p99_alone_us.push(alone);
    results.p99_flood_us.push(under);
    results.p99_ratios.push(under / alone);
    results.ordinary_shed.push(shed as f64);
}

/// The flood's lines of the report.
pub(crate) fn print(results: &FloodResults) {
    println!(
        "flood: {FLOODERS} tasks calling reserve_all (per account, per address) from one address \
         at its limit, a fresh account each call, one limiter with the defaults over {CONNS} \
         connections; an ordinary user ({ORDINARY} logins, a fresh address and account each) \
         alone, then under the flood"
    );
    println!(
        "  flood attempts {:.0}, let through {:.0}; ordinary user's p99 {:.0} µs alone, \
         {:.0} µs under the flood (×{:.2}), {:.0} of its logins shed",
        median(results.attempts.iter().copied()),
        median(results.allowed.iter().copied()),
        median(results.p99_alone_us.iter().copied()),
        median(results.p99_flood_us.iter().copied()),
        median(results.p99_ratios.iter().copied()),
        median(results.ordinary_shed.iter().copied()),
    );
}
