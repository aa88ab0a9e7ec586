//! The emulator's own measurements (`GET /emulator/stats`): the provisioner's API requests by
//! verb and resource, and stalls. Read before and after each phase; the difference is the phase's.

use std::collections::BTreeMap;

use anyhow::Context;
use serde::Deserialize;

/// The `User-Agent` prefix of the provisioner's requests (its kube client sets it).
const PROVISIONER_AGENT: &str = "rbd-provisioner/";
/// Verbs that change something.
const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    user_agent: String,
    verb: String,
    resource: String,
    count: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stalls {
    pub max_answer_ms: f64,
    pub slow_answers: u64,
    pub max_runtime_lag_ms: f64,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ApiStats {
    requests: Vec<Row>,
    pub stalls: Stalls,
}

/// `"verb resource"` -> requests.
pub type Requests = BTreeMap<String, u64>;

impl ApiStats {
    pub async fn fetch(client: &kube::Client) -> anyhow::Result<ApiStats> {
        let request = http::Request::get("/emulator/stats")
            .body(Vec::new())
            .context("building the stats request")?;
        let text = client
            .request_text(request)
            .await
            .context("reading the emulator's /emulator/stats")?;
        serde_json::from_str(&text).context("parsing /emulator/stats")
    }

    fn provisioner(&self) -> Requests {
        let mut out = Requests::new();
        for row in self
            .requests
            .iter()
            .filter(|r| r.user_agent.starts_with(PROVISIONER_AGENT))
        {
            *out.entry(format!("{} {}", row.verb, row.resource))
                .or_default() += row.count;
        }
        out
    }

    /// The provisioner's requests between `before` and `self`.
    pub fn provisioner_since(&self, before: &ApiStats) -> Requests {
        let earlier = before.provisioner();
        self.provisioner()
            .into_iter()
            .filter_map(|(key, n)| {
                let delta = n.saturating_sub(earlier.get(&key).copied().unwrap_or(0));
                (delta > 0).then_some((key, delta))
            })
            .collect()
    }
}

/// The writes among `requests`.
pub fn writes(requests: &Requests) -> u64 {
    requests
        .iter()
        .filter(|(key, _)| {
            key.split_once(' ')
                .is_some_and(|(verb, _)| WRITE_VERBS.contains(&verb))
        })
        .map(|(_, n)| n)
        .sum()
}

/// `requests` divided by `claims`, rounded to hundredths.
pub fn per_claim(requests: &Requests, claims: usize) -> BTreeMap<String, f64> {
    requests
        .iter()
        .map(|(key, n)| {
            let each = *n as f64 / claims.max(1) as f64;
            (key.clone(), (each * 100.0).round() / 100.0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(rows: &[(&str, &str, &str, u64)]) -> ApiStats {
        ApiStats {
            requests: rows
                .iter()
                .map(|(a, v, r, c)| Row {
                    user_agent: (*a).into(),
                    verb: (*v).into(),
                    resource: (*r).into(),
                    count: *c,
                })
                .collect(),
            stalls: Stalls::default(),
        }
    }

    #[test]
    fn only_the_provisioners_requests_of_the_phase_count() {
        let before = stats(&[
            ("rbd-provisioner/0.1.0", "list", "persistentvolumes", 1),
            ("rbd-provisioner/0.1.0", "create", "events", 2),
        ]);
        let after = stats(&[
            ("rbd-provisioner/0.1.0", "list", "persistentvolumes", 1),
            ("rbd-provisioner/0.1.0", "create", "events", 12),
            ("rbd-provisioner/0.1.0", "create", "persistentvolumes", 5),
            ("kube-rs/3", "create", "persistentvolumeclaims", 5),
        ]);
        let phase = after.provisioner_since(&before);
        assert_eq!(
            phase.into_iter().collect::<Vec<_>>(),
            [
                ("create events".to_string(), 10),
                ("create persistentvolumes".to_string(), 5)
            ]
        );
        let phase = after.provisioner_since(&before);
        assert_eq!(writes(&phase), 15);
        assert_eq!(per_claim(&phase, 5)["create events"], 2.0);
    }
}
