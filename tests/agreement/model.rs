//! The calls the agreement tests play, the cases proptest draws of them, and
//! a plain model of fixed and sliding windows, lockouts and the refusal
//! cache, written independently of the crate's arithmetic: the model finds
//! a sliding window's reopening by search, the crate by a closed form.
//! Each call carries a cost: 1 in the cases of [`case`], drawn from 1 to
//! past the limits' max in those of [`case_with_costs`]. In those of
//! [`case_with_tiers`], a call may also ask its limit under a tier: the
//! same limit (name, window, strategy, lockout) under another max
//! (`Limit::with_max`), counting in the same row.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use platformkit_limit::{Key, Limit, Limiter, ManualClock, Verdict, WhenUnreachable};
use proptest::prelude::*;

const MICROS_PER_SEC: u64 = 1_000_000;

/// Everything a verdict tells a caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub allowed: bool,
    pub refused: bool,
    pub unreachable: bool,
    pub count: Option<u64>,
    pub remaining: Option<u64>,
    pub reopens_at: Option<SystemTime>,
    pub retry_after: Option<Duration>,
    pub exceeds_max: bool,
}

impl From<&Verdict> for Seen {
    fn from(v: &Verdict) -> Self {
        Seen {
            allowed: v.is_allowed(),
            refused: v.is_refused(),
            unreachable: v.is_unreachable(),
            count: v.count(),
            remaining: v.remaining(),
            reopens_at: v.reopens_at(),
            retry_after: v.retry_after(),
            exceeds_max: v.exceeds_max(),
        }
    }
}

pub fn micros(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_micros()).unwrap()
}

fn at_micros(m: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(m)
}

// ---------------------------------------------------------------------------
// The property
// ---------------------------------------------------------------------------

/// 240 bytes: any key with it is digested.
const LONG: &str = concat!(
    "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz",
    "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz",
    "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz",
    "012345678901234567890123",
);

/// Keys chosen to break a sloppy encoding or a sloppy comparison: a
/// separator and the two parts it could fake, empty, NUL, the digest marker,
/// an escape, two spellings of "é" and two cases of one letter (distinct
/// keys, byte for byte), and two long keys that differ only past the cut.
const KEY_POOL: &[&[&str]] = &[
    &["a|b"],
    &["a", "b"],
    &[""],
    &["\0"],
    &["~"],
    &["\\"],
    &["\u{e9}"],
    &["e\u{301}"],
    &["A"],
    &["a"],
    &[LONG, "1"],
    &[LONG, "2"],
];

/// Windows of the limits, in seconds.
const WINDOWS: &[u64] = &[1, 7, 60];

#[derive(Clone, Debug)]
pub enum Call {
    Check,
    Failed,
    /// `hit`, with its cost.
    Hit,
    Reset,
    /// Reserve, then report success (taking the attempt back) or not;
    /// with its cost.
    Reserve {
        succeed: bool,
    },
    /// The several-limits calls, over every limit of the case with one key
    /// (with its cost).
    CheckAll,
    FailedAll,
    HitAll,
    /// `hit_all_or_nothing`, over every limit of the case with one key:
    /// drawn only in the cases of [`case_with_all_or_nothing`].
    HitAllOrNothing,
}

impl Call {
    /// Whether the call carries its op's cost (the others cost 1).
    pub fn costs(&self) -> bool {
        matches!(
            self,
            Call::Hit | Call::Reserve { .. } | Call::HitAll | Call::HitAllOrNothing
        )
    }
}

/// How the clock moves before a call.
#[derive(Clone, Debug)]
enum Advance {
    Stay,
    By(Duration),
    /// To the next edge of limit `limit`'s windows, plus `offset_micros`
    /// (never backwards).
    ToEdge {
        limit: usize,
        offset_micros: i64,
    },
}

#[derive(Clone, Debug)]
pub struct Op {
    advance: Advance,
    pub call: Call,
    pub limit: usize,
    pub key: usize,
    /// The cost of a call that carries one (see `Op::cost`); 1 for the
    /// others.
    cost: u32,
    /// The max of the tier the call asks its limit under (`Limit::with_max`),
    /// or 0 for the limit's own.
    pub tier: u32,
}

