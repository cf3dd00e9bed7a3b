//! The operations: what is measured, through which limiter, over which
//! keys, and the block of a round that measures each right after its floor.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};

use platformkit_limit::{Key, Limit, LimitConn, Limiter, Memory, Postgres, Store, Verdict};
use tokio::sync::{Mutex, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};
use tokio_postgres::Client;

use crate::floors::{Floor, Prepared, floor_op, select1_op};
use crate::measure::{Sample, XorShift, measure};
use crate::report::Results;
use crate::{HOT_ID, KEY_SPACE, Mode, WIDE};

pub(crate) type Held = Arc<Mutex<Client>>;
pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
/// One call: given the worker's index and the key's id.
pub(crate) type Op = Arc<dyn Fn(usize, String) -> BoxFuture + Send + Sync>;

/// Makes an op afresh for each measurement (a limiter with nothing cached).
pub(crate) type MakeOp = Arc<dyn Fn() -> Op + Send + Sync>;

/// The attack's refused keys: how many.
pub(crate) const REFUSED_KEYS: u64 = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keys {
    /// Drawn uniformly from `0..KEY_SPACE` for each call.
    Random,
    /// The same key for every call.
    Hot,
    /// Drawn uniformly from the [`REFUSED_KEYS`] keys the attack finds
    /// refused.
    Refused,
}

impl Keys {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Keys::Random => "random",
            Keys::Hot => "hot",
            Keys::Refused => "refused",
        }
    }

    pub(crate) fn draw(self, rng: &mut XorShift) -> String {
        match self {
            Keys::Random => (rng.next() % KEY_SPACE).to_string(),
            Keys::Hot => HOT_ID.to_owned(),
            Keys::Refused => refused_id(rng.next() % REFUSED_KEYS),
        }
    }
}

/// The id of the `n`th key the attack finds refused.
pub(crate) fn refused_id(n: u64) -> String {
    format!("refused-{n}")
}

/// The address that goes with a random key's account in the several-limits
/// calls: a different address for each account, spread over the whole IPv4
/// space.
fn address_of(id: &str) -> IpAddr {
    let n: u64 = id.parse().expect("random keys are numbers");
    let mixed = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    IpAddr::V4(Ipv4Addr::from(
        u32::try_from(mixed).expect("the top half of a u64 fits in a u32"),
    ))
}

/// The cost [`What::HitN`] asks with: an API call that counts five units.
const HIT_COST: std::num::NonZeroU32 = std::num::NonZeroU32::new(5).expect("five");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum What {
    /// A bare round trip: the floor of nothing, shown to split the costs.
    Select1,
    /// Floor: `platformkit_limit_add`'s upsert alone, prepared.
    Upsert,
    /// Floor: `platformkit_limit_read`'s read alone, prepared.
    Read,
    Check,
    Failed,
    Hit,
    /// `hit` with a cost of [`HIT_COST`], right after `hit`.
    HitN,
    /// `hit_all` over two (limit, key) pairs, right after `hit`.
    HitAll,
    /// `hit_all_or_nothing` over the same two pairs, right after `hit`.
    HitAllOrNothing,
    Reset,
    /// `check_all` over two (limit, key) pairs: per account and per address.
    CheckAll,
    /// `failed_all` over the same two pairs.
    FailedAll,
    /// `failed` with relaxed durability.
    RelaxedFailed,
    /// `failed`, connecting for each call.
    ConnectPerCall,
    /// `failed` on the in-process fake.
    Memory,
    /// `failed` with the defaults (refusal cache and merging on), through
    /// one limiter shared by [`WIDE`] callers over [`WIDE`] connections.
    DefaultsFailed,
    /// As `DefaultsFailed`, with this many writes in flight, fixed: one of
    /// [`SWEPT_PLACES`].
    DefaultsPlaces(usize),
    /// `failed` over an sqlx `PgPool` of as many connections as callers
    /// (feature `sqlx`, [`crate::sqlx`]).
    SqlxFailed,
    /// `failed` with the defaults through one limiter over that `PgPool`,
    /// shared by its callers: the README's path.
    SqlxDefaults,
    /// `check` through `Prepared`: its statement prepared once per
    /// connection (feature `deadpool`, [`crate::prepared`]).
    PreparedCheck,
    /// `failed` through `Prepared`.
    PreparedFailed,
}

