//! The watch of a custom resource whose CRD another project installs (csi-addons): where the CRD
//! is missing, the watch is tried again with a delay doubling up to a minute, with one warning
//! every ten minutes at most.

use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

/// Watches `api` until the watch ends, calling `on_apply` with every object seen and whether it
/// was seen by a (re)list (`true`) or changed (`false`); `kind` names it in the warning.
pub(crate) async fn watch<K>(api: Api<K>, kind: &str, mut on_apply: impl FnMut(K, bool))
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    let mut last_warning: Option<tokio::time::Instant> = None;
    // a cluster without the CRD answers every list with 404: ask again at most once a minute
    let mut delay = Duration::from_secs(1);
    loop {
        match stream.next().await {
            Some(Ok(event)) => {
                delay = Duration::from_secs(1);
                match event {
                    watcher::Event::Apply(object) => on_apply(object, false),
                    watcher::Event::InitApply(object) => on_apply(object, true),
                    _ => {}
                }
            }
            Some(Err(e)) => {
                if last_warning.is_none_or(|t| t.elapsed() > Duration::from_mins(10)) {
                    tracing::warn!(error = %e, kind, "watch failed (is the csi-addons CRD installed?); retrying");
                    last_warning = Some(tokio::time::Instant::now());
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_mins(1));
            }
            None => break,
        }
    }
}