impl Op {
    /// What the call asks: its cost, or 1 for a call that carries none.
    pub fn cost(&self) -> u32 {
        if self.call.costs() { self.cost } else { 1 }
    }
}

/// `(max, window in seconds, sliding, lockout in seconds or 0)` of a limit.
pub type Spec = (u32, u64, bool, u64);

#[derive(Clone, Debug)]
pub struct Case {
    /// Seconds and microseconds since the Unix epoch.
    start: (u64, u32),
    /// The spec of each limit.
    pub limits: Vec<Spec>,
    keys: Vec<&'static [&'static str]>,
    pub ops: Vec<Op>,
}

fn advance(limits: usize) -> impl Strategy<Value = Advance> {
    let by = |d: Duration| Just(Advance::By(d));
    prop_oneof![
        4 => Just(Advance::Stay),
        1 => by(Duration::from_micros(1)),
        2 => (1..5u64).prop_map(|ms| Advance::By(Duration::from_millis(ms))),
        1 => by(Duration::from_micros(999_999)),
        1 => by(Duration::from_secs(1)),
        1 => by(Duration::from_micros(6_999_999)),
        1 => by(Duration::from_secs(7)),
        1 => by(Duration::from_micros(7_000_001)),
        1 => by(Duration::from_secs(59)),
        1 => by(Duration::from_secs(61)),
        2 => (2..10u64).prop_map(|s| Advance::By(Duration::from_secs(s))),
        3 => (0..limits, -1..=1i64).prop_map(|(limit, offset_micros)| Advance::ToEdge {
            limit,
            offset_micros,
        }),
    ]
}

fn op(
    limits: usize,
    keys: usize,
    (cost, tier): (impl Strategy<Value = u32>, impl Strategy<Value = u32>),
    all_or_nothing: bool,
) -> impl Strategy<Value = Op> {
    let call = prop_oneof![
        3 => Just(Call::Check),
        3 => Just(Call::Failed),
        3 => Just(Call::Hit),
        1 => Just(Call::Reset),
        2 => any::<bool>().prop_map(|succeed| Call::Reserve { succeed }),
        1 => Just(Call::CheckAll),
        1 => Just(Call::FailedAll),
        1 => Just(Call::HitAll),
    ];
    // A strategy of its own, so that the other cases draw as they did.
    let call = if all_or_nothing {
        prop_oneof![1 => call, 1 => Just(Call::HitAllOrNothing)].boxed()
    } else {
        call.boxed()
    };
    (advance(limits), call, 0..limits, 0..keys, cost, tier).prop_map(
        |(advance, call, limit, key, cost, tier)| Op {
            advance,
            call,
            limit,
            key,
            cost,
            tier,
        },
    )
}

fn start() -> impl Strategy<Value = (u64, u32)> {
    prop_oneof![
        // Anywhere after 2001.
        (1_000_000_000..=2_000_000_000u64, 0..1_000_000u32),
        // A moment before an edge of every window length (420 s = 7 × 60).
        (2_380_953..=4_761_904u64, 1..=3u32)
            .prop_map(|(n, before)| (n * 420 - 1, 1_000_000 - before)),
    ]
}

/// A case whose calls all cost 1: `Just(1)` draws nothing, so the seeds
/// of the committed regressions give the cases they gave before costs.
pub fn case() -> impl Strategy<Value = Case> {
    case_costing(|| (Just(1u32), Just(0u32)), false)
}

/// A case whose `hit`, `reserve` and `hit_all` calls cost from 1 to 6 (the
/// limits' max is at most 4: some costs are above it), most often 1.
pub fn case_with_costs() -> impl Strategy<Value = Case> {
    case_costing(|| (costs(), Just(0u32)), false)
}