impl What {
    pub(crate) fn label(self) -> &'static str {
        match self {
            What::Select1 => "SELECT 1 (round trip)",
            What::Upsert => "upsert alone (floor)",
            What::Read => "read alone (floor)",
            What::Check => "check",
            What::Failed => "failed",
            What::Hit => "hit",
            What::HitN => "hit, cost 5",
            What::HitAll => "hit_all, 2 limits",
            What::HitAllOrNothing => "hit_all_or_nothing, 2 limits",
            What::Reset => "reset",
            What::CheckAll => "check_all, 2 limits",
            What::FailedAll => "failed_all, 2 limits",
            What::RelaxedFailed => "failed, relaxed durability",
            What::ConnectPerCall => "failed, connect per call",
            What::Memory => "failed, Memory",
            What::DefaultsFailed => "failed, defaults, 1 limiter",
            What::DefaultsPlaces(2) => "  the same, 2 writes in flight",
            What::DefaultsPlaces(4) => "  the same, 4 writes in flight",
            What::DefaultsPlaces(8) => "  the same, 8 writes in flight",
            What::DefaultsPlaces(16) => "  the same, 16 writes in flight",
            What::DefaultsPlaces(_) => unreachable!("only SWEPT_PLACES are measured"),
            What::SqlxFailed => "failed over sqlx",
            What::SqlxDefaults => "failed over sqlx, defaults, 1 limiter",
            What::PreparedCheck => "check, Prepared",
            What::PreparedFailed => "failed, Prepared",
        }
    }

    pub(crate) fn json_name(self) -> &'static str {
        match self {
            What::Select1 => "select_1",
            What::Upsert => "upsert_alone",
            What::Read => "read_alone",
            What::Check => "check",
            What::Failed => "failed",
            What::Hit => "hit",
            What::HitN => "hit_n_cost_5",
            What::HitAll => "hit_all_2_limits",
            What::HitAllOrNothing => "hit_all_or_nothing_2_limits",
            What::Reset => "reset",
            What::CheckAll => "check_all_2_limits",
            What::FailedAll => "failed_all_2_limits",
            What::RelaxedFailed => "failed_relaxed_durability",
            What::ConnectPerCall => "failed_connect_per_call",
            What::Memory => "failed_memory",
            What::DefaultsFailed => "failed_defaults_shared_limiter",
            What::DefaultsPlaces(2) => "failed_defaults_2_writes_in_flight",
            What::DefaultsPlaces(4) => "failed_defaults_4_writes_in_flight",
            What::DefaultsPlaces(8) => "failed_defaults_8_writes_in_flight",
            What::DefaultsPlaces(16) => "failed_defaults_16_writes_in_flight",
            What::DefaultsPlaces(_) => unreachable!("only SWEPT_PLACES are measured"),
            What::SqlxFailed => "failed_sqlx",
            What::SqlxDefaults => "failed_sqlx_defaults_shared_limiter",
            What::PreparedCheck => "check_prepared",
            What::PreparedFailed => "failed_prepared",
        }
    }

    /// What this is compared to, measured right before it.
    pub(crate) fn floor(self) -> Option<What> {
        match self {
            What::Check => Some(What::Read),
            What::Failed
            | What::Hit
            | What::Reset
            | What::DefaultsFailed
            | What::DefaultsPlaces(_)
            | What::SqlxFailed
            | What::SqlxDefaults => Some(What::Upsert),
            What::CheckAll | What::PreparedCheck => Some(What::Check),
            What::HitN | What::HitAll | What::HitAllOrNothing => Some(What::Hit),
            What::FailedAll | What::RelaxedFailed | What::ConnectPerCall | What::PreparedFailed => {
                Some(What::Failed)
            }
            What::Select1 | What::Upsert | What::Read | What::Memory => None,
        }
    }

    /// What is measured right after this, over random keys, at the same
    /// concurrency, and compared to it.
    fn followed_by(self) -> &'static [What] {
        match self {
            What::Check => &[What::CheckAll, What::PreparedCheck],
            What::Failed => &[What::FailedAll, What::RelaxedFailed, What::PreparedFailed],
            What::Hit => &[What::HitN, What::HitAll, What::HitAllOrNothing],
            _ => &[],
        }
    }
}

