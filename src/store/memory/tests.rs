use std::time::{Duration, UNIX_EPOCH};

use super::*;

fn limit() -> Limit {
    Limit::builder("l", 2, Duration::from_secs(60))
        .lockout(Duration::from_secs(600))
        .strategy(Strategy::Sliding)
        .build()
        .unwrap()
}

/// The fake keeps every key and every window it has seen; the local
/// count holds its bound of keys, refuses the next, and keeps at most
/// three windows a key however many it counted in.
#[test]
fn the_fake_keeps_everything_and_the_local_count_its_bound() {
    let (limit, now) = (limit(), UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    let (fake, local) = (Memory::new(), Memory::bounded(10));
    for i in 0..20 {
        let key = format!("k{i}");
        assert!(
            fake.count_at(Counting::FAILED, &limit, &key, 1, now)
                .is_some()
        );
        let counted = local.count_at(Counting::FAILED, &limit, &key, 1, now);
        assert_eq!(counted.is_some(), i < 10, "{i}");
    }
    assert_eq!((fake.len(), local.len()), (20, 10));
    assert!(
        local
            .count_at(Counting::CHECK, &limit, "k10", 1, now)
            .is_none()
    );
    assert!(
        local
            .count_at(Counting::CHECK, &limit, "k9", 1, now)
            .is_some()
    );

    for w in 0..100 {
        let at = now + Duration::from_secs(60 * w);
        fake.count_at(Counting::FAILED, &limit, "k0", 2, at);
        local.count_at(Counting::FAILED, &limit, "k0", 2, at);
    }
    let windows = |m: &Memory| m.lock().keys["k0"].counts.len();
    assert_eq!(windows(&fake), 100);
    assert!(windows(&local) <= 3, "{}", windows(&local));
}
