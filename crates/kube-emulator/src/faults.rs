//! Fault injection: failing or delaying the next matching requests, ending watch streams.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::store::Store;

#[derive(Debug, Clone)]
enum Effect {
    Fail(u16),
    Delay(Duration),
}

#[derive(Debug, Clone)]
struct Rule {
    verb: String,
    resource: String,
    remaining: usize,
    effect: Effect,
}

impl Rule {
    fn matches(&self, verb: &str, resource: &str) -> bool {
        (self.verb == "*" || self.verb == verb)
            && (self.resource == "*" || self.resource == resource)
    }
}

/// Fault injection for tests. Verbs: `get|list|watch|create|update|patch|delete|deletecollection|*`;
/// resources are plurals (`persistentvolumes`), subresources as `persistentvolumeclaims/status`,
/// or `*`.
pub struct Faults {
    rules: Mutex<Vec<Rule>>,
    store: Arc<Store>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults").finish_non_exhaustive()
    }
}

/// What to do with one request.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub delay: Option<Duration>,
    pub fail: Option<u16>,
}

impl Faults {
    pub(crate) fn new(store: Arc<Store>) -> Faults {
        Faults {
            rules: Mutex::new(Vec::new()),
            store,
        }
    }

    fn rules(&self) -> std::sync::MutexGuard<'_, Vec<Rule>> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next `count` requests matching `verb` and `resource` answer a Status with `code`
    /// (500 InternalError, 409 Conflict, 429 TooManyRequests with Retry-After, 503, ...).
    pub fn fail_next(&self, verb: &str, resource: &str, count: usize, code: u16) {
        self.rules().push(Rule {
            verb: verb.to_string(),
            resource: resource.to_string(),
            remaining: count,
            effect: Effect::Fail(code),
        });
    }

    /// The next `count` matching requests are answered after `delay`.
    pub fn delay_next(&self, verb: &str, resource: &str, count: usize, delay: Duration) {
        self.rules().push(Rule {
            verb: verb.to_string(),
            resource: resource.to_string(),
            remaining: count,
            effect: Effect::Delay(delay),
        });
    }

    /// Ends the open watch streams of `resource` (`*` = all); returns how many were ended.
    pub fn drop_watches(&self, resource: &str) -> usize {
        self.store.drop_watches(resource)
    }

    /// Removes every pending fault.
    pub fn clear(&self) {
        self.rules().clear();
    }

    /// Consumes the matching rules for one request.
    pub(crate) fn take(&self, verb: &str, resource: &str) -> Verdict {
        let mut verdict = Verdict::default();
        let mut rules = self.rules();
        for rule in rules
            .iter_mut()
            .filter(|r| r.remaining > 0 && r.matches(verb, resource))
        {
            match rule.effect {
                Effect::Delay(d) if verdict.delay.is_none() => {
                    verdict.delay = Some(d);
                    rule.remaining -= 1;
                }
                Effect::Fail(c) if verdict.fail.is_none() => {
                    verdict.fail = Some(c);
                    rule.remaining -= 1;
                }
                _ => {}
            }
        }
        rules.retain(|r| r.remaining > 0);
        verdict
    }
}