/// Lends one held connection to one call at a time.
pub(crate) fn lend(
    held: Held,
) -> impl LimitConn<Conn = OwnedMutexGuard<Client>, Error = Infallible> {
    move || {
        let held = Arc::clone(&held);
        async move { Ok::<_, Infallible>(held.lock_owned().await) }
    }
}

/// Lends any idle one of several held connections, one call at a time
/// each, and counts the connections it lends. The store borrows one
/// connection for each statement it sends, so the count is the statements
/// sent, exactly.
#[derive(Clone)]
pub(crate) struct Pool {
    conns: Arc<Vec<Held>>,
    idle: Arc<std::sync::Mutex<Vec<usize>>>,
    permits: Arc<Semaphore>,
    lent: Arc<AtomicU64>,
}

impl Pool {
    pub(crate) fn new(conns: Arc<Vec<Held>>) -> Pool {
        Pool {
            idle: Arc::new(std::sync::Mutex::new((0..conns.len()).collect())),
            permits: Arc::new(Semaphore::new(conns.len())),
            lent: Arc::new(AtomicU64::new(0)),
            conns,
        }
    }

    /// The connections lent so far: the statements sent through the pool.
    pub(crate) fn lent(&self) -> u64 {
        self.lent.load(Ordering::Relaxed)
    }
}

/// A connection lent by a [`Pool`]: idle again when dropped.
pub(crate) struct Lent {
    client: Option<OwnedMutexGuard<Client>>,
    index: usize,
    idle: Arc<std::sync::Mutex<Vec<usize>>>,
    _permit: OwnedSemaphorePermit,
}

impl Deref for Lent {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.client.as_deref().expect("lent until dropped")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // The connection first, then its index, then (as the fields drop)
        // the permit: whoever gets the permit finds the connection free.
        drop(self.client.take());
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.index);
    }
}

impl LimitConn for Pool {
    type Conn = Lent;
    type Error = Infallible;

    async fn conn(&self) -> Result<Lent, Infallible> {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("the pool's semaphore is never closed");
        let index = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .expect("a permit means an idle connection");
        let client = Arc::clone(&self.conns[index]).lock_owned().await;
        self.lent.fetch_add(1, Ordering::Relaxed);
        Ok(Lent {
            client: Some(client),
            index,
            idle: Arc::clone(&self.idle),
            _permit: permit,
        })
    }
}

/// A limiter that measures the store path: every call sends its statement.
/// Neither the refusal cache nor merging (both on by default) is on. The
/// limits measured through it are never reached, so there would be no
/// refusal to cache anyway, but a call must not be answered from memory nor
/// ride on another call's statement.
///
/// Its budget is long: a stall on a busy machine should show in the p99, not
/// turn into a fail-open verdict that returns early.
pub(crate) fn limiter<S: Store>(store: S) -> Limiter<S> {
    Limiter::builder(store)
        .budget(Limiter::MAX_BUDGET)
        .no_refusal_cache()
        .no_merging()
        .build()
        .expect("the longest budget is a valid budget")
}

/// A limiter with the defaults (the refusal cache and merging on) and the
/// long budget.
pub(crate) fn defaults_limiter<S: Store>(store: S) -> Limiter<S> {
    Limiter::builder(store)
        .budget(Limiter::MAX_BUDGET)
        .build()
        .expect("the longest budget is a valid budget")
}

