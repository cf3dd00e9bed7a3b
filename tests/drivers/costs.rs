//! Costs: `hit` and `reserve` of a cost, and their several-limits forms, each adding
//! its cost in its one statement, on a held connection; and
//! `hit_all_or_nothing`, adding it under every limit or none.

use std::num::NonZeroU32;
use std::time::{Duration, UNIX_EPOCH};

use platformkit_limit::{
    ErrorKind, Key, Limit, LimitConn, Limiter, ManualClock, Postgres, Reservation, Reservations,
    Strategy, Verdict,
};

use super::assert_counted;
use super::counts;
use super::driver::{Driver, Lend, assert_idle_and_switch_off, hold, lend};
use crate::common::db::{fresh_db, stored};

fn cost(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("a cost of at least 1")
}

/// Each ask adds its cost, through a merged flight and through a statement
/// of its own alike: a refused ask is counted, its whole cost; a cost above
/// max is refused with nothing counted and no count; a refusal of a sliding
/// limit reopens when an ask of its cost may go ahead; a permit takes its
/// whole cost back; the several-limits forms add the cost under each limit.
pub async fn every_ask_adds_its_cost_on_either_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    let held = hold::<D>(&db.config()).await;
    let window = Duration::from_secs(60);
    // Ten seconds into a window.
    let start = UNIX_EPOCH + window * 30_000_000 + Duration::from_secs(10);
    let clock = ManualClock::new(start);
    let merged = Limiter::builder(Postgres::new(lend::<D>(&held)).with_clock(clock.clone()))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    let alone = Limiter::builder(Postgres::new(lend::<D>(&held)).with_clock(clock.clone()))
        .no_refusal_cache()
        .no_merging()
        .build()
        .expect("valid settings");
    let quota = Limit::new("quota", 10, window).unwrap();
    let alice = Key::opaque("alice");

    // Through a flight, then a statement of its own: the same count.
    let first = merged.hit(&quota, &alice).cost(cost(7)).await.unwrap();
    assert_counted(&first, 7, "a cost of 7");
    assert!(first.is_allowed());
    assert_eq!(first.remaining(), Some(3));
    let fits = alone.hit(&quota, &alice).cost(cost(3)).await.unwrap();
    assert_counted(&fits, 10, "3 more: exactly max");
    assert!(fits.is_allowed());
    let passes = merged.hit(&quota, &alice).cost(cost(2)).await.unwrap();
    assert_counted(&passes, 12, "refused, and counted");
    assert!(passes.is_refused());
    assert_eq!(passes.retry_after(), Some(Duration::from_secs(50)));
    assert_counted(&alone.hit(&quota, &alice).await.unwrap(), 13, "a hit");

    // Above max: refused at once, nothing counted, not even a row.
    let bob = Key::opaque("bob");
    for limiter in [&merged, &alone] {
        let over = limiter.hit(&quota, &bob).cost(cost(11)).await.unwrap();
        assert!(over.is_refused() && over.exceeds_max(), "{over:?}");
        assert!(!over.is_unreachable());
        assert_eq!((over.count(), over.retry_after()), (None, None));
        let reservation = limiter.reserve(&quota, &bob).cost(cost(11)).await.unwrap();
        assert!(reservation.verdict().exceeds_max());
    }
    assert!(!counts(&db).await.contains_key(&stored(&quota, &bob)));

    // A sliding refusal of a cost of 4 reopens when 4 fit again.
    let sliding = Limit::builder("sliding", 10, window)
        .strategy(Strategy::Sliding)
        .build()
        .unwrap();
    let carol = Key::opaque("carol");
    assert!(
        merged
            .hit(&sliding, &carol)
            .cost(cost(8))
            .await
            .unwrap()
            .is_allowed()
    );
    let refused = alone.hit(&sliding, &carol).cost(cost(4)).await.unwrap();
    assert_counted(&refused, 12, "8 + 4, counted");
    let reopens = refused.reopens_at().expect("a count");
    // In the next window, the 12 weigh less and less: 4 fit once they
    // weigh below 7.
    assert!(reopens > start + Duration::from_secs(50), "{reopens:?}");
    clock.set(reopens);
    let again = merged.hit(&sliding, &carol).cost(cost(4)).await.unwrap();
    assert!(again.is_allowed(), "at the reopening: {again:?}");

    // A permit takes its whole cost back, on either path.
    let dave = Key::opaque("dave");
    for limiter in [&merged, &alone] {
        match limiter.reserve(&quota, &dave).cost(cost(6)).await.unwrap() {
            Reservation::Granted(permit) => {
                assert_eq!(permit.verdict().count(), Some(6));
                permit.succeeded().await.unwrap();
            }
            Reservation::Refused(verdict) => panic!("refused: {verdict:?}"),
        }
        assert_counted(
            &limiter.check(&quota, &dave).await.unwrap(),
            0,
            "taken back",
        );
    }

    // Several limits: the cost under each, in one statement.
    let small = Limit::new("small", 4, window).unwrap();
    let erin = Key::opaque("erin");
    let pairs = [(&quota, &erin), (&small, &erin)];
    let seen = |verdicts: &[Verdict]| verdicts.iter().map(Verdict::count).collect::<Vec<_>>();
    let both = merged.hit_all(&pairs).cost(cost(3)).await.unwrap();
    assert_eq!(seen(&both.into_vec()), [Some(3), Some(3)]);
    let both = alone.hit_all(&pairs).cost(cost(2)).await.unwrap();
    assert!(both.is_refused(), "5 passes small's 4");
    assert_eq!(seen(&both.into_vec()), [Some(5), Some(5)]);
    // Above small's max: nothing counted under either.
    let over = merged.hit_all(&pairs).cost(cost(5)).await.unwrap();
    assert!(over.refused_by().is_some_and(Verdict::exceeds_max));
    assert_eq!(seen(&over.into_vec()), [None, None]);
    let counted = counts(&db).await;
    assert_eq!(counted.get(&stored(&quota, &erin)), Some(&5));
    assert_eq!(counted.get(&stored(&small, &erin)), Some(&5));
    // And reserved under each, then taken back under each.
    let frank = Key::opaque("frank");
    let pairs = [(&quota, &frank), (&small, &frank)];
    match alone.reserve_all(&pairs).cost(cost(4)).await.unwrap() {
        Reservations::Granted(permits) => permits.succeeded().await.unwrap(),
        Reservations::Refused(verdicts) => panic!("refused: {verdicts:?}"),
    }
    let back = merged.check_all(&pairs).await.unwrap();
    assert_eq!(seen(&back.into_vec()), [Some(0), Some(0)]);

    assert_idle_and_switch_off::<D>(&held, "after the costs").await;
}

