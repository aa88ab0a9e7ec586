//! Adding and removing one finalizer on any object without losing another writer's change.
//!
//! Each write is a merge patch of the whole `metadata.finalizers` list, preconditioned on the
//! resourceVersion just read: had anyone changed the object since (another controller's
//! finalizer, the object's status written a moment before), the write fails with 409 Conflict
//! instead of putting back the list as it was. A conflict is not a failure: the object is read
//! again and the edit made on what is there now, up to [`ATTEMPTS`] times, logged at debug.

use k8s_openapi::serde::de::DeserializeOwned;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

/// Writes of one edit before a conflict is given back to the caller.
const ATTEMPTS: u32 = 5;

/// Adds `finalizer` to object `name`; nothing when it is there.
///
/// # Errors
/// API errors other than a conflict within [`ATTEMPTS`], including the object not existing.
pub(crate) async fn add<K>(api: &Api<K>, name: &str, finalizer: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    // boxed: the get and patch futures are large, and would be inlined into every caller's
    Box::pin(edit(api, name, finalizer, true)).await
}

/// Removes `finalizer` from object `name`; nothing when it is not there or the object is gone.
///
/// # Errors
/// API errors other than a conflict within [`ATTEMPTS`] and not found.
pub(crate) async fn remove<K>(api: &Api<K>, name: &str, finalizer: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    Box::pin(edit(api, name, finalizer, false)).await
}

async fn edit<K>(api: &Api<K>, name: &str, finalizer: &str, wanted: bool) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut attempt = 1;
    loop {
        let object = if wanted {
            api.get(name).await?
        } else {
            match api.get_opt(name).await? {
                Some(object) => object,
                None => return Ok(()),
            }
        };
        let list = object.finalizers();
        if list.iter().any(|f| f == finalizer) == wanted {
            return Ok(());
        }
        let edited: Vec<&str> = list
            .iter()
            .map(String::as_str)
            .filter(|f| *f != finalizer)
            .chain(wanted.then_some(finalizer))
            .collect();
        let patch = json!({"metadata": {
            "finalizers": edited,
            "resourceVersion": object.meta().resource_version,
        }});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 && !wanted => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < ATTEMPTS => {
                tracing::debug!(
                    object = name,
                    finalizer,
                    attempt,
                    "changed since read; editing its finalizers again on a fresh read"
                );
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}