/// The places for writes in flight measured beside the default, each
/// through a limiter of its own with the defaults otherwise, right after
/// the same floor: the trade [`LimiterBuilder::writes_in_flight`] makes.
///
/// [`LimiterBuilder::writes_in_flight`]: platformkit_limit::LimiterBuilder::writes_in_flight
pub(crate) const SWEPT_PLACES: [usize; 4] = [2, 4, 8, 16];

/// Panics unless the store answered.
pub(crate) fn answered(what: &str, verdict: Result<Verdict, platformkit_limit::Error>) -> Verdict {
    match verdict {
        Ok(verdict) if verdict.is_unreachable() => panic!(
            "{what}: the store was unreachable: {:?}",
            verdict.unreachable()
        ),
        Ok(verdict) => verdict,
        Err(e) => panic!("{what}: {e}"),
    }
}

/// `what` through the limiter of each worker (`limiters[worker]`).
pub(crate) fn limiter_op<S: Store + 'static>(
    limiters: Arc<Vec<Limiter<S>>>,
    limit: Limit,
    what: What,
) -> Op {
    Arc::new(move |worker, id| {
        let limiters = Arc::clone(&limiters);
        let limit = limit.clone();
        Box::pin(async move {
            let limiter = &limiters[worker];
            let key = Key::opaque(&id);
            let verdict = match what {
                What::Check | What::PreparedCheck => limiter.check(&limit, &key).await,
                What::Failed
                | What::RelaxedFailed
                | What::ConnectPerCall
                | What::Memory
                | What::SqlxFailed
                | What::PreparedFailed => limiter.failed(&limit, &key).await,
                What::Hit => limiter.hit(&limit, &key).await,
                What::HitN => limiter.hit(&limit, &key).cost(HIT_COST).await,
                What::Reset => {
                    if let Err(e) = limiter.reset(&limit, &key).await {
                        panic!("reset: {e}");
                    }
                    return;
                }
                What::CheckAll | What::FailedAll | What::HitAll | What::HitAllOrNothing => {
                    unreachable!("several limits have an operation of their own")
                }
                What::DefaultsFailed | What::DefaultsPlaces(_) | What::SqlxDefaults => {
                    unreachable!("one shared limiter has an op of its own")
                }
                What::Select1 | What::Upsert | What::Read => {
                    unreachable!("the statements alone do not go through the limiter")
                }
            };
            answered(what.label(), verdict);
        })
    })
}

/// A call over several limits through the limiter of each worker, over two
/// pairs: the key under `account`, and the address that goes with it under
/// `address`.
fn several_op<S: Store + 'static>(
    limiters: Arc<Vec<Limiter<S>>>,
    account: Limit,
    address: Limit,
    what: What,
) -> Op {
    let limits = Arc::new((account, address));
    Arc::new(move |worker, id| {
        let limiters = Arc::clone(&limiters);
        let limits = Arc::clone(&limits);
        Box::pin(async move {
            let limiter = &limiters[worker];
            let (account, address) = &*limits;
            let account_key = Key::opaque(&id);
            let address_key = Key::ip(address_of(&id));
            let pairs = [(account, &account_key), (address, &address_key)];
            let verdicts = match what {
                What::CheckAll => limiter.check_all(&pairs).await,
                What::FailedAll => limiter.failed_all(&pairs).await,
                What::HitAll => limiter.hit_all(&pairs).await,
                What::HitAllOrNothing => limiter.hit_all_or_nothing(&pairs).await,
                _ => unreachable!("only the *_all calls take several limits"),
            };
            match verdicts {
                Ok(verdicts) if verdicts.is_unreachable() => {
                    panic!("{}: the store was unreachable", what.label())
                }
                Ok(verdicts) => assert_eq!(verdicts.iter().count(), 2, "a verdict per pair"),
                Err(e) => panic!("{}: {e}", what.label()),
            }
        })
    })
}

