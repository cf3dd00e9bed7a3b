//! Every nonsensical configuration is refused with a clear, typed error when
//! it is made, never at call time. The list is the documentation: a new
//! option adds its refusals here.

use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use platformkit_limit::{ErrorKind, Key, Limit, Limiter, Memory, PurgeTask};

fn login() -> Limit {
    Limit::new("login", 5, Duration::from_secs(60)).expect("a valid limit")
}

/// `login` with a lockout of `lockout`.
fn locked_out_for(lockout: Duration) -> Result<Limit, platformkit_limit::Error> {
    Limit::builder("login", 5, Duration::from_secs(60))
        .lockout(lockout)
        .build()
}

/// Each refusal names its problem: the message says what was refused
/// ("invalid limit") and why (the last part of each row).
#[test]
fn every_nonsensical_limit_is_refused_when_it_is_made() {
    let secs = Duration::from_secs;
    let long_name = "x".repeat(Limit::MAX_NAME_BYTES + 1);
    let mut refused: Vec<(&str, Result<Limit, platformkit_limit::Error>, &str)> = vec![
        (
            "an empty name",
            Limit::new("", 5, secs(60)),
            "the name is empty",
        ),
        (
            "a name too long",
            Limit::new(&long_name, 5, secs(60)),
            "longer than 48 bytes",
        ),
        ("max 0", Limit::new("login", 0, secs(60)), "at least 1"),
        (
            "max above the most",
            Limit::new("login", Limit::MAX_ATTEMPTS + 1, secs(60)),
            "max must be at most",
        ),
        (
            "max u32::MAX",
            Limit::new("login", u32::MAX, secs(60)),
            "max must be at most",
        ),
        (
            "a zero window",
            Limit::new("login", 5, Duration::ZERO),
            "the window must be at least 1 s",
        ),
        (
            "a window under a second",
            Limit::new("login", 5, Duration::from_millis(999)),
            "the window must be at least 1 s",
        ),
        (
            "a fractional window",
            Limit::new("login", 5, Duration::from_millis(1500)),
            "whole number of seconds",
        ),
        (
            "a window a nanosecond past a whole second",
            Limit::new("login", 5, Duration::new(60, 1)),
            "whole number of seconds",
        ),
        (
            "a window over 366 days",
            Limit::new("login", 5, Limit::MAX_WINDOW + secs(1)),
            "at most 366 days",
        ),
        (
            "the longest duration as a window",
            Limit::new("login", 5, Duration::MAX),
            "at most 366 days",
        ),
        (
            "a zero lockout",
            locked_out_for(Duration::ZERO),
            "lockout must be at least one second",
        ),
        (
            "a lockout over a day",
            locked_out_for(Limit::MAX_LOCKOUT + secs(1)),
            "lockout must be at most 24 hours",
        ),
        (
            "a fractional lockout",
            locked_out_for(Duration::from_millis(2500)),
            "lockout must be a whole number of seconds",
        ),
    ];
    for name in [
        "log in",
        "login|x",
        "connexión",
        "login\0",
        "login/x",
        "émoji😀",
        "tab\t",
    ] {
        refused.push((name, Limit::new(name, 5, secs(60)), "ASCII letters, digits"));
    }
    for (what, result, says) in refused {
        let error = result.expect_err(what);
        assert_eq!(error.kind(), ErrorKind::InvalidLimit, "{what:?}: {error}");
        assert!(!error.is_unreachable(), "{what:?}");
        let message = error.to_string();
        assert!(
            message.starts_with("invalid limit") && message.contains(says),
            "{what:?}: {message:?} should say {says:?}"
        );
    }
}

