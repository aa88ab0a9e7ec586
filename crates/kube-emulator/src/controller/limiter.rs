//! The client-side rate limit of kube-controller-manager's API clients: client-go's
//! `flowcontrol.NewTokenBucketRateLimiter(qps, burst)`, i.e. `golang.org/x/time/rate`'s limiter.
//! The bucket starts full (`burst` tokens), refills continuously at `qps` tokens per second up to
//! `burst`, and every request takes one token; a request that finds none reserves the next one
//! (the count goes negative) and waits until it has been refilled, so waiting requests are served
//! in order at exactly `qps`.
//!
//! kube-controller-manager's defaults are `--kube-api-qps=20 --kube-api-burst=30`, and every
//! controller gets its own client and so its own bucket (the PV binder's events go through the
//! binder's client).

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// kube-controller-manager's default `--kube-api-qps`.
pub const KCM_CLIENT_QPS: f64 = 20.0;
/// kube-controller-manager's default `--kube-api-burst`.
pub const KCM_CLIENT_BURST: u32 = 30;

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// One client's token bucket.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<Bucket>,
}

impl TokenBucket {
    /// A full bucket. `qps` must be positive; a burst of 0 is taken as 1 (one request at a time).
    pub fn new(qps: f64, burst: u32) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps: if qps > 0.0 { qps } else { f64::MIN_POSITIVE },
            burst,
            state: Mutex::new(Bucket {
                tokens: burst,
                last: Instant::now(),
            }),
        }
    }

    /// Takes one token at `now` and says when the request may go (`now` if a token was there).
    fn reserve_at(&self, now: Instant) -> Instant {
        let mut b = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // x/time/rate's advance(): refill for the time since the last reservation, capped.
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.qps).min(self.burst);
        if now > b.last {
            b.last = now;
        }
        b.tokens -= 1.0;
        if b.tokens >= 0.0 {
            now
        } else {
            now + Duration::from_secs_f64(-b.tokens / self.qps)
        }
    }

    /// Waits for a token (client-go's `rateLimiter.Wait` before each request).
    pub async fn wait(&self) {
        let at = self.reserve_at(Instant::now());
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_full_bucket_lets_the_burst_through_then_paces_at_qps() {
        let bucket = TokenBucket::new(20.0, 30);
        let t0 = Instant::now();
        for _ in 0..30 {
            assert_eq!(bucket.reserve_at(t0), t0);
        }
        // the 31st waits one refill (50 ms), the 40th ten
        assert_eq!(bucket.reserve_at(t0), t0 + ms(50));
        for _ in 32..40 {
            bucket.reserve_at(t0);
        }
        assert_eq!(bucket.reserve_at(t0), t0 + ms(500));
    }

    #[test]
    fn refills_over_time_up_to_the_burst_only() {
        let bucket = TokenBucket::new(10.0, 5);
        let t0 = Instant::now();
        for _ in 0..5 {
            bucket.reserve_at(t0);
        }
        // 300 ms later three tokens are back
        let t1 = t0 + ms(300);
        for _ in 0..3 {
            assert_eq!(bucket.reserve_at(t1), t1);
        }
        assert_eq!(bucket.reserve_at(t1), t1 + ms(100));
        // after a long pause the bucket holds 5, not more
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..5 {
            assert_eq!(bucket.reserve_at(t2), t2);
        }
        assert!(bucket.reserve_at(t2) > t2);
    }

    #[test]
    fn n_requests_take_n_minus_burst_over_qps() {
        // what the default control plane means for provisioning: 5 writes per claim
        let bucket = TokenBucket::new(KCM_CLIENT_QPS, KCM_CLIENT_BURST);
        let t0 = Instant::now();
        let mut last = t0;
        for _ in 0..500 {
            last = bucket.reserve_at(t0);
        }
        // 100 claims x 5 writes: (500 - 30) / 20 = 23.5 s
        let took = last.duration_since(t0).as_secs_f64();
        assert!((took - 23.5).abs() < 1e-6, "{took}");
    }
}