/// `failed` through one limiter shared by every worker.
pub(crate) fn shared_failed_op<S: Store + 'static>(
    limiter: Arc<Limiter<S>>,
    limit: Arc<Limit>,
) -> Op {
    Arc::new(move |_worker, id| {
        let limiter = Arc::clone(&limiter);
        let limit = Arc::clone(&limit);
        Box::pin(async move {
            answered("failed", limiter.failed(&limit, &Key::opaque(&id)).await);
        })
    })
}

/// Everything a round needs.
pub(crate) struct Bench {
    pub(crate) mode: Mode,
    limit: Limit,
    pub(crate) conns: Arc<Vec<Held>>,
    /// The same connections, lent to whichever caller of a shared limiter.
    pool: Pool,
    ops: Vec<(What, Op)>,
    /// `failed` over sqlx, one statement per call and with the defaults,
    /// by connections: empty without the feature.
    sqlx: Vec<(usize, Op, MakeOp)>,
}

impl Bench {
    pub(crate) fn new<C>(
        mode: Mode,
        limit: Limit,
        address: Limit,
        conns: Arc<Vec<Held>>,
        prepared: Arc<Vec<Prepared>>,
        limiters: Arc<Vec<Limiter<Postgres<C>>>>,
        config: tokio_postgres::Config,
    ) -> Bench
    where
        Postgres<C>: Store + 'static,
    {
        let window_secs = i64::try_from(limit.window().as_secs()).expect("a window fits in i64");
        let relaxed = Arc::new(
            conns
                .iter()
                .map(|held| {
                    limiter(Postgres::new(lend(Arc::clone(held))).with_relaxed_durability())
                })
                .collect::<Vec<_>>(),
        );
        let connecting = Arc::new(vec![limiter(Postgres::new(config))]);
        let floor = |floor| {
            floor_op(
                Arc::clone(&conns),
                Arc::clone(&prepared),
                floor,
                window_secs,
            )
        };
        let through = |what| limiter_op(Arc::clone(&limiters), limit.clone(), what);
        let several =
            |what| several_op(Arc::clone(&limiters), limit.clone(), address.clone(), what);
        let ops = vec![
            (What::Select1, select1_op(Arc::clone(&conns))),
            (What::Upsert, floor(Floor::Upsert)),
            (What::Read, floor(Floor::Read)),
            (What::Check, through(What::Check)),
            (What::Failed, through(What::Failed)),
            (What::Hit, through(What::Hit)),
            (What::HitN, through(What::HitN)),
            (What::Reset, through(What::Reset)),
            (What::CheckAll, several(What::CheckAll)),
            (What::FailedAll, several(What::FailedAll)),
            (What::HitAll, several(What::HitAll)),
            (What::HitAllOrNothing, several(What::HitAllOrNothing)),
            (
                What::RelaxedFailed,
                limiter_op(relaxed, limit.clone(), What::RelaxedFailed),
            ),
            (
                What::ConnectPerCall,
                limiter_op(connecting, limit.clone(), What::ConnectPerCall),
            ),
        ];
        Bench {
            mode,
            pool: Pool::new(Arc::clone(&conns)),
            limit,
            conns,
            ops,
            sqlx: Vec::new(),
        }
    }

    /// Adds `check` and `failed` through `Prepared`.
    #[cfg_attr(not(feature = "deadpool"), allow(dead_code))]
    pub(crate) fn with_prepared(mut self, ops: Vec<(What, Op)>) -> Bench {
        self.ops.extend(ops);
        self
    }

    /// Whether `what` is measured in this build.
    fn measures(&self, what: What) -> bool {
        match what {
            What::SqlxFailed | What::SqlxDefaults => !self.sqlx.is_empty(),
            What::PreparedCheck | What::PreparedFailed => self.ops.iter().any(|(w, _)| *w == what),
            _ => true,
        }
    }

    /// Adds `failed` over sqlx: an op for each number of connections.
    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    pub(crate) fn with_sqlx(mut self, ops: Vec<(usize, Op, MakeOp)>) -> Bench {
        self.sqlx = ops;
        self
    }