#[test]
fn every_nonsensical_option_is_refused_when_it_is_set() {
    let limiter = || Limiter::builder(Memory::new());
    let refused: Vec<(&str, platformkit_limit::Error)> = [
        ("a zero budget", limiter().budget(Duration::ZERO)),
        (
            "a budget over a minute",
            limiter().budget(Limiter::MAX_BUDGET + Duration::from_millis(1)),
        ),
        ("a refusal cache of no keys", limiter().refusal_cache(0)),
        (
            "a refusal cache of more than ten million keys",
            limiter().refusal_cache(Limiter::MAX_REFUSAL_CACHE_KEYS + 1),
        ),
        (
            "a refusal TTL of zero",
            limiter().refusal_ttl(Duration::ZERO),
        ),
        (
            "a refusal TTL under a millisecond",
            limiter().refusal_ttl(Duration::from_micros(999)),
        ),
        (
            "a refusal TTL over a minute",
            limiter().refusal_ttl(Limiter::MAX_REFUSAL_TTL + Duration::from_millis(1)),
        ),
        ("no writes in flight", limiter().writes_in_flight(0)),
        (
            "more writes in flight than the bound",
            limiter().writes_in_flight(Limiter::MAX_WRITES_IN_FLIGHT + 1),
        ),
        (
            "usize::MAX writes in flight",
            limiter().writes_in_flight(usize::MAX),
        ),
        ("a local count of no keys", limiter().local_keys(0)),
        (
            "a local count of more than ten million keys",
            limiter().local_keys(Limiter::MAX_LOCAL_KEYS + 1),
        ),
    ]
    .into_iter()
    .map(|(what, builder)| (what, builder.build().expect_err(what)))
    .collect();
    for (what, error) in refused {
        assert_eq!(error.kind(), ErrorKind::InvalidOption, "{what}: {error}");
    }
    for budget in [
        Duration::from_micros(999),
        Duration::from_secs(61),
        Duration::MAX,
    ] {
        let error = limiter().budget(budget).build().expect_err("a budget");
        assert_eq!(error.kind(), ErrorKind::InvalidOption, "{budget:?}");
        assert!(error.to_string().contains("budget"), "{budget:?}: {error}");
    }
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    for prefix in [0, 129] {
        let error = Key::ip_grouped(v6, prefix).expect_err("refused");
        assert_eq!(error.kind(), ErrorKind::InvalidKey);
    }
    let no_parts: [&str; 0] = [];
    assert_eq!(
        Key::new(no_parts).expect_err("refused").kind(),
        ErrorKind::InvalidKey
    );
}

#[tokio::test]
async fn nonsensical_calls_and_schedules_are_refused_before_anything_runs() {
    let limiter = Limiter::new(Memory::new());
    let limit = login();
    let key = Key::opaque("k");
    let error = limiter.check_all(&[]).await.expect_err("no pairs");
    assert_eq!(error.kind(), ErrorKind::InvalidOption);
    let many = vec![(&limit, &key); Limiter::MAX_PAIRS + 1];
    let error = limiter.hit_all(&many).await.expect_err("too many pairs");
    assert_eq!(error.kind(), ErrorKind::InvalidOption);

    let config: tokio_postgres::Config = "host=127.0.0.1 port=1".parse().expect("a config");
    let error = PurgeTask::every(config, Duration::from_secs(59)).expect_err("too often");
    assert_eq!(error.kind(), ErrorKind::InvalidOption);
}

/// A refusal at an upper bound says the bound, as its constant holds it.
#[test]
fn a_refused_bound_is_named_as_its_constant_holds_it() {
    let limiter = || Limiter::builder(Memory::new());
    let ms = Duration::from_millis(1);
    let over = [
        (
            limiter().budget(Limiter::MAX_BUDGET + ms).build(),
            format!("at most {} s", Limiter::MAX_BUDGET.as_secs()),
        ),
        (
            limiter().refusal_ttl(Limiter::MAX_REFUSAL_TTL + ms).build(),
            format!("at most {} s", Limiter::MAX_REFUSAL_TTL.as_secs()),
        ),
        (
            limiter()
                .refusal_cache(Limiter::MAX_REFUSAL_CACHE_KEYS + 1)
                .build(),
            format!("at most {} keys", Limiter::MAX_REFUSAL_CACHE_KEYS),
        ),
        (
            limiter().local_keys(Limiter::MAX_LOCAL_KEYS + 1).build(),
            format!("and {} keys", Limiter::MAX_LOCAL_KEYS),
        ),
    ];
    for (result, says) in over {
        let message = result.expect_err(&says).to_string();
        assert!(message.contains(&says), "{message:?} should say {says:?}");
    }
    let config: tokio_postgres::Config = "host=127.0.0.1 port=1".parse().expect("a config");
    let often = PurgeTask::MIN_INTERVAL - Duration::from_secs(1);
    let message = PurgeTask::every(config, often)
        .expect_err("too often")
        .to_string();
    let says = format!("once every {} s", PurgeTask::MIN_INTERVAL.as_secs());
    assert!(message.contains(&says), "{message:?} should say {says:?}");
}