/// Tiers (`Limit::with_max`): a free and a paid max of one limit count in
/// one row per key, through a merged flight and a statement of its own
/// alike, and in the several-limits forms; a refusal the refusal cache
/// holds under the free max never refuses an ask under the paid one.
pub async fn tiers_of_one_limit_share_one_count_on_either_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    let held = hold::<D>(&db.config()).await;
    let window = Duration::from_secs(60);
    let clock = ManualClock::new(UNIX_EPOCH + window * 30_000_000 + Duration::from_secs(10));
    // The refusal cache on, as by default.
    let merged = Limiter::new(Postgres::new(lend::<D>(&held)).with_clock(clock.clone()));
    let alone = Limiter::builder(Postgres::new(lend::<D>(&held)).with_clock(clock.clone()))
        .no_merging()
        .build()
        .expect("valid settings");
    let free = Limit::new("api", 4, window).unwrap();
    let paid = free.with_max(100).unwrap();
    let alice = Key::opaque("alice");

    for n in 1..=4 {
        let limiter = if n % 2 == 0 { &merged } else { &alone };
        assert!(limiter.hit(&free, &alice).await.unwrap().is_allowed());
    }
    for n in 5..=7 {
        let refused = merged.hit(&free, &alice).await.unwrap();
        assert_counted(&refused, n, "refused on the free tier, and counted");
    }
    // Flooded: answered from the cache, nothing counted.
    assert!(merged.hit(&free, &alice).await.unwrap().is_refused());
    let upgraded = merged.hit(&paid, &alice).cost(cost(3)).await.unwrap();
    assert!(upgraded.is_allowed(), "{upgraded:?}");
    assert_counted(&upgraded, 10, "the free tier's 7, and 3");
    assert_eq!(upgraded.remaining(), Some(90));
    let alone_paid = alone.hit(&paid, &alice).await.unwrap();
    assert_counted(&alone_paid, 11, "a statement of its own, the same row");
    assert_eq!(counts(&db).await.get(&stored(&free, &alice)), Some(&11));
    assert_eq!(stored(&free, &alice), stored(&paid, &alice));

    // Several limits: a tier among them counts in its limit's row.
    let daily = Limit::new("api-day", 1_000, Duration::from_secs(86_400)).unwrap();
    let both = merged.hit_all(&[(&paid, &alice), (&daily, &alice)]).await;
    let both = both.unwrap();
    assert!(both.is_allowed());
    let seen: Vec<_> = both.iter().map(|v| (v.count(), v.remaining())).collect();
    assert_eq!(seen, [(Some(12), Some(88)), (Some(1), Some(999))]);
    let back = alone.check_all(&[(&free, &alice), (&daily, &alice)]).await;
    assert!(back.unwrap().is_refused(), "12 is past the free tier's 4");

    assert_idle_and_switch_off::<D>(&held, "after the tiers").await;
}