    fn op(&self, what: What, conns: usize) -> Op {
        match what {
            What::SqlxFailed | What::SqlxDefaults => {
                let (_, one, defaults) = self
                    .sqlx
                    .iter()
                    .find(|(c, _, _)| *c == conns)
                    .expect("sqlx is measured at this concurrency");
                // The defaults a fresh limiter each time, as over tokio-postgres.
                if what == What::SqlxFailed {
                    Arc::clone(one)
                } else {
                    defaults()
                }
            }
            // A fresh one each time: the fake never forgets a key.
            What::Memory => {
                let limiters = Arc::new(vec![limiter(Memory::new())]);
                limiter_op(limiters, self.limit.clone(), What::Memory)
            }
            // A fresh one each time, as the attack's: an empty cache.
            What::DefaultsFailed => shared_failed_op(
                Arc::new(defaults_limiter(Postgres::new(self.pool.clone()))),
                Arc::new(self.limit.clone()),
            ),
            What::DefaultsPlaces(places) => shared_failed_op(
                Arc::new(
                    Limiter::builder(Postgres::new(self.pool.clone()))
                        .budget(Limiter::MAX_BUDGET)
                        .writes_in_flight(places)
                        .build()
                        .expect("places within the bounds"),
                ),
                Arc::new(self.limit.clone()),
            ),
            _ => {
                let (_, op) = self
                    .ops
                    .iter()
                    .find(|(w, _)| *w == what)
                    .expect("every operation has an op");
                Arc::clone(op)
            }
        }
    }

    /// Measures `what` on `conns` workers over `keys`.
    pub(crate) async fn measure(&self, what: What, conns: usize, keys: Keys) -> Sample {
        measure(&self.op(what, conns), conns, keys, self.mode).await
    }
}

/// One block of a round: at 1 and at [`WIDE`] connections, a bare round
/// trip, then each operation right after its floor, then (over random keys)
/// what is compared to the operation right after it; at [`WIDE`] over
/// random keys, `failed` with the defaults through one shared limiter right
/// after its floor; with the feature `sqlx`, `failed` over sqlx right after
/// `failed`, over random keys; with the feature `deadpool`, `check` and
/// `failed` through `Prepared` right after each. Returns this round's held `failed` at 1 connection,
/// which connecting per call is compared to.
pub(crate) async fn run_block(bench: &Bench, results: &mut Results, keys: Keys) -> Sample {
    let mut held_failed = None;
    for conns in [1, WIDE] {
        let round_trip = bench.measure(What::Select1, conns, keys).await;
        results.record(What::Select1, None, conns, round_trip, None);
        let mut whats = vec![What::Check, What::Failed, What::Hit, What::Reset];
        if keys == Keys::Random && bench.measures(What::SqlxFailed) {
            // Over sqlx, right after over tokio-postgres.
            whats.insert(2, What::SqlxFailed);
        }
        if keys == Keys::Random {
            // At 1 connection: a lone caller, which merging must not delay.
            whats.push(What::DefaultsFailed);
            if bench.measures(What::SqlxDefaults) {
                // The README's path, right after the same over tokio-postgres.
                whats.push(What::SqlxDefaults);
            }
        }
        if keys == Keys::Random && conns == WIDE {
            whats.extend(SWEPT_PLACES.map(What::DefaultsPlaces));
        }
        for what in whats {
            let floor = what.floor().expect("operations have a floor");
            let floor_sample = bench.measure(floor, conns, keys).await;
            results.record(floor, Some(keys), conns, floor_sample, None);
            let sample = bench.measure(what, conns, keys).await;
            results.record(what, Some(keys), conns, sample, Some(floor_sample));
            if keys == Keys::Random {
                for &next in what.followed_by() {
                    if !bench.measures(next) {
                        continue;
                    }
                    let next_sample = bench.measure(next, conns, keys).await;
                    results.record(next, Some(keys), conns, next_sample, Some(sample));
                }
            }
            if what == What::Failed && conns == 1 {
                held_failed = Some(sample);
            }
        }
    }
    held_failed.expect("failed runs at 1 connection")
}
