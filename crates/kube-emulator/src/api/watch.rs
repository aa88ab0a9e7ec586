//! Watch streams: `?watch=1` and `/watch/` paths, resume from a resourceVersion, synthetic
//! ADDED events, streaming lists (`sendInitialEvents`), bookmarks, `timeoutSeconds`, and
//! errors delivered as HTTP 200 plus one ERROR line.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::read::{present, selectors};
use super::{Ctx, error_response, table};
use crate::resources::ResourceInfo;
use crate::selectors::FieldSelector;
use crate::status::{ApiError, Cause};
use crate::store::{Registration, Store, WatchFilter, WatchItem, WatchStart};

const BOOKMARK_EVERY: Duration = Duration::from_secs(1);

fn line(kind: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// A BOOKMARK object: the kind, the resourceVersion, and the type's zero-valued fields.
fn bookmark(res: &ResourceInfo, rv: u64, initial_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let mut obj = json!({"kind": res.kind, "apiVersion": res.api_version(), "metadata": meta});
    match res.kind {
        "PersistentVolumeClaim" => {
            obj["spec"] = json!({"resources": {}});
            obj["status"] = json!({});
        }
        _ if res.has_status => {
            obj["spec"] = json!({});
            obj["status"] = json!({});
        }
        _ => {}
    }
    obj
}

fn stream_response(rx: mpsc::Receiver<Result<Bytes, Infallible>>) -> Response {
    let mut resp = Response::new(Body::from_stream(ReceiverStream::new(rx)));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A finished watch: HTTP 200 with the given lines (possibly none).
fn finished(lines: Vec<Bytes>) -> Response {
    let (tx, rx) = mpsc::channel(lines.len().max(1));
    for l in lines {
        let _ = tx.try_send(Ok(l));
    }
    stream_response(rx)
}

struct Unregister {
    store: Arc<Store>,
    id: u64,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        self.store.unregister_watch(self.id);
    }
}

struct StreamPlan {
    res: &'static ResourceInfo,
    store: Arc<Store>,
    reg: Registration,
    initial_end: bool,
    bookmarks: bool,
    timeout: Option<Duration>,
    /// `Accept: ...;as=Table`: every event carries a one-row Table (`kubectl get -w`).
    table: Option<crate::util::Query>,
}

async fn run_stream(plan: StreamPlan, out: mpsc::Sender<Result<Bytes, Infallible>>) {
    let StreamPlan {
        res,
        store,
        reg,
        initial_end,
        bookmarks,
        timeout,
        table: table_query,
    } = plan;
    let _guard = Unregister {
        store: store.clone(),
        id: reg.id,
    };
    let mut rx = reg.rx;
    let mut last_rv = reg.rv;
    let send = |item: &WatchItem| {
        let shown = present(res, &item.object);
        match &table_query {
            Some(q) => {
                let rv = shown
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                line(item.kind.as_str(), &table::render(res, &[shown], rv, q))
            }
            None => line(item.kind.as_str(), &shown),
        }
    };
    let rv_of = |item: &WatchItem| {
        item.object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
    };
    for item in &reg.initial {
        if out.send(Ok(send(item))).await.is_err() {
            return;
        }
    }
    if initial_end
        && out
            .send(Ok(line("BOOKMARK", &bookmark(res, reg.rv, true))))
            .await
            .is_err()
    {
        return;
    }
    let deadline = timeout.map(|d| tokio::time::Instant::now() + d);
    let sleep = tokio::time::sleep_until(
        deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400 * 365)),
    );
    tokio::pin!(sleep);
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
    loop {
        tokio::select! {
            item = rx.recv() => match item {
                Some(item) => {
                    last_rv = last_rv.max(rv_of(&item));
                    if out.send(Ok(send(&item))).await.is_err() {
                        return;
                    }
                }
                None => return,
            },
            _ = tick.tick(), if bookmarks => {
                // While this watcher is registered, every event up to the current
                // resourceVersion is already queued: flush the queue first so the bookmark
                // never overtakes an event it covers. An ended watcher (queue overflow) gets no
                // bookmark: what is queued is all it will see, and its client must resume from
                // the last event it received, as from kube-apiserver's cacher.
                let current = store.rv_for_watcher(reg.id);
                while let Ok(item) = rx.try_recv() {
                    last_rv = last_rv.max(rv_of(&item));
                    if out.send(Ok(send(&item))).await.is_err() {
                        return;
                    }
                }
                let Some(rv) = current else { continue };
                let rv = rv.max(last_rv);
                if out.send(Ok(line("BOOKMARK", &bookmark(res, rv, false)))).await.is_err() {
                    return;
                }
            }
            _ = &mut sleep, if deadline.is_some() => return,
            _ = out.closed() => return,
        }
    }
}

pub(crate) async fn watch(ctx: Ctx) -> Result<Response, ApiError> {
    let t = &ctx.target;
    let q = &ctx.query;
    let send_initial = q.flag("sendInitialEvents");
    if send_initial && q.get("resourceVersionMatch") != Some("NotOlderThan") {
        return Err(ApiError::invalid_with(
            "ListOptions.meta.k8s.io",
            "",
            None,
            "ListOptions",
            vec![Cause::forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )],
        )
        .with_group("meta.k8s.io"));
    }
    let rv_param = q.get("resourceVersion").unwrap_or_default();
    let rv: Option<u64> = if rv_param.is_empty() {
        None
    } else {
        Some(rv_param.parse().map_err(|_| {
            ApiError::new(
                500,
                "InternalError",
                format!("resourceVersion: Invalid value: \"{rv_param}\": strconv.ParseUint: parsing \"{rv_param}\": invalid syntax"),
            )
        })?)
    };
    let (labels, mut fields) = selectors(&ctx)?;
    if let Some(name) = &t.name {
        let extra = FieldSelector::parse(&format!("metadata.name={name}"))?;
        fields = if fields.is_empty() {
            extra
        } else {
            FieldSelector::parse(&format!(
                "{},metadata.name={name}",
                q.get("fieldSelector").unwrap_or_default()
            ))?
        };
    }
    let filter = WatchFilter {
        namespace: t.namespace.clone(),
        labels,
        fields,
        view: t.res.view,
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs);
    let store = ctx.shared.store.clone();
    let start = match rv {
        None | Some(0) => WatchStart::Current,
        Some(_) if send_initial => WatchStart::Current,
        Some(n) => {
            if n > store.current_rv() {
                // A future resourceVersion blocks until the store catches up (or times out).
                match timeout {
                    Some(d) => {
                        if tokio::time::timeout(d, store.wait_for_rv(n)).await.is_err() {
                            return Ok(finished(Vec::new()));
                        }
                    }
                    None => store.wait_for_rv(n).await,
                }
            }
            WatchStart::After(n)
        }
    };
    let reg = match store.register_watch(t.res.storage, filter, start) {
        Ok(r) => r,
        Err(e) if e.code == 410 => return Ok(finished(vec![line("ERROR", &e.to_status())])),
        Err(e) => return Ok(error_response(&e)),
    };
    let (tx, rx) = mpsc::channel(64);
    let plan = StreamPlan {
        res: t.res,
        store,
        reg,
        initial_end: send_initial,
        bookmarks: q.flag("allowWatchBookmarks"),
        timeout,
        table: ctx.header("accept").contains("as=Table").then(|| q.clone()),
    };
    tokio::spawn(run_stream(plan, tx));
    Ok(stream_response(rx))
}
