//! Every nonsensical configuration is refused with a clear, typed error when
//! it is made, never at call time. The list is the documentation: a new
//! option adds its refusals here.

use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use platformkit_limit::{
    ErrorKind, Key, Limit, Limiter, MAX_ATTEMPTS, MAX_BUDGET, MAX_LOCKOUT, MAX_NAME_BYTES,
    MAX_PAIRS, MAX_REFUSAL_TTL, MAX_WINDOW, Memory, PurgeTask,
};

fn login() -> Limit {
    Limit::new("login", 5, Duration::from_secs(60)).expect("a valid limit")
}

#[test]
fn every_nonsensical_limit_is_refused_when_it_is_made() {
    let secs = Duration::from_secs;
    let long_name = "x".repeat(MAX_NAME_BYTES + 1);
    let refused: Vec<(&str, Result<Limit, platformkit_limit::Error>)> = vec![
        ("an empty name", Limit::new("", 5, secs(60))),
        ("a name too long", Limit::new(&long_name, 5, secs(60))),
        ("a name with a space", Limit::new("log in", 5, secs(60))),
        (
            "a name with the separator",
            Limit::new("login|x", 5, secs(60)),
        ),
        (
            "a name that is not ASCII",
            Limit::new("connexión", 5, secs(60)),
        ),
        ("max 0", Limit::new("login", 0, secs(60))),
        (
            "max above the most",
            Limit::new("login", MAX_ATTEMPTS + 1, secs(60)),
        ),
        ("a zero window", Limit::new("login", 5, Duration::ZERO)),
        (
            "a window under a second",
            Limit::new("login", 5, Duration::from_millis(999)),
        ),
        (
            "a fractional window",
            Limit::new("login", 5, Duration::from_millis(1500)),
        ),
        (
            "a window over 366 days",
            Limit::new("login", 5, MAX_WINDOW + secs(1)),
        ),
        ("a zero lockout", login().lockout(Duration::ZERO)),
        (
            "a lockout over a day",
            login().lockout(MAX_LOCKOUT + secs(1)),
        ),
        (
            "a fractional lockout",
            login().lockout(Duration::from_millis(2500)),
        ),
    ];
    for (what, result) in refused {
        let error = result.expect_err(what);
        assert_eq!(error.kind(), ErrorKind::InvalidLimit, "{what}: {error}");
        assert!(
            error.to_string().starts_with("invalid limit"),
            "{what}: the message says what: {error}"
        );
    }
}

#[test]
fn every_nonsensical_option_is_refused_when_it_is_set() {
    let limiter = || Limiter::new(Memory::new());
    let refused: Vec<(&str, platformkit_limit::Error)> = vec![
        (
            "a zero budget",
            limiter().with_budget(Duration::ZERO).expect_err("refused"),
        ),
        (
            "a budget over a minute",
            limiter()
                .with_budget(MAX_BUDGET + Duration::from_millis(1))
                .expect_err("refused"),
        ),
        (
            "a refusal cache of no keys",
            limiter().with_refusal_cache(0).expect_err("refused"),
        ),
        (
            "a refusal cache of more than ten million keys",
            limiter()
                .with_refusal_cache(10_000_001)
                .expect_err("refused"),
        ),
        (
            "a refusal TTL of zero",
            limiter()
                .with_refusal_ttl(Duration::ZERO)
                .expect_err("refused"),
        ),
        (
            "a refusal TTL under a millisecond",
            limiter()
                .with_refusal_ttl(Duration::from_micros(999))
                .expect_err("refused"),
        ),
        (
            "a refusal TTL over a minute",
            limiter()
                .with_refusal_ttl(MAX_REFUSAL_TTL + Duration::from_millis(1))
                .expect_err("refused"),
        ),
    ];
    for (what, error) in refused {
        assert_eq!(error.kind(), ErrorKind::InvalidOption, "{what}: {error}");
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
    let many = vec![(&limit, &key); MAX_PAIRS + 1];
    let error = limiter.hit_all(&many).await.expect_err("too many pairs");
    assert_eq!(error.kind(), ErrorKind::InvalidOption);

    let config: tokio_postgres::Config = "host=127.0.0.1 port=1".parse().expect("a config");
    let error = PurgeTask::every(config, Duration::from_secs(59)).expect_err("too often");
    assert_eq!(error.kind(), ErrorKind::InvalidOption);
}

#[test]
fn the_boundaries_themselves_are_accepted() {
    let name = "x".repeat(MAX_NAME_BYTES);
    assert!(Limit::new(&name, 1, Duration::from_secs(1)).is_ok());
    assert!(Limit::new("a", MAX_ATTEMPTS, MAX_WINDOW).is_ok());
    assert!(login().lockout(Duration::from_secs(1)).is_ok());
    assert!(login().lockout(MAX_LOCKOUT).is_ok());
    assert!(
        Limiter::new(Memory::new())
            .with_budget(Duration::from_millis(1))
            .is_ok()
    );
    assert!(Limiter::new(Memory::new()).with_budget(MAX_BUDGET).is_ok());
    assert!(Limiter::new(Memory::new()).with_refusal_cache(1).is_ok());
    for ttl in [Duration::from_millis(1), MAX_REFUSAL_TTL] {
        let limiter = Limiter::new(Memory::new())
            .with_refusal_ttl(ttl)
            .expect("a TTL at the boundary");
        assert_eq!(limiter.refusal_ttl(), ttl);
        // Kept when the cache is sized or turned off and on again.
        let limiter = limiter
            .without_refusal_cache()
            .with_refusal_cache(5)
            .expect("a cache");
        assert_eq!(limiter.refusal_ttl(), ttl);
    }
}
