//! Lists in pages of [`PAGE`] objects, as kube-controller-manager's informers list, so that a
//! pass over thousands of objects (a resync) never holds the whole list at once, nor makes the
//! API server build it in one answer. Each page is handed over and dropped before the next is
//! read.

use std::fmt::Debug;

use kube::Api;
use kube::api::{ListParams, ObjectList};
use kube::core::PartialObjectMeta;
use serde::de::DeserializeOwned;

/// Objects per request (client-go's informer page size).
pub const PAGE: u32 = 500;

/// Every item of the list `list` answers for `params`, page by page, to `each`.
async fn pages<T, Fut>(
    params: &ListParams,
    mut list: impl FnMut(ListParams) -> Fut,
    mut each: impl FnMut(T),
) -> kube::Result<()>
where
    T: Clone,
    Fut: Future<Output = kube::Result<ObjectList<T>>>,
{
    let first = params.clone().limit(PAGE);
    let mut next = Some(first.clone());
    while let Some(p) = next {
        let page = list(p).await?;
        next = page
            .metadata
            .continue_
            .clone()
            .filter(|c| !c.is_empty())
            .map(|c| first.clone().continue_token(&c));
        page.items.into_iter().for_each(&mut each);
    }
    Ok(())
}

/// Every object of `api` that `params` selects, page by page, to `each`.
///
/// # Errors
/// The API's (an expired continue token among them: the caller's next pass starts over).
pub async fn for_each<K>(api: &Api<K>, params: &ListParams, each: impl FnMut(K)) -> kube::Result<()>
where
    K: Clone + DeserializeOwned + Debug,
{
    pages(params, |p| async move { api.list(&p).await }, each).await
}

/// The metadata of every object of `api` that `params` selects (a metadata-only list: no spec
/// or status is sent or parsed), page by page, to `each`.
///
/// # Errors
/// As [`for_each`].
pub async fn for_each_metadata<K>(
    api: &Api<K>,
    params: &ListParams,
    each: impl FnMut(PartialObjectMeta<K>),
) -> kube::Result<()>
where
    K: Clone + DeserializeOwned + Debug,
{
    pages(params, |p| async move { api.list_metadata(&p).await }, each).await
}