/// A case with the costs of [`case_with_costs`] whose calls ask their
/// limit (and, for the several-limits calls, the op's limit among them)
/// under a tier of a max from 1 to 8 (below, at and above the limits'
/// own, which is at most 4) two times in three, else under its own max.
pub fn case_with_tiers() -> impl Strategy<Value = Case> {
    case_costing(|| (costs(), tiers()), false)
}

/// A case with the costs and tiers of [`case_with_tiers`], whose calls are
/// `hit_all_or_nothing` half the time.
pub fn case_with_all_or_nothing() -> impl Strategy<Value = Case> {
    case_costing(|| (costs(), tiers()), true)
}

fn tiers() -> impl Strategy<Value = u32> {
    prop_oneof![1 => Just(0u32), 2 => 1..=8u32]
}

fn costs() -> impl Strategy<Value = u32> {
    prop_oneof![2 => Just(1u32), 3 => 2..=4u32, 1 => 5..=6u32]
}

fn case_costing<C: Strategy<Value = u32> + 'static, T: Strategy<Value = u32> + 'static>(
    cost: impl Fn() -> (C, T) + Clone + 'static,
    all_or_nothing: bool,
) -> impl Strategy<Value = Case> {
    let lockouts =
        prop_oneof![3 => Just(0u64), 1 => Just(1u64), 1 => Just(30u64), 1 => Just(90u64)];
    let limits = prop::collection::vec(
        (
            1..=4u32,
            prop::sample::select(WINDOWS),
            any::<bool>(),
            lockouts,
        ),
        1..=3,
    );
    let keys = prop::sample::subsequence(KEY_POOL.to_vec(), 1..=4);
    (start(), limits, keys).prop_flat_map(move |(start, limits, keys)| {
        let ops =
            prop::collection::vec(op(limits.len(), keys.len(), cost(), all_or_nothing), 1..=40);
        (Just(start), Just(limits), Just(keys), ops).prop_map(|(start, limits, keys, ops)| Case {
            start,
            limits,
            keys,
            ops,
        })
    })
}

/// Counts per (limit, key, window start in microseconds), windows from the
/// Unix epoch as the crate documents them. For a sliding window the estimate
/// is the current count plus the previous window's weighted by how much of
/// it still overlaps the last window's length; an attempt may go ahead while
/// the estimate (before its own ask, for `hit`) is below max.
///
/// Both limiters keep their refusal cache on (the default), so the model
/// keeps one too: once a single-limit call's key has been refused
/// `Limiter::FLOOD_REFUSALS` times within `Limiter::FLOOD_SPAN` (answers from the cache
/// included), the refusal is answered again, with nothing counted, for the
/// TTL or until it reopens, whichever is sooner; then the next call asks
/// again. An allow, a reset or a success forgets the key. The several-limits
/// calls read and fill it the same way, pair by pair: when any pair's
/// refusal is answered from it, nothing is counted for any pair, and the
/// pairs not asked are allowed by their own limits with nothing counted;
/// but a `failed_all` is still counted under the pairs the cache does not
/// answer.
///
/// A call of cost `c` adds `c`, and is decided as `c` asks of one in a
/// row, by its last; its refusal reopens when the estimate is below
/// `max − (c − 1)`. A cost above a limit's max is refused for that limit
/// without a count and without a look at the cache, and the call asks for
/// no pair. A held refusal is answered only to a cost at least its own and
/// under the same max (a tier's); a refusal of a larger cost leaves a fresh
/// one of a smaller cost under the same max held, and a refusal under
/// another max replaces it. A tier counts in its limit's counts: the model
/// keys them by limit, never by max, and decides each call, its lockout
/// included, by the max the call asks under. An all-or-nothing call, past
/// the cost and the cache as `hit_all`, counts as `hit_all` if every limit
/// would let its ask go ahead, and else counts nothing: each limit then
/// tells what the ask found, refused while the estimate with all but the
/// last unit of the cost on top is not below max or a lockout runs.
#[derive(Default)]
pub struct Model {
    counts: HashMap<(usize, usize, u64), u64>,
    /// (limit, key) → what the refusal cache knows of it.
    refusals: HashMap<(usize, usize), Cached>,
}