/// All or nothing (`hit_all_or_nothing`): the cost is counted under every
/// limit when every limit allows it, under none when one refuses, through
/// a merging limiter and one that does not merge alike; the refusal tells
/// the count before the ask and when an ask of its cost fits again; a
/// sliding window's weight and a lockout of an earlier window refuse as
/// they refuse a `hit`; a refused call leaves no row; a pair given twice is
/// an error.
pub async fn all_or_nothing_counts_under_every_limit_or_none_on_either_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    let held = hold::<D>(&db.config()).await;
    let minute = Duration::from_secs(60);
    // Ten seconds into a minute, and into a second.
    let start = UNIX_EPOCH + minute * 30_000_000 + Duration::from_secs(10);
    let clock = ManualClock::new(start);
    let merged = Limiter::builder(Postgres::new(lend::<D>(&held)).with_clock(clock.clone()))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    let alone = Limiter::builder(Postgres::new(lend::<D>(&held)).with_clock(clock.clone()))
        .no_refusal_cache()
        .no_merging()
        .build()
        .expect("valid settings");
    let per_second = Limit::new("api-second", 3, Duration::from_secs(1)).unwrap();
    let per_day = Limit::new("api-day", 10, Duration::from_secs(86_400)).unwrap();
    let alice = Key::opaque("alice");
    let pairs = [(&per_second, &alice), (&per_day, &alice)];
    let seen = |verdicts: &[Verdict]| verdicts.iter().map(Verdict::count).collect::<Vec<_>>();

    let both = merged
        .hit_all_or_nothing(&pairs)
        .cost(cost(2))
        .await
        .unwrap();
    assert!(both.is_allowed(), "{both:?}");
    assert_eq!(seen(both.as_slice()), [Some(2), Some(2)]);
    for limiter in [&merged, &alone] {
        let refused = limiter
            .hit_all_or_nothing(&pairs)
            .cost(cost(2))
            .await
            .unwrap();
        assert!(refused.is_refused(), "2 + 2 passes the second's 3");
        let by = refused.refused_by().expect("a refusal");
        assert_eq!(by.limit(), "api-second");
        assert!(!by.is_unreachable() && !by.exceeds_max());
        // Nothing counted: each tells the count before the ask.
        assert_eq!(seen(refused.as_slice()), [Some(2), Some(2)]);
        assert!(refused.as_slice()[1].is_allowed(), "the day allows it");
        assert_eq!(by.retry_after(), Some(Duration::from_secs(1)));
    }
    let counted = counts(&db).await;
    assert_eq!(counted.get(&stored(&per_second, &alice)), Some(&2));
    assert_eq!(counted.get(&stored(&per_day, &alice)), Some(&2));
    // One more fits the second: counted under both.
    let fits = alone
        .hit_all_or_nothing(&pairs)
        .cost(cost(1))
        .await
        .unwrap();
    assert!(fits.is_allowed());
    assert_eq!(seen(fits.as_slice()), [Some(3), Some(3)]);
    // Refused beside a key never counted: no row is left of it.
    let frank = Key::opaque("frank");
    let beside = [(&per_second, &alice), (&per_day, &frank)];
    let refused = merged
        .hit_all_or_nothing(&beside)
        .cost(cost(1))
        .await
        .unwrap();
    assert_eq!(seen(refused.as_slice()), [Some(3), Some(0)]);
    assert!(!counts(&db).await.contains_key(&stored(&per_day, &frank)));
    // Two seconds later the day holds 9 of its 10: it refuses a cost of 3,
    // and the second spends nothing of its 3.
    for day in [6, 9] {
        clock.advance(Duration::from_secs(1));
        let both = merged
            .hit_all_or_nothing(&pairs)
            .cost(cost(3))
            .await
            .unwrap();
        assert_eq!(seen(both.as_slice()), [Some(3), Some(day)]);
    }
    clock.advance(Duration::from_secs(1));
    let over = alone
        .hit_all_or_nothing(&pairs)
        .cost(cost(3))
        .await
        .unwrap();
    assert_eq!(over.refused_by().map(Verdict::limit), Some("api-day"));
    assert_eq!(seen(over.as_slice()), [Some(0), Some(9)]);
    assert!(over.as_slice()[0].is_allowed());

    // A sliding window: 8 counted in the minute before weigh 4 at its
    // middle, so a cost of 6 fits a max of 10 (4 + 6 − 1 < 10), and then
    // not even 1 more (4 + 6 + 1 − 1 = 10).
    let sliding = Limit::builder("sliding", 10, minute)
        .strategy(Strategy::Sliding)
        .build()
        .unwrap();
    let roomy = Limit::new("roomy", 1_000, minute).unwrap();
    let bob = Key::opaque("bob");
    let slid = [(&sliding, &bob), (&roomy, &bob)];
    clock.set(UNIX_EPOCH + minute * 30_000_010);
    assert!(
        alone
            .hit(&sliding, &bob)
            .cost(cost(8))
            .await
            .unwrap()
            .is_allowed()
    );
    clock.set(UNIX_EPOCH + minute * 30_000_011 + Duration::from_secs(30));
    let six = merged
        .hit_all_or_nothing(&slid)
        .cost(cost(6))
        .await
        .unwrap();
    assert!(six.is_allowed(), "{six:?}");
    assert_eq!(seen(six.as_slice()), [Some(10), Some(6)]);
    let one = alone.hit_all_or_nothing(&slid).cost(cost(1)).await.unwrap();
    assert_eq!(one.refused_by().map(Verdict::limit), Some("sliding"));
    assert_eq!(seen(one.as_slice()), [Some(10), Some(6)], "nothing counted");
    // A microsecond later the 8 weigh less than 4: 1 fits again.
    clock.advance(Duration::from_micros(1));
    let later = merged
        .hit_all_or_nothing(&slid)
        .cost(cost(1))
        .await
        .unwrap();
    assert!(later.is_allowed(), "{later:?}");

    // A lockout of an earlier window refuses, and spends nothing of the
    // other limit.
    let locking = Limit::builder("locking", 2, minute)
        .lockout(Duration::from_secs(120))
        .build()
        .unwrap();
    let carol = Key::opaque("carol");
    let locked = [(&locking, &carol), (&roomy, &carol)];
    clock.set(UNIX_EPOCH + minute * 30_000_020);
    let full = alone
        .hit_all_or_nothing(&locked)
        .cost(cost(2))
        .await
        .unwrap();
    assert!(full.is_allowed());
    clock.advance(minute);
    let refused = merged
        .hit_all_or_nothing(&locked)
        .cost(cost(1))
        .await
        .unwrap();
    let by = refused.refused_by().expect("locked out");
    assert_eq!(by.limit(), "locking");
    assert_eq!(by.reopens_at(), Some(UNIX_EPOCH + minute * 30_000_023));
    // (The next minute: roomy's count starts again, and stays at 0.)
    assert_eq!(seen(refused.as_slice()), [Some(0), Some(0)]);
    let roomy_now = alone.check(&roomy, &carol).await.unwrap();
    assert_eq!(roomy_now.count(), Some(0), "nothing spent");

    // A pair given twice: an error, nothing counted.
    let dave = Key::opaque("dave");
    for limiter in [&merged, &alone] {
        let twice = limiter
            .hit_all_or_nothing(&[(&roomy, &dave), (&roomy, &dave)])
            .cost(cost(1))
            .await
            .unwrap_err();
        assert_eq!(twice.kind(), ErrorKind::InvalidOption, "{twice}");
    }
    assert!(!counts(&db).await.contains_key(&stored(&roomy, &dave)));

    assert_idle_and_switch_off::<D>(&held, "after all or nothing").await;
}