/// Accepted as given: a limit keeps its name, max and window, a limiter
/// its budget.
#[test]
fn the_boundaries_themselves_are_accepted() {
    let minute = Duration::from_secs(60);
    let longest = "A-z_0.9".repeat(7)[..Limit::MAX_NAME_BYTES].to_owned();
    for (name, max, window) in [
        ("a", 5, minute),
        (longest.as_str(), 5, minute),
        ("Login-2.v_x", 5, minute),
        ("login", 1, Duration::from_secs(1)),
        ("login", Limit::MAX_ATTEMPTS, Limit::MAX_WINDOW),
    ] {
        let limit = Limit::new(name, max, window)
            .unwrap_or_else(|e| panic!("{name:?}/{max}/{window:?} refused: {e}"));
        assert_eq!(
            (limit.name(), limit.max(), limit.window()),
            (name, max, window)
        );
    }
    assert!(locked_out_for(Duration::from_secs(1)).is_ok());
    assert!(locked_out_for(Limit::MAX_LOCKOUT).is_ok());
    for budget in [
        Duration::from_millis(1),
        Limiter::DEFAULT_BUDGET,
        Limiter::MAX_BUDGET,
    ] {
        let limiter = Limiter::builder(Memory::new())
            .budget(budget)
            .build()
            .unwrap_or_else(|e| panic!("{budget:?} refused: {e}"));
        assert_eq!(limiter.budget(), budget);
    }
    assert!(
        Limiter::builder(Memory::new())
            .refusal_cache(1)
            .build()
            .is_ok()
    );
    for places in [1, Limiter::MAX_WRITES_IN_FLIGHT] {
        let limiter = Limiter::builder(Memory::new())
            .writes_in_flight(places)
            .build()
            .expect("writes in flight at the boundary");
        assert_eq!(limiter.writes_in_flight(), Some(places));
    }
    for keys in [1, Limiter::MAX_LOCAL_KEYS] {
        let limiter = Limiter::builder(Memory::new())
            .local_keys(keys)
            .build()
            .expect("a local count at the boundary");
        assert_eq!(limiter.local_keys(), keys);
    }
    assert_eq!(
        Limiter::new(Memory::new()).local_keys(),
        Limiter::DEFAULT_LOCAL_KEYS
    );
    for ttl in [Duration::from_millis(1), Limiter::MAX_REFUSAL_TTL] {
        let limiter = Limiter::builder(Memory::new())
            .refusal_ttl(ttl)
            .build()
            .expect("a TTL at the boundary");
        assert_eq!(limiter.refusal_ttl(), ttl);
        // Kept whatever the cache's size, and when it is off.
        let limiter = Limiter::builder(Memory::new())
            .refusal_ttl(ttl)
            .refusal_cache(5)
            .build()
            .expect("a cache");
        assert_eq!(
            (limiter.refusal_ttl(), limiter.refusal_cache()),
            (ttl, Some(5))
        );
        let limiter = Limiter::builder(Memory::new())
            .refusal_ttl(ttl)
            .no_refusal_cache()
            .build()
            .expect("no cache");
        assert_eq!(
            (limiter.refusal_ttl(), limiter.refusal_cache()),
            (ttl, None)
        );
    }
}