/// The refusal cache's entry for one (limit, key).
#[derive(Default)]
struct Cached {
    /// The latest refusals answered, in µs, oldest first.
    times: VecDeque<u64>,
    /// The refusal answered again, when it reopens and when its TTL ends,
    /// in µs, the cost it refused and the max it was refused under.
    held: Option<(Seen, u64, u64, u32, u32)>,
}

impl Cached {
    fn refused_at(&mut self, now: u64) {
        self.times.push_back(now);
        if self.times.len() > Limiter::FLOOD_REFUSALS {
            self.times.pop_front();
        }
    }

    fn flooded(&self, now: u64) -> bool {
        let span = u64::try_from(Limiter::FLOOD_SPAN.as_micros()).unwrap();
        self.times.len() == Limiter::FLOOD_REFUSALS && now - self.times[0] < span
    }
}

impl Model {
    fn count(&self, limit: usize, key: usize, start: u64) -> u64 {
        self.counts.get(&(limit, key, start)).copied().unwrap_or(0)
    }

    /// The estimate times the window width, at `now`.
    fn weighted(&self, limit: usize, key: usize, width: u64, sliding: bool, now: u64) -> u128 {
        let start = now / width * width;
        let elapsed = now - start;
        let previous = if sliding && start >= width {
            self.count(limit, key, start - width)
        } else {
            0
        };
        u128::from(previous) * u128::from(width - elapsed)
            + u128::from(self.count(limit, key, start)) * u128::from(width)
    }

    /// The verdicts of one call of `cost` over the limits `which`, each for
    /// `key`.
    pub fn verdicts(
        &mut self,
        call: &Call,
        cost: u32,
        which: &[usize],
        key: usize,
        specs: &[(u32, u64, bool, u64)],
        now: u64,
    ) -> Vec<Seen> {
        let cached: Vec<Option<Seen>> = which
            .iter()
            .map(|&limit| {
                if cost > specs[limit].0 {
                    Some(Seen {
                        allowed: false,
                        refused: true,
                        unreachable: false,
                        count: None,
                        remaining: None,
                        reopens_at: None,
                        retry_after: None,
                        exceeds_max: true,
                    })
                } else {
                    self.cached(limit, key, (cost, specs[limit].0), now)
                }
            })
            .collect();
        if cached.iter().any(Option::is_some) {
            // A failure happened all the same: `failed_all` counts it under
            // the pairs the cache does not answer.
            let failed = matches!(call, Call::FailedAll);
            return cached
                .into_iter()
                .zip(which)
                .map(|(seen, &limit)| match seen {
                    Some(seen) => seen,
                    None if failed => self.verdict(call, cost, limit, key, specs[limit], now),
                    None => Seen {
                        allowed: true,
                        refused: false,
                        unreachable: false,
                        count: None,
                        remaining: None,
                        reopens_at: None,
                        retry_after: None,
                        exceeds_max: false,
                    },
                })
                .collect();
        }
        if let Call::HitAllOrNothing = call {
            // Counted as `hit_all` if every limit allows it; else nothing is
            // counted, and each limit tells what the ask found.
            let every_one = which
                .iter()
                .all(|&limit| self.goes(cost, limit, key, specs[limit], now));
            let call = if every_one { &Call::HitAll } else { call };
            return which
                .iter()
                .map(|&limit| self.verdict(call, cost, limit, key, specs[limit], now))
                .collect();
        }
        which
            .iter()
            .map(|&limit| self.verdict(call, cost, limit, key, specs[limit], now))
            .collect()
    }

