//! How many attempts a limit lets through in any interval, under adversarial
//! timings: fixed windows let twice the limit through in an interval as short
//! as one second; sliding windows never let more than the limit through in an
//! instant, nor more than ⌈max × (1 + L/W)⌉ in any interval of length L.
//!
//! Played on `Memory` with a pinned clock: `tests/agreement.rs` holds
//! `Postgres` to the same verdicts, sliding windows included.

use std::time::{Duration, UNIX_EPOCH};

use platformkit_limit::{Key, Limit, Limiter, ManualClock, Memory, Strategy};

const MAX: u32 = 10;
const W: u64 = 60;
const MICROS: u64 = 1_000_000;

/// An attacker that knows the limiter: at each instant of its schedule it
/// asks as often as `check` says an ask would pass, so no ask is wasted.
/// Returns the instants (µs from the start) of the attempts let through.
fn attack(limit: &Limit, schedule: &[u64]) -> Vec<u64> {
    let start = UNIX_EPOCH + Duration::from_secs(1_800_000_000 / W * W);
    let clock = ManualClock::new(start);
    let limiter = Limiter::new(Memory::new().with_clock(clock.clone()));
    let key = Key::opaque("victim");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut through = Vec::new();
        for &at in schedule {
            clock.set(start + Duration::from_micros(at));
            while limiter
                .check(limit, &key)
                .await
                .expect("memory")
                .is_allowed()
            {
                let verdict = limiter.hit(limit, &key).await.expect("memory");
                assert!(verdict.is_allowed(), "check and hit agree");
                through.push(at);
            }
        }
        through
    })
}

/// The most attempts in any closed interval of length `len` µs.
fn most_in(through: &[u64], len: u64) -> usize {
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..through.len() {
        while through[hi] - through[lo] > len {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

/// Schedules meant to find the worst case: bursts either side of window
/// edges at many offsets, steady streams at several rates, and both.
fn schedules() -> Vec<(String, Vec<u64>)> {
    let w = W * MICROS;
    let mut all = Vec::new();
    for gap in [1, 1_000, 500_000, 1_000_000, 5_000_000] {
        for edge in 1..=3 {
            all.push((
                format!("bursts {gap} µs either side of edge {edge}"),
                vec![edge * w - gap / 2 - 1, edge * w + gap / 2],
            ));
        }
    }
    for offset_secs in [1, 6, 15, 30, 45, 54, 59] {
        all.push((
            format!("bursts at +{offset_secs} s of each window"),
            (0..4).map(|k| k * w + offset_secs * MICROS).collect(),
        ));
    }
    for step_ms in [10, 100, 1_000, 6_000] {
        let step = step_ms * 1_000;
        all.push((
            format!("an ask every {step_ms} ms for four windows"),
            (0..4 * w / step).map(|i| i * step).collect(),
        ));
    }
    all.push((
        "a burst at an edge, then an ask every 100 ms".into(),
        std::iter::once(w - 1)
            .chain((0..3 * w / 100_000).map(|i| w + i * 100_000))
            .collect(),
    ));
    all
}

#[test]
fn fixed_and_sliding_windows_let_through_what_the_guide_says() {
    let fixed = Limit::new("fixed", MAX, Duration::from_secs(W)).expect("a limit");
    let sliding = Limit::builder("fixed", MAX, Duration::from_secs(W))
        .strategy(Strategy::Sliding)
        .build()
        .expect("a limit");
    let lengths = [0, 1, 2, 5, 10, 15, 20, 30, 45, 60];
    let schedules = schedules();

    println!("most attempts let through in any interval of length L (max {MAX}, W {W} s)");
    println!(
        "{:>6} {:>8} {:>8} {:>22}",
        "L (s)", "fixed", "sliding", "⌈max × (1 + L/W)⌉"
    );
    for &secs in &lengths {
        let len = secs * MICROS;
        let worst = |limit: &Limit| {
            schedules
                .iter()
                .map(|(_, schedule)| most_in(&attack(limit, schedule), len))
                .max()
                .expect("schedules")
        };
        let (f, s) = (worst(&fixed), worst(&sliding));
        let bound = (u64::from(MAX) * (W + secs)).div_ceil(W) as usize;
        println!("{secs:>6} {f:>8} {s:>8} {bound:>22}");
        assert!(
            s <= bound,
            "sliding let {s} through in {secs} s, above {bound}"
        );
        if secs == 0 {
            assert!(s <= MAX as usize, "sliding let {s} through in an instant");
        }
        if secs >= 1 {
            assert_eq!(
                f,
                2 * MAX as usize,
                "fixed lets twice the limit through in {secs} s"
            );
        }
    }
}

#[test]
fn the_attack_finds_the_fixed_window_edge() {
    // The measurement can fail: an attacker that bursts on both sides of an
    // edge gets twice the limit through a fixed window within two
    // microseconds.
    let fixed = Limit::new("fixed", MAX, Duration::from_secs(W)).expect("a limit");
    let w = W * MICROS;
    let through = attack(&fixed, &[w - 1, w]);
    assert_eq!(through.len(), 2 * MAX as usize);
    assert_eq!(most_in(&through, 1), 2 * MAX as usize);
    assert_eq!(most_in(&through, 0), MAX as usize);
}
