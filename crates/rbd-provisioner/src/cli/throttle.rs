//! Client-side request throttling (a token bucket): `--kube-api-qps`, `--kube-api-burst`.
//!
//! Off by default: the API server has its own priority and fairness. It exists so that
//! operators who must be gentle with a shared API server can be, and so that the benchmark can
//! reproduce client-go's 5 qps / burst 10 defaults.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// Layer adding a token bucket in front of a service.
#[derive(Clone, Copy, Debug)]
pub struct ThrottleLayer {
    qps: f64,
    burst: f64,
}

impl ThrottleLayer {
    /// `qps` requests per second sustained, `burst` at once (at least 1).
    pub fn new(qps: f64, burst: u32) -> ThrottleLayer {
        ThrottleLayer {
            qps,
            burst: f64::from(burst.max(1)),
        }
    }
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;
    fn layer(&self, inner: S) -> Throttle<S> {
        Throttle {
            inner,
            qps: self.qps,
            burst: self.burst,
            tokens: self.burst,
            refilled: Instant::now(),
            reserved: false,
            sleep: None,
        }
    }
}

/// The throttled service. `poll_ready` waits for a token; `call` spends it.
pub struct Throttle<S> {
    inner: S,
    qps: f64,
    burst: f64,
    tokens: f64,
    refilled: Instant,
    reserved: bool,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S> Throttle<S> {
    fn refill(&mut self, now: Instant) {
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.refilled = now;
    }
}

impl<S, R> Service<R> for Throttle<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.reserved {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            self.refill(Instant::now());
            if self.tokens >= 1.0 {
                self.tokens -= 1.0;
                self.reserved = true;
            } else {
                let wait = Duration::from_secs_f64((1.0 - self.tokens) / self.qps);
                self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.reserved = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[tokio::test(start_paused = true)]
    async fn allows_a_burst_then_the_sustained_rate() {
        let svc =
            tower::service_fn(|()| async { Ok::<_, std::convert::Infallible>(Instant::now()) });
        let mut svc = ThrottleLayer::new(5.0, 10).layer(svc);
        let start = Instant::now();
        let mut times = Vec::new();
        for _ in 0..20 {
            times.push(svc.ready().await.unwrap().call(()).await.unwrap() - start);
        }
        // the first 10 at once, then one every 200 ms
        assert!(times[9] < Duration::from_millis(1), "{times:?}");
        let tail = times[19] - times[10];
        assert!(
            tail >= Duration::from_millis(1790) && tail <= Duration::from_millis(1810),
            "{tail:?}"
        );
    }
}