    /// Whether an ask of `cost` for (limit, key) goes ahead at `now`, with
    /// nothing counted: no lockout runs, and the estimate with all but the
    /// last unit of the cost on top is below max.
    fn goes(&self, cost: u32, limit: usize, key: usize, spec: Spec, now: u64) -> bool {
        let (max, window, sliding, lockout) = spec;
        let width = window * MICROS_PER_SEC;
        let start = now / width * width;
        let locked = lockout > 0
            && self.counts.iter().any(|(&(l, k, s), &c)| {
                (l, k) == (limit, key)
                    && s <= start
                    && c >= u64::from(max)
                    && s + width + lockout * MICROS_PER_SEC > now
            });
        let weighted = self.weighted(limit, key, width, sliding, now);
        !locked
            && weighted + u128::from(cost - 1) * u128::from(width)
                < u128::from(max) * u128::from(width)
    }

    /// The refusal the cache answers for (limit, key) to an ask of `cost`
    /// under `max` at `now`, if fresh, of no more than `cost` and under
    /// `max`.
    fn cached(
        &mut self,
        limit: usize,
        key: usize,
        (cost, max): (u32, u32),
        now: u64,
    ) -> Option<Seen> {
        let cached = self.refusals.entry((limit, key)).or_default();
        let (seen, reopens, fresh_until, refused, under) = cached.held.as_ref()?;
        if now >= *fresh_until || cost < *refused || max != *under {
            return None;
        }
        let seen = Seen {
            retry_after: Some(Duration::from_micros(reopens - now)),
            ..seen.clone()
        };
        cached.refused_at(now);
        Some(seen)
    }

    /// The verdict the store's count gives for (limit, key) at `now`, for
    /// an ask of `cost`.
    fn verdict(
        &mut self,
        call: &Call,
        cost: u32,
        limit: usize,
        key: usize,
        spec: (u32, u64, bool, u64),
        now: u64,
    ) -> Seen {
        let (max, window, sliding, lockout) = spec;
        let width = window * MICROS_PER_SEC;
        let start = now / width * width;
        if matches!(
            call,
            Call::Failed | Call::Hit | Call::Reserve { .. } | Call::FailedAll | Call::HitAll
        ) {
            *self.counts.entry((limit, key, start)).or_insert(0) += u64::from(cost);
        }
        let weighted = self.weighted(limit, key, width, sliding, now);
        let own = if matches!(call, Call::Hit | Call::Reserve { .. } | Call::HitAll) {
            u128::from(width)
        } else {
            0
        };
        // `HitAllOrNothing` here is an ask not counted: it reads the
        // estimate with all but the last unit of its cost on top.
        let unasked = if matches!(call, Call::HitAllOrNothing) {
            u128::from(cost - 1) * u128::from(width)
        } else {
            0
        };
        let max_w = u128::from(max) * u128::from(width);
        // A lockout runs from the end of any window whose own count reached
        // max (the current one counted before this call's own ask).
        let own_asks = u64::from(own > 0);
        let locked_until = (lockout > 0)
            .then(|| {
                self.counts
                    .iter()
                    .filter(|&(&(l, k, s), &c)| {
                        (l, k) == (limit, key)
                            && s <= start
                            && (if s == start { c - own_asks } else { c }) >= u64::from(max)
                    })
                    .map(|(&(_, _, s), _)| s + width + lockout * MICROS_PER_SEC)
                    .filter(|&until| until > now)
                    .max()
            })
            .flatten();
        let allowed = weighted - own + unasked < max_w && locked_until.is_none();
        let count = u64::try_from(weighted.div_ceil(u128::from(width))).unwrap();
        let reopens = if allowed {
            start + width
        } else {
            // The first microsecond, from now or the lockout's end, at which
            // the estimate is below max less all but one of the cost again
            // (an ask of the same cost then goes ahead): it only falls while
            // nothing is counted, so search for it.
            let room_w = u128::from(max - (cost - 1)) * u128::from(width);
            let from = locked_until.map_or(now, |until| until.max(now));
            let (mut lo, mut hi) = (from, from.max(start) + 2 * width + 1);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if self.weighted(limit, key, width, sliding, mid) < room_w {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            lo
        };
        let seen = Seen {
            allowed,
            refused: !allowed,
            unreachable: false,
            count: Some(count),
            remaining: Some(u64::from(max).saturating_sub(count)),
            reopens_at: Some(at_micros(reopens)),
            retry_after: (!allowed).then(|| Duration::from_micros(reopens - now)),
            exceeds_max: false,
        };
        if allowed {
            self.refusals.remove(&(limit, key));
        } else {
            let cached = self.refusals.entry((limit, key)).or_default();
            cached.refused_at(now);
            let ttl = u64::try_from(Limiter::DEFAULT_REFUSAL_TTL.as_micros()).unwrap();
            let replaced = cached
                .held
                .as_ref()
                .is_none_or(|&(_, _, fresh_until, held, under)| {
                    under != max || held >= cost || now >= fresh_until
                });
            if replaced {
                cached.held = cached
                    .flooded(now)
                    .then(|| (seen.clone(), reopens, reopens.min(now + ttl), cost, max));
            }
        }
        seen
    }

    /// A reserved attempt of `cost` that succeeded is taken back from its
    /// window.
    pub fn take_back(&mut self, limit: usize, key: usize, cost: u32, window: u64, now: u64) {
        self.refusals.remove(&(limit, key));
        let width = window * MICROS_PER_SEC;
        let start = now / width * width;
        if let Some(count) = self.counts.get_mut(&(limit, key, start)) {
            *count = count.saturating_sub(u64::from(cost));
        }
    }

    pub fn reset(&mut self, limit: usize, key: usize) {
        self.refusals.remove(&(limit, key));
        self.counts.retain(|&(l, k, _), _| (l, k) != (limit, key));
    }
}

impl Case {
    /// The case's limits, named under `prefix`, each deciding `unreachable`
    /// as given when the store cannot be reached.
    pub fn limits(&self, prefix: &str, unreachable: WhenUnreachable) -> Vec<Limit> {
        self.limits
            .iter()
            .enumerate()
            .map(|(i, &(max, window, sliding, lockout))| {
                let limit =
                    Limit::builder(&format!("{prefix}.l{i}"), max, Duration::from_secs(window))
                        .when_unreachable(unreachable);
                let limit = if sliding {
                    limit.strategy(platformkit_limit::Strategy::Sliding)
                } else {
                    limit
                };
                let limit = if lockout > 0 {
                    limit.lockout(Duration::from_secs(lockout))
                } else {
                    limit
                };
                limit.build().unwrap()
            })
            .collect()
    }

    /// The limits and their specs as `op` asks them: its limit under its
    /// tier, if it has one (`Limit::with_max`; with `lockouts` false, only
    /// if the limit has no lockout), the others as they are.
    pub fn tiered(&self, limits: &[Limit], op: &Op, lockouts: bool) -> (Vec<Limit>, Vec<Spec>) {
        let mut limits = limits.to_vec();
        let mut specs = self.limits.clone();
        if op.tier > 0 && (lockouts || limits[op.limit].lockout().is_none()) {
            limits[op.limit] = limits[op.limit].with_max(op.tier).unwrap();
            specs[op.limit].0 = op.tier;
        }
        (limits, specs)
    }

    pub fn keys(&self) -> Vec<Key> {
        self.keys.iter().map(|p| Key::new(*p).unwrap()).collect()
    }

    /// A clock at the case's start.
    pub fn clock(&self) -> ManualClock {
        ManualClock::new(
            UNIX_EPOCH
                + Duration::new(self.start.0, 0)
                + Duration::from_micros(self.start.1.into()),
        )
    }

    /// Moves `clock` as `op` says.
    pub fn advance(&self, clock: &ManualClock, op: &Op) {
        match op.advance {
            Advance::Stay => {}
            Advance::By(by) => clock.advance(by),
            Advance::ToEdge {
                limit,
                offset_micros,
            } => {
                let now = micros(clock.now());
                let width = self.limits[limit].1 * MICROS_PER_SEC;
                let edge = (now / width + 1) * width;
                let target = edge.saturating_add_signed(offset_micros);
                if target > now {
                    clock.set(at_micros(target));
                }
            }
        }
    }
}
